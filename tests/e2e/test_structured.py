"""Structured output: every way clients ask for it (OpenAI response_format
json_schema and json_object, vLLM guided_json / guided_regex / guided_choice
/ guided_grammar, llama.cpp json_schema / grammar) constrains the tokens the
daemon samples, so the output is always a sentence of the grammar: each
schema of tests/e2e/schemas.json gives JSON that Python's jsonschema
accepts. Unsupported schema features and bad grammars are 400s naming them.
Constrained and unconstrained requests share batches; /metrics counts the
masks and the time they took, from which the per-token cost is printed."""
import json
import os
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

from conftest import metrics, parallel, request

HERE = os.path.dirname(__file__)
with open(os.path.join(HERE, "schemas.json")) as f:
    SCHEMAS = json.load(f)
# Under the ASan + UBSan daemon (run.sh's second pass) every fourth schema:
# the release pass runs them all, and the sanitizers look at the same code.
if "asan" in os.environ.get("DUALPATHD_BIN", ""):
    SCHEMAS = SCHEMAS[::4]


def chat(body):
    st, _, raw = request("POST", "/v1/chat/completions", body, timeout=600)
    return st, json.loads(raw)


def ask(schema, name, i=0):
    # No max_tokens: the grammar ends the answer (the length is the model's).
    st, d = chat({"messages": [{"role": "user", "content":
                                f"Give an example of a {name} as JSON."}],
                  "response_format": {"type": "json_schema",
                                      "json_schema": {"name": "x", "schema": schema,
                                                      "strict": True}},
                  "temperature": 0.7, "seed": 100 + i, "max_tokens": 1500})
    assert st == 200, d
    return d["choices"][0]


@pytest.mark.heavy
def test_every_schema_validates():
    def one(i):
        s = SCHEMAS[i]
        c = ask(s["schema"], s["name"], i)
        text = c["message"]["content"]
        try:
            jsonschema.validate(json.loads(text), s["schema"])
            ok = True
        except (ValueError, jsonschema.ValidationError) as e:
            ok = False
            print(f"INVALID {s['name']} ({c['finish_reason']}): {str(e)[:200]}\n{text[-200:]}")
        return ok, c["finish_reason"]
    before = metrics()
    with ThreadPoolExecutor(8) as pool:  # 8 at once: batched, and the masks of each step
        res = list(pool.map(one, range(len(SCHEMAS))))
    after = metrics()
    valid = sum(ok for ok, _ in res)
    stopped = sum(fr == "stop" for _, fr in res)
    computed = after['dualpath_grammar_masks_total{source="computed"}'] - \
        before['dualpath_grammar_masks_total{source="computed"}']
    cached = after['dualpath_grammar_masks_total{source="cached"}'] - \
        before['dualpath_grammar_masks_total{source="cached"}']
    skipped = after['dualpath_grammar_masks_total{source="skipped"}'] - \
        before['dualpath_grammar_masks_total{source="skipped"}']
    secs = after["dualpath_grammar_seconds_total"] - before["dualpath_grammar_seconds_total"]
    print(f"structured output: {valid} of {len(SCHEMAS)} schemas valid, {stopped} ended by the "
          f"grammar (the rest cut at max_tokens in a string the model did not close); "
          f"{int(computed + cached + skipped)} constrained tokens, {int(skipped)} sampled without "
          f"a mask, {int(computed)} masks computed, "
          f"{secs * 1e3 / max(1, computed + cached + skipped):.3f} ms of masking per token")
    # Every answer the grammar ended is valid JSON of its schema. One cut at
    # max_tokens cannot be whole JSON; a small model at temperature 0.7 runs
    # on in a free string now and then, so those are counted, not failed.
    assert all(ok for ok, fr in res if fr == "stop")
    assert stopped >= 0.85 * len(SCHEMAS), [fr for _, fr in res]


def test_sampled_tokens_skip_the_mask():
    """At temperature 1 without truncation a token drawn from the unmasked
    row that the grammar allows is taken as it is (drawn with the masked
    row's probabilities); only rejected draws compute a mask. Every token is
    one of the three, and the answer is the schema's JSON."""
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    before = metrics()
    st, d = chat({"messages": [{"role": "user", "content": "Give an example of a person as JSON."}],
                  "response_format": {"type": "json_schema",
                                      "json_schema": {"name": "p", "schema": schema}},
                  "temperature": 1.0, "seed": 5, "max_tokens": 200})
    after = metrics()
    assert st == 200, d
    c = d["choices"][0]
    assert c["finish_reason"] == "stop", c
    jsonschema.validate(json.loads(c["message"]["content"]), schema)
    n = {k: after[f'dualpath_grammar_masks_total{{source="{k}"}}'] -
         before[f'dualpath_grammar_masks_total{{source="{k}"}}'] for k in ("computed", "cached", "skipped")}
    assert n["skipped"] > 0, n
    # Each token took the sampled draw or a mask (a rejected draw's mask,
    # computed or cached); nothing else ran in between.
    assert n["skipped"] + n["computed"] + n["cached"] == d["usage"]["completion_tokens"], (n, d["usage"])


def test_json_object_and_streaming():
    body = {"messages": [{"role": "user", "content": "Reply with a JSON object with the keys "
                                                     "name and age for a cat."}],
            "response_format": {"type": "json_object"}, "temperature": 0, "max_tokens": 800}
    st, d = chat(body)
    assert st == 200, d
    doc = json.loads(d["choices"][0]["message"]["content"])
    assert isinstance(doc, dict)
    st, _, raw = request("POST", "/v1/chat/completions", {**body, "stream": True}, timeout=600)
    assert st == 200
    text = ""
    for line in raw.decode().split("\n"):
        if line.startswith("data: {"):
            for c in json.loads(line[6:])["choices"]:
                text += c.get("delta", {}).get("content") or ""
    assert json.loads(text) == doc  # the same greedy tokens, streamed


def test_choice_regex_and_grammars():
    st, d = chat({"messages": [{"role": "user", "content": "Is the sky blue?"}],
                  "guided_choice": ["yes", "no", "it depends"], "temperature": 1.0, "seed": 3})
    assert st == 200, d
    assert d["choices"][0]["message"]["content"] in ("yes", "no", "it depends")
    assert d["choices"][0]["finish_reason"] == "stop"

    pat = r"[0-9]{3}-[0-9]{4}"
    st, d = chat({"messages": [{"role": "user", "content": "A phone number?"}],
                  "guided_regex": pat, "temperature": 1.0, "seed": 4})
    assert st == 200, d
    assert re.fullmatch(pat, d["choices"][0]["message"]["content"]), d

    gbnf = 'root ::= "The answer is " [0-9]+ "."'
    for key, path in (("guided_grammar", "/v1/chat/completions"), ("grammar", "/v1/completions")):
        body = {"guided_grammar" if key == "guided_grammar" else "grammar": gbnf,
                "temperature": 1.0, "seed": 5, "max_tokens": 50}
        if path.endswith("chat/completions"):
            body["messages"] = [{"role": "user", "content": "What is 6 times 7?"}]
        else:
            body["prompt"] = "Q: What is 6 times 7?\nA:"
        st, _, raw = request("POST", path, body)
        assert st == 200, raw
        c = json.loads(raw)["choices"][0]
        text = c["message"]["content"] if "message" in c else c["text"]
        assert re.fullmatch(r"The answer is [0-9]+\.", text), text

    # llama.cpp's json_schema field on a completion.
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    st, _, raw = request("POST", "/v1/completions",
                         {"prompt": "A JSON object with a number:", "json_schema": schema,
                          "max_tokens": 100, "temperature": 0})
    assert st == 200, raw
    jsonschema.validate(json.loads(json.loads(raw)["choices"][0]["text"]), schema)


@pytest.mark.heavy
def test_batched_with_free_text():
    # 32 constrained sequences at once beside free-text ones: all valid, and
    # the free text is what it is alone (the masks touch only their rows).
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer"},
                                               "tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
                                                        "maxItems": 3}},
              "required": ["name", "age", "tags"]}
    free = {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 12,
            "temperature": 0}
    alone = chat(free)[1]["choices"][0]["message"]["content"]

    def one(i):
        if i >= 32:
            return chat(free)[1]["choices"][0]["message"]["content"]
        c = ask(schema, "person", i)
        jsonschema.validate(json.loads(c["message"]["content"]), schema)
        return c["finish_reason"]
    res = parallel(one, 36)
    assert all(r == "stop" for r in res[:32]), res[:32]
    assert all(r == alone for r in res[32:]), res[32:]


@pytest.mark.parametrize("body,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema":
                          {"type": "number", "multipleOf": 3}}}},
     "response_format.json_schema.schema.multipleOf"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema":
                          {"type": "object", "properties": {"a": {"type": "string",
                                                                    "pattern": "(?=x)"}}}}}},
     "response_format.json_schema.schema.properties.a.pattern"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema.schema"),
    ({"guided_json": {"type": "object"}, "guided_regex": "a"}, "guided_regex"),
    ({"guided_grammar": "root ::= undefined_rule"}, "guided_grammar"),
    ({"grammar": "root ::= root \"a\""}, "grammar"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_choice": ["a", 1]}, "guided_choice"),
    ({"guided_regex": "(a)\\1"}, "guided_regex"),
    ({"guided_json": "{not json"}, "guided_json"),
    # What a grammar may cost is bounded: a 400, not the daemon's memory.
    ({"guided_grammar": "root ::= (\"a\"?){0,100000}"}, "guided_grammar"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema":
                          {"type": "string", "maxLength": 100000}}}}, "response_format"),
])
def test_bad_constraints(body, param):
    st, d = chat({"messages": [{"role": "user", "content": "x"}], **body})
    assert st == 400, d
    assert d["error"]["param"] == param, d
