"""Gemma 3 270M (the second real model, gemma3: sliding-window layers)
served over HTTP: a chat answered in Gemma's turns, a prompt longer than
its 512-token window answered with the tokens the forward pass gives
alone, and the settings that would evict from a sliding-window layer
refused by name.

The model comes from scripts/fetch-model.sh gemma3-270m (test.sh fetches
it and names it in DP_GEMMA3_MODEL). Marked heavy: 700-token prompts on a
270M model, run against the release daemon."""
import json
import os
import subprocess

import pytest

from conftest import BIN, HANG_S, ROOT, Daemon

GEMMA = os.environ.get("DP_GEMMA3_MODEL", "")
DP_LOGITS = os.path.join(os.path.dirname(os.path.dirname(BIN)), "tools", "dp-logits")

pytestmark = [pytest.mark.heavy,
              pytest.mark.skipif(not os.path.isfile(GEMMA),
                                 reason="DP_GEMMA3_MODEL names no file (scripts/fetch-model.sh "
                                        "gemma3-270m)")]


def readme_tokens(n):
    """The first n tokens of README.md in Gemma's vocabulary (real text, no
    repeats), from the tokenizer dp-logits shares with the daemon."""
    path = os.path.join(os.environ.get("DUALPATHD_LOGDIR", "/tmp"), "gemma3-readme.hex")
    with open(os.path.join(ROOT, "README.md"), "rb") as f, open(path, "w") as out:
        out.write(f.read()[:4000].hex() + "\n")
    p = subprocess.run([DP_LOGITS, "--model", GEMMA, "--tokenize", path], check=True,
                       capture_output=True, text=True, timeout=HANG_S)
    ids = json.loads(p.stdout.splitlines()[0])
    assert len(ids) >= n
    return ids[:n]


@pytest.fixture(scope="module")
def gemma():
    d = Daemon(model=GEMMA, log_name="dualpathd-gemma3")
    yield d
    assert d.stop() == 0


@pytest.fixture(scope="module")
def gemma_whole():
    """Dual path off, f32 KV: the forward pass's own arithmetic."""
    d = Daemon(model=GEMMA, extra=["--no-dualpath", "--kv-cache-type", "f32"],
               log_name="dualpathd-gemma3-f32")
    yield d
    assert d.stop() == 0


def post(d, path, body):
    st, _, raw = d.request("POST", path, body)
    return st, json.loads(raw)


def test_chat_in_gemmas_turns(gemma):
    st, r = post(gemma, "/v1/chat/completions", {
        "messages": [{"role": "system", "content": "You are brief."},
                     {"role": "user", "content": "Name a color."}],
        "max_tokens": 16, "temperature": 0})
    assert st == 200, r
    assert r["choices"][0]["message"]["content"].strip()
    assert r["usage"]["completion_tokens"] > 0
    st, _, raw = gemma.request("GET", "/tokenizer_info")
    assert st == 200 and "<start_of_turn>" in json.loads(raw)["chat_template"]
    assert "using Gemma's" in gemma.log_text()


def test_past_the_window_as_the_forward_pass(gemma_whole):
    """700 tokens: 188 past the window of its sliding layers. The daemon's
    greedy text is that of the tokens dp-logits gives for the same ids
    (the same int8 matmul and f32 KV, run alone)."""
    ids = readme_tokens(700)
    p = subprocess.run([DP_LOGITS, "--model", GEMMA, "--tokens", ",".join(map(str, ids)),
                        "--steps", "24"], check=True, capture_output=True, text=True,
                       timeout=HANG_S)
    want = json.loads(p.stdout)["greedy"]
    st, r = post(gemma_whole, "/detokenize", {"tokens": want})
    assert st == 200, r
    st, c = post(gemma_whole, "/v1/completions", {"prompt": ids, "max_tokens": 24,
                                                   "temperature": 0})
    assert st == 200, c
    assert c["usage"]["completion_tokens"] == 24
    assert c["choices"][0]["text"] == r["content"]


def test_past_the_window_with_the_defaults(gemma):
    """The default dual path (f16 prefill, q8_0 decode path) answers a
    prompt past the window and keeps every token (keep_ratio 1)."""
    ids = readme_tokens(700)
    st, r = post(gemma, "/v1/completions", {"prompt": ids, "max_tokens": 16, "temperature": 0})
    assert st == 200, r
    assert r["usage"]["completion_tokens"] == 16
    assert r["usage"]["dualpath"]["tokens_evicted"] == 0


def test_eviction_refused_by_name(gemma):
    st, r = post(gemma, "/v1/completions", {"prompt": "Hello", "max_tokens": 4,
                                             "dualpath": {"keep_ratio": 0.5}})
    assert st == 400, r
    assert "keep_ratio" in r["error"]["message"] and "sliding-window" in r["error"]["message"]


def test_start_up_refuses_eviction():
    p = subprocess.run([BIN, "--config", "", "--model", GEMMA, "--listen", "127.0.0.1:0",
                        "--keep-ratio", "0.5"], capture_output=True, text=True, timeout=HANG_S)
    assert p.returncode != 0
    assert "keep_ratio" in p.stderr and "sliding-window" in p.stderr, p.stderr[-500:]
