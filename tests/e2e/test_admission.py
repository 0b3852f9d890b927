"""Admission over HTTP, with the daemon's default settings (dualpath on): chat
requests without max_tokens (the most common request there is) all run at
once, as many as with dualpath off; default_max_tokens applies to requests
that set none."""
import json

from conftest import Daemon, metrics, parallel, request

CHAT = {"messages": [{"role": "user", "content": "Say hello to my friend Sam."}],
        "temperature": 0, "stop": ["."]}


def run_concurrent(d, n):
    def one(i):
        st, _, b = request("POST", "/v1/chat/completions", CHAT, base=d.url)
        return st, json.loads(b)
    for st, b in parallel(one, n):
        assert st == 200, b
        assert b["choices"][0]["finish_reason"] == "stop", b
    return metrics(base=d.url)


def test_chat_without_max_tokens_all_run_at_once():
    peaks = {}
    for mode in ("true", "false"):
        d = Daemon(extra=["--dualpath" if mode == "true" else "--no-dualpath"],
                   log_name=f"dualpathd-admission-{mode}")
        try:
            m = run_concurrent(d, 8)
            peaks[mode] = m["dualpath_requests_running_peak"]
            assert m["dualpath_requests_running"] == 0
        finally:
            assert d.stop() == 0
    # All 8 are admitted in the first step: nothing waits for another to end.
    assert peaks["true"] == 8, peaks
    assert peaks["false"] == 8, peaks


def test_default_max_tokens_applies():
    d = Daemon(extra=["--default-max-tokens", "3"], log_name="dualpathd-default-max-tokens")
    try:
        body = {"messages": [{"role": "user", "content": "Tell me a long story."}],
                "temperature": 0}
        st, _, b = request("POST", "/v1/chat/completions", body, base=d.url)
        assert st == 200, b
        r = json.loads(b)
        assert r["usage"]["completion_tokens"] == 3
        assert r["choices"][0]["finish_reason"] == "length"
        # An explicit max_tokens still wins.
        st, _, b = request("POST", "/v1/chat/completions", dict(body, max_tokens=5), base=d.url)
        assert st == 200, b
        assert json.loads(b)["usage"]["completion_tokens"] == 5
        st, _, b = request("POST", "/v1/completions", {"prompt": "Once upon a time",
                                                       "temperature": 0}, base=d.url)
        assert json.loads(b)["usage"]["completion_tokens"] == 3
    finally:
        assert d.stop() == 0


def test_small_kv_memory_caps_the_context():
    """A KV memory smaller than the model's context caps the context (as
    llama.cpp's -c does), so that a chat request without max_tokens is served
    rather than refused as too large for the pool; /v1/models says so."""
    for flag in ("--dualpath", "--no-dualpath"):
        d = Daemon(extra=["--kv-memory", "64MiB", flag], log_name="dualpathd-smallkv")
        try:
            st, _, b = request("POST", "/v1/chat/completions", CHAT, base=d.url)
            assert st == 200, b
            st, _, b = request("GET", "/v1/models", base=d.url)
            m = json.loads(b)["data"][0]
            assert 0 < m["max_model_len"] < 8192, m
        finally:
            assert d.stop() == 0
