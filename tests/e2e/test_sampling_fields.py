"""vLLM's min_tokens and stop_token_ids, greedy on the default model, each
checked against the same request without it: min_tokens holds back the end
of generation (and stop tokens and stop strings) until that many tokens,
stop_token_ids ends the output at the first sampled one, whose text is
part of the output unless it is a special token."""
import json

import pytest

from conftest import request


def post(path, body):
    st, _, raw = request("POST", path, body)
    return st, json.loads(raw)


def complete(body):
    st, o = post("/v1/completions", dict({"temperature": 0}, **body))
    assert st == 200, o
    return o


def ids_of(text):
    st, o = post("/tokenize", {"content": text, "add_special": False})
    assert st == 200, o
    return o["tokens"]


# Questions whose greedy answer may end within a few tokens. Which of them
# does depends on the kernels' arithmetic (a near-tie at the first token can
# turn a one-line answer into a long one), so the tests take the first that
# does on this daemon.
SHORT_QUESTIONS = ["What is the capital of France?", "What is 2 + 2?", "Say hello.",
                   "Name one colour.", "Is water wet? Answer yes or no."]


def short_chat():
    """A greedy chat request and its free answer, which ends by itself (the
    end-of-turn token) in under 20 tokens."""
    tried = []
    for q in SHORT_QUESTIONS:
        body = {"messages": [{"role": "user", "content": q}], "temperature": 0, "max_tokens": 60}
        st, free = post("/v1/chat/completions", body)
        assert st == 200, free
        if free["choices"][0]["finish_reason"] == "stop" and free["usage"]["completion_tokens"] < 20:
            return body, free
        tried.append((q, free["choices"][0]["message"]["content"]))
    pytest.fail("no question got a short greedy answer: %r" % tried)


def test_min_tokens_holds_back_the_end():
    body, free = short_chat()
    st, held = post("/v1/chat/completions", dict(body, min_tokens=25))
    assert st == 200, held
    assert held["usage"]["completion_tokens"] >= 25, held
    # The first tokens are the free answer's (greedy; only the end was masked).
    assert held["choices"][0]["message"]["content"].startswith(
        free["choices"][0]["message"]["content"].rstrip()[:3])


def test_min_tokens_mutes_stop_strings():
    base = {"prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "max_tokens": 40}
    free = complete(base)
    text = free["choices"][0]["text"]
    assert "," in text, text
    cut = complete(dict(base, stop=[","]))
    assert cut["choices"][0]["finish_reason"] == "stop"
    assert cut["usage"]["completion_tokens"] < 6, cut
    held = complete(dict(base, stop=[","], min_tokens=8))
    h = held["choices"][0]["text"]
    assert held["usage"]["completion_tokens"] >= 8, held
    # It ends at the first ',' after the minimum, its text a prefix of the free one.
    assert text.startswith(h), (text, h)
    assert h.count(",") >= 1


def test_min_tokens_above_max_tokens_is_400():
    st, o = post("/v1/completions", {"prompt": "Hi", "max_tokens": 4, "min_tokens": 5})
    assert st == 400, o
    assert o["error"]["param"] == "min_tokens"


def test_stop_token_ids_end_the_output():
    base = {"prompt": "The capital of France is", "max_tokens": 12}
    free = complete(base)
    toks = ids_of(free["choices"][0]["text"])
    assert len(toks) >= 4, toks
    stop = toks[2]
    got = complete(dict(base, stop_token_ids=[stop]))
    c = got["choices"][0]
    assert c["finish_reason"] == "stop", got
    # Ends at the first time that token was sampled, its text included.
    n = toks.index(stop) + 1
    assert got["usage"]["completion_tokens"] == n, (got, toks)
    st, d = post("/detokenize", {"tokens": toks[:n]})
    assert st == 200, d
    assert c["text"] == d["prompt"], (c["text"], d)


def test_special_stop_token_adds_no_text():
    # <|im_end|> ends a chat turn; as a stop id with ignore_eos it still ends it, textless.
    body, free = short_chat()
    end = ids_of("<|im_end|>")
    assert len(end) == 1, end
    st, o = post("/v1/chat/completions", dict(body, ignore_eos=True, stop_token_ids=end))
    assert st == 200, o
    assert o["choices"][0]["finish_reason"] == "stop"
    assert o["choices"][0]["message"]["content"] == free["choices"][0]["message"]["content"]
    assert "<|im_end|>" not in o["choices"][0]["message"]["content"]


@pytest.mark.parametrize("value", ["2", [2.5], [-1], [10 ** 9], [0] * 65, {"a": 1}])
def test_bad_stop_token_ids_are_400(value):
    st, o = post("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "stop_token_ids": value})
    assert st == 400, o
    assert o["error"]["param"] == "stop_token_ids"


def _stream(path, body):
    import http.client
    import os
    from urllib.parse import urlparse
    u = urlparse(os.environ["DUALPATHD_URL"])
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    c.request("POST", path, json.dumps(dict(body, stream=True)),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200
    out = []
    for line in r.read().decode().split("\n"):
        if line.startswith("data: {"):
            out.append(json.loads(line[6:]))
    c.close()
    return out


@pytest.mark.parametrize("stop", [",", " 7"])
def test_logprobs_end_where_the_text_ends(stop):
    """A stop string cuts the text; the tokens that completed it (wholly
    past the cut) are not in logprobs, whole or streamed."""
    body = {"prompt": "1, 2, 3, 4, 5,", "max_tokens": 12, "temperature": 0, "logprobs": 1,
            "stop": [stop]}
    o = complete(body)
    c = o["choices"][0]
    assert c["finish_reason"] == "stop", o
    toks = c["logprobs"]["tokens"]
    assert "".join(toks) == c["text"], (toks, c["text"])
    assert len(c["logprobs"]["token_logprobs"]) == len(toks) == len(c["logprobs"]["text_offset"])
    # usage still counts every token generated
    assert o["usage"]["completion_tokens"] > len(toks)
    chunks = _stream("/v1/completions", body)
    text = "".join(ch["choices"][0]["text"] for ch in chunks if ch.get("choices"))
    stoks = [t for ch in chunks if ch.get("choices") and ch["choices"][0].get("logprobs")
             for t in ch["choices"][0]["logprobs"]["tokens"]]
    assert text == c["text"] and stoks == toks, (text, stoks)


def test_chat_logprobs_end_where_the_text_ends():
    body = {"messages": [{"role": "user", "content": "Count from 1 to 10, separated by commas."}],
            "max_tokens": 40, "temperature": 0, "logprobs": True, "stop": ["4"]}
    st, o = post("/v1/chat/completions", body)
    assert st == 200, o
    c = o["choices"][0]
    assert c["finish_reason"] == "stop", o
    got = "".join(t["token"] for t in c["logprobs"]["content"])
    assert got == c["message"]["content"], (got, c["message"]["content"])
