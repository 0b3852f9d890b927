"""Gemma 3 270M (the second real model, gemma3: sliding-window layers)
served over HTTP: a chat answered in Gemma's turns; a prompt longer than
its 512-token window answered with the tokens the forward pass gives
alone, with the sliding layers kept apart at their window (the default)
and whole (swa_full); eviction on the global layers where the sliding
ones are apart, and refused by name where they are whole.

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


def metric(d, name):
    st, _, raw = d.request("GET", "/metrics")
    assert st == 200
    for line in raw.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(name + " not in /metrics")


def test_whole_sliding_layers_same_text(gemma_whole):
    """swa_full keeps every token of the sliding layers in the main store:
    the same greedy text as with them apart (the window reads the same
    keys)."""
    ids = readme_tokens(700)
    d = Daemon(model=GEMMA, extra=["--no-dualpath", "--kv-cache-type", "f32", "--swa-full"],
               log_name="dualpathd-gemma3-swa-full")
    try:
        body = {"prompt": ids, "max_tokens": 24, "temperature": 0}
        st, full = post(d, "/v1/completions", body)
        assert st == 200, full
        assert "sliding-window layers apart" not in d.log_text()
    finally:
        assert d.stop() == 0
    st, apart = post(gemma_whole, "/v1/completions", body)
    assert st == 200, apart
    assert apart["choices"][0]["text"] == full["choices"][0]["text"]


def test_past_the_window_with_the_defaults(gemma):
    """The defaults: the 15 sliding layers apart at their window, the 3
    global ones on the dual path (f16 prefill, kivi4 decode path); a prompt
    past the window keeps every token (keep_ratio 1), and once answered
    only parked turns hold sliding blocks, a window's (33 blocks) each."""
    ids = readme_tokens(700)
    st, r = post(gemma, "/v1/completions", {"prompt": ids, "max_tokens": 16, "temperature": 0})
    assert st == 200, r
    assert r["usage"]["completion_tokens"] == 16
    assert r["usage"]["dualpath"]["tokens_evicted"] == 0
    log = gemma.log_text()
    assert "keeps its 15 sliding-window layers (of 18) at their window of 512" in log
    assert "the 15 sliding-window layers apart" in log
    assert metric(gemma, 'dualpath_kv_blocks_capacity{pool="sliding"}') > 0
    parked = metric(gemma, "dualpath_parked_turns")
    assert parked >= 1
    assert metric(gemma, 'dualpath_kv_blocks_used{pool="sliding"}') <= 33 * parked


def test_eviction_on_the_global_layers(gemma):
    """Apart, the sliding layers are read by position: eviction applies to
    the global layers, which have no window."""
    ids = readme_tokens(700)
    st, r = post(gemma, "/v1/completions", {"prompt": ids, "max_tokens": 8, "temperature": 0,
                                             "dualpath": {"keep_ratio": 0.5}})
    assert st == 200, r
    assert r["usage"]["completion_tokens"] == 8
    assert r["usage"]["dualpath"]["tokens_evicted"] > 300


def test_whole_sliding_layers_refuse_eviction():
    p = subprocess.run([BIN, "--config", "", "--model", GEMMA, "--listen", "127.0.0.1:0",
                        "--swa-full", "--keep-ratio", "0.5"], capture_output=True, text=True,
                       timeout=HANG_S)
    assert p.returncode != 0
    assert "keep_ratio" in p.stderr and "sliding-window" in p.stderr, p.stderr[-500:]


def test_next_turn_continues_the_parked_turn(gemma):
    """A finished turn parks its compact cache with its sliding layers'
    window; the next turn (asked to be compressed) continues it: its
    history is not computed again."""
    msgs = [{"role": "user", "content": "Name three colours."}]
    st, o = post(gemma, "/v1/chat/completions", {"messages": msgs, "max_tokens": 12,
                                                  "temperature": 0, "dualpath": {"enabled": True}})
    assert st == 200, o
    first = o["usage"]
    msgs += [{"role": "assistant", "content": o["choices"][0]["message"]["content"]},
             {"role": "user", "content": "And three fruits?"}]
    m0 = metric(gemma, "dualpath_turns_resumed_total")
    st, o = post(gemma, "/v1/chat/completions", {"messages": msgs, "max_tokens": 12,
                                                  "temperature": 0, "dualpath": {"enabled": True}})
    assert st == 200, o
    d = o["usage"]["dualpath"]
    assert metric(gemma, "dualpath_turns_resumed_total") == m0 + 1
    assert d["tokens_resumed"] >= first["prompt_tokens"], (o["usage"], first)
    assert metric(gemma, 'dualpath_kv_blocks_used{pool="sliding"}') > 0  # the parked window
