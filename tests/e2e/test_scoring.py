"""Scoring a prompt: completions with echo + logprobs give every prompt token's
logprob (the first null, as OpenAI's legacy API did, which
lm-evaluation-harness reads for loglikelihoods), max_tokens 0 scores the
prompt alone, and vLLM's prompt_logprobs gives the same in its own shape.
The figures are checked against the NumPy reference forward of the same
GGUF (tests/model/ref_llama.py), and a scored prompt never comes from the
prefix cache (every position has its logits)."""
import json
import math
import os
import sys

import numpy as np
import pytest

from conftest import MODEL, metrics, parallel, request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "model"))

TEXT = ("The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins "
        "with a single step. The capital of France is Paris, and the capital of Italy is Rome.")


def completion(body):
    st, _, raw = request("POST", "/v1/completions", body)
    return st, json.loads(raw)


def tokenize(text):
    st, d = completion({"prompt": text, "max_tokens": 0, "echo": True, "logprobs": 0})
    assert st == 200, d
    return d


@pytest.fixture(scope="module")
def ref():
    import ref_llama
    return ref_llama.load(MODEL)


@pytest.fixture(scope="module")
def vocab():
    """The reference's own tokenizer, built from the GGUF (once: it parses
    the file and 49k merges)."""
    import ref_llama
    return ref_llama.Vocab(MODEL)


def prompt_ids(text):
    """The prompt's token ids, from vLLM's prompt_logprobs (each entry's
    first key is the prompt's own token)."""
    st, d = completion({"prompt": text, "max_tokens": 0, "prompt_logprobs": 0})
    assert st == 200, d
    return d["choices"][0]["prompt_logprobs"]


def test_echo_logprobs_match_the_reference(ref, vocab):
    import ref_llama
    # Token ids in, so that both sides score exactly the same tokens.
    st, _, raw = request("POST", "/tokenize", {"content": TEXT})
    assert st == 200
    ids = json.loads(raw)["tokens"]
    assert len(ids) > 20
    st, d = completion({"prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 1})
    assert st == 200, d
    c = d["choices"][0]
    assert c["finish_reason"] == "length" and d["usage"]["completion_tokens"] == 0
    got = c["logprobs"]["token_logprobs"]
    assert got[0] is None and c["logprobs"]["top_logprobs"][0] is None
    assert len(got) == len(ids) and all(isinstance(x, float) for x in got[1:])

    want = ref_llama.log_softmax(ref_llama.forward(ref, ids))
    want_lp = np.array([want[p - 1, ids[p]] for p in range(1, len(ids))])
    diff = np.abs(np.array(got[1:]) - want_lp)
    # The CPU backend's fast kernels quantize activations per block for their
    # integer dot products, as llama.cpp does. Measured on this text, mean /
    # max |diff| in nats: AVX-512 0.071 / 0.54, AVX2 0.089 / 0.34; the exact
    # kernels (portable level, or exact_matmul) 0.0012 / 0.011. The bounds
    # hold the fast levels with room; the greedy check below is exact.
    print(f"prompt logprobs vs reference: {len(diff)} tokens, mean |diff| {diff.mean():.4f}, "
          f"max {diff.max():.4f}; sum {sum(got[1:]):.3f} vs {want_lp.sum():.3f}")
    assert diff.mean() < 0.15 and diff.max() < 1.0
    # Greedy agreement where the reference's choice is clear (lm-eval's
    # is_greedy): the reported top token is the reference's argmax.
    agree = n = 0
    for p in range(1, len(ids)):
        row = want[p - 1]
        top2 = np.sort(row)[-2:]
        if top2[1] - top2[0] < 0.5:
            continue
        n += 1
        top = c["logprobs"]["top_logprobs"][p]
        agree += max(top, key=top.get) == vocab.decode([int(np.argmax(row))])
    assert n >= 5 and agree == n, (agree, n)


def test_vllm_prompt_logprobs_shape_and_rank():
    lp = prompt_ids(TEXT)
    st, d = completion({"prompt": TEXT, "max_tokens": 0, "prompt_logprobs": 3})
    assert st == 200, d
    full = d["choices"][0]["prompt_logprobs"]
    assert full[0] is None and len(full) == len(lp)
    for a, b in zip(lp[1:], full[1:]):
        own = next(iter(a))
        assert next(iter(b)) == own           # the prompt's token comes first
        assert abs(a[own]["logprob"] - b[own]["logprob"]) < 1e-6
        ranks = sorted(v["rank"] for k, v in b.items() if k != own)
        # the top 3 (the prompt's token among them when it ranks <= 3)
        assert ranks == [r for r in (1, 2, 3) if r != b[own]["rank"]][:len(ranks)]
        assert b[own]["rank"] >= 1
        best = min(b.values(), key=lambda v: v["rank"])
        assert all(v["logprob"] <= best["logprob"] + 1e-6 for v in b.values())


def test_scoring_equals_generation():
    # The logprob of a greedy token, generated, and the same token scored as
    # the prompt's last: the same logits row (both computed in a prefill).
    prompt = "The capital of France is"
    st, d = completion({"prompt": prompt, "max_tokens": 1, "temperature": 0, "logprobs": 0})
    assert st == 200, d
    gen = d["choices"][0]
    tok, lp_gen = gen["logprobs"]["tokens"][0], gen["logprobs"]["token_logprobs"][0]
    d = tokenize(prompt + tok)
    scored = d["choices"][0]["logprobs"]
    assert scored["tokens"][-1] == tok
    assert abs(scored["token_logprobs"][-1] - lp_gen) < 1e-3, (scored["token_logprobs"][-1], lp_gen)


def test_scoring_with_generation_and_offsets():
    st, d = completion({"prompt": "Water boils at", "max_tokens": 4, "temperature": 0,
                        "echo": True, "logprobs": 2})
    assert st == 200, d
    c = d["choices"][0]
    lp = c["logprobs"]
    n_prompt = d["usage"]["prompt_tokens"]
    assert len(lp["tokens"]) == n_prompt + d["usage"]["completion_tokens"]
    assert lp["token_logprobs"][0] is None
    assert all(isinstance(x, float) for x in lp["token_logprobs"][1:])
    assert c["text"].startswith("Water boils at")
    # Offsets rise through the prompt and continue after its text.
    offs = lp["text_offset"]
    assert offs[0] == 0 and all(a <= b for a, b in zip(offs, offs[1:]))
    assert offs[n_prompt] == len("Water boils at")


def test_streamed_echo_carries_the_prompt_logprobs():
    st, _, raw = request("POST", "/v1/completions",
                         {"prompt": "Water boils at", "max_tokens": 3, "temperature": 0,
                          "echo": True, "logprobs": 1, "stream": True})
    assert st == 200
    chunks = [json.loads(l[6:]) for l in raw.decode().split("\n")
              if l.startswith("data: {")]
    first = chunks[0]["choices"][0]
    assert first["text"] == "Water boils at"
    assert first["logprobs"]["token_logprobs"][0] is None
    n = len(first["logprobs"]["tokens"])
    assert n >= 3 and all(isinstance(x, float) for x in first["logprobs"]["token_logprobs"][1:])
    st, d = completion({"prompt": "Water boils at", "max_tokens": 3, "temperature": 0,
                        "echo": True, "logprobs": 1})
    assert d["choices"][0]["logprobs"]["token_logprobs"][:n] == \
        first["logprobs"]["token_logprobs"]


def test_loglikelihood_requests_in_parallel():
    # lm-evaluation-harness's shape: context + each choice, echo, logprobs 1,
    # max_tokens 1 (or 0), concurrently; every choice gets its own sum, the
    # same as alone, and the likely continuation wins.
    ctx = "Question: What is the capital of France?\nAnswer:"
    choices = [" Paris", " a banana", " the moon", " Rome"]
    n_ctx = len(tokenize(ctx)["choices"][0]["logprobs"]["tokens"])

    def score(i):
        st, d = completion({"prompt": ctx + choices[i % 4], "max_tokens": i % 2, "echo": True,
                            "logprobs": 1, "temperature": 0})
        assert st == 200, d
        return sum(d["choices"][0]["logprobs"]["token_logprobs"][n_ctx:n_ctx + 8]
                   [:len(tokenize(ctx + choices[i % 4])["choices"][0]["logprobs"]["tokens"]) - n_ctx])

    alone = [score(i) for i in range(4)]
    together = parallel(score, 8)
    for i in range(8):
        assert abs(together[i] - alone[i % 4]) < 1e-3, (i, together[i], alone[i % 4])
    assert max(range(4), key=lambda i: alone[i]) == 0, alone
    assert len(set(round(x, 3) for x in alone)) == 4  # no ties


def test_scored_prompt_is_computed_whole():
    # The second request's prompt is in the prefix cache; scoring computes it
    # all again (and reports every position), while a plain request reuses it.
    prompt = TEXT + " " + TEXT
    before = metrics()
    a = tokenize(prompt)["choices"][0]["logprobs"]["token_logprobs"]
    b = tokenize(prompt)["choices"][0]["logprobs"]["token_logprobs"]
    after = metrics()
    assert a == b and a[0] is None and None not in a[1:]
    computed = after["dualpath_prompt_tokens_computed_total"] - \
        before["dualpath_prompt_tokens_computed_total"] \
        if "dualpath_prompt_tokens_computed_total" in after else None
    if computed is not None:
        assert computed >= 2 * (len(a) - 1)


@pytest.mark.parametrize("body,param", [
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 0, "echo": True}, "max_tokens"),
    ({"prompt": "x", "prompt_logprobs": -1}, "prompt_logprobs"),
    ({"prompt": "x", "prompt_logprobs": 21}, "prompt_logprobs"),
    ({"prompt": "x", "prompt_logprobs": "2"}, "prompt_logprobs"),
    ({"prompt": "x", "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ({"prompt": "x", "max_tokens": -1, "echo": True, "logprobs": 1}, "max_tokens"),
])
def test_bad_scoring_requests(body, param):
    st, d = completion(body)
    assert st == 400, d
    assert d["error"]["param"] == param, d


def test_chat_prompt_logprobs():
    st, _, raw = request("POST", "/v1/chat/completions",
                         {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2,
                          "prompt_logprobs": 1, "temperature": 0})
    assert st == 200
    d = json.loads(raw)
    plp = d["prompt_logprobs"]
    assert plp[0] is None and len(plp) == d["usage"]["prompt_tokens"]
    assert all(math.isfinite(next(iter(e.values()))["logprob"]) for e in plp[1:])


def test_remote_tokenizer_endpoints(vocab):
    # vLLM's tokenizer endpoints, as lm-evaluation-harness's
    # tokenizer_backend=remote calls them: /tokenizer_info, then /tokenize
    # {"prompt", "add_special_tokens": false} and /detokenize {"tokens"} ->
    # {"prompt"}; its eos_token_id is the first id of encode(eos_token).
    import gguf
    st, _, raw = request("GET", "/tokenizer_info")
    assert st == 200
    info = json.loads(raw)
    r = gguf.GGUFReader(MODEL)
    eos_id = vocab.eos
    assert info["eos_token"] == vocab.tokens[eos_id]
    assert info["pad_token"] is None and isinstance(info["add_bos_token"], bool)
    assert info["vocab_size"] == len(vocab.tokens) and info["model_max_length"] > 0
    assert info["chat_template"] == r.fields["tokenizer.chat_template"].contents()

    def post(path, body):
        st, _, raw = request("POST", path, body)
        assert st == 200, raw
        return json.loads(raw)

    assert post("/tokenize", {"prompt": info["eos_token"], "add_special_tokens": False})[
        "tokens"] == [eos_id]
    ids = post("/tokenize", {"prompt": TEXT, "add_special_tokens": False})["tokens"]
    assert ids == vocab.encode(TEXT)
    assert post("/detokenize", {"tokens": ids})["prompt"] == TEXT
    st, _, raw = request("POST", "/tokenize", {"prompt": TEXT, "add_special_tokens": 1})
    assert st == 400 and json.loads(raw)["error"]["param"] == "add_special_tokens"
    st, _, _ = request("POST", "/tokenizer_info", {})
    assert st == 405


def test_generated_end_token_has_its_logprob():
    # lm-evaluation-harness sums token_logprobs[ctxlen:-1] of echo +
    # max_tokens 1, taking the last entry for the generated token: when that
    # token ends the generation (EOS), it must still have its entry, with
    # empty text, or the sum loses the continuation's last token.
    st, _, raw = request("GET", "/tokenizer_info")
    eos = json.loads(raw)["eos_token"]
    st, _, raw = request("POST", "/tokenize", {"prompt": eos, "add_special_tokens": False})
    eos_id = json.loads(raw)["tokens"][0]
    text = "The capital of France is Paris"
    n_prompt = len(tokenize(text)["choices"][0]["logprobs"]["tokens"])
    for stream in (False, True):
        body = {"prompt": text, "max_tokens": 1, "echo": True, "logprobs": 1, "temperature": 0,
                "logit_bias": {str(eos_id): 100}, "stream": stream}
        st, _, raw = request("POST", "/v1/completions", body)
        assert st == 200, raw
        if stream:
            events = [json.loads(l[6:]) for l in raw.decode().split("\n")
                      if l.startswith("data: {")]
            lps = [e["choices"][0]["logprobs"] for e in events if e["choices"][0].get("logprobs")]
            toks = sum((x["tokens"] for x in lps), [])
            lp = sum((x["token_logprobs"] for x in lps), [])
            fin = events[-1]["choices"][0]["finish_reason"]
            out = "".join(e["choices"][0]["text"] for e in events)
        else:
            c = json.loads(raw)["choices"][0]
            toks, lp, fin, out = (c["logprobs"]["tokens"], c["logprobs"]["token_logprobs"],
                                  c["finish_reason"], c["text"])
        assert fin == "stop" and out == text, (fin, out)
        # (its logprob is the model's, before logit_bias, as vLLM reports it)
        assert len(lp) == n_prompt + 1 and toks[-1] == "" and isinstance(lp[-1], float)
        assert "".join(toks) == text
