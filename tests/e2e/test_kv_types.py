"""A quantized decode path (decode_kv_type = q8_0 / q4_0) as the daemon serves
it: the decode path reads the arena's blocks in the quantized type (30 q8_0
tokens where a block holds 16 f16 tokens), usage.dualpath reports the bytes
kept against the whole cache's, and eight long chat replies that need more
than the arena in f16 fit it in q8_0."""
import json
import subprocess

import pytest

from conftest import BIN, MODEL, Daemon, metrics, parallel

# SmolLM2-135M: 30 layers x 3 KV heads x 64, K and V.
F16_TOKEN_BYTES = 30 * 3 * 64 * 2 * 2
PROMPT = ("Mira walked along the harbour at dawn, counting the fishing boats that came in one by "
          "one, and writing down the name painted on each hull in a small blue notebook. ") * 4


def chat(d, content, **extra):
    # A bound on a hang, not on speed: eight 200-token replies on the
    # ASan + UBSan daemon of a busy 2-core machine can take minutes.
    st, _, raw = d.request("POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": content}], "temperature": 0, **extra},
        timeout=900)
    o = json.loads(raw)
    assert st == 200, o
    return o


@pytest.fixture(scope="module", params=["q8_0", "q4_0"])
def quantized(request):
    # Keep 0.9 (the default keeps every token): the bytes of what is kept
    # and evicted both show.
    d = Daemon(extra=["--decode-kv-type", request.param, "--keep-ratio", "0.9"],
               log_name=f"dualpathd-{request.param}")
    yield request.param, d
    assert d.stop() == 0


def test_decode_blocks_hold_more_tokens(quantized):
    kind, d = quantized
    per_block = {"q8_0": 30, "q4_0": 56}[kind]
    assert metrics(base=d.url)['dualpath_kv_block_tokens{pool="decode"}'] == per_block
    assert metrics(base=d.url)['dualpath_kv_block_tokens{pool="prefill"}'] == 16
    assert metrics(base=d.url)["dualpath_kv_arena_shared"] == 1
    assert f"{per_block} in {kind} on the decode path" in d.log_text()


def test_usage_reports_bytes(quantized):
    kind, d = quantized
    per_block = {"q8_0": 30, "q4_0": 56}[kind]
    o = chat(d, PROMPT + " What did Mira count?", max_tokens=12)
    assert o["choices"][0]["message"]["content"]
    u = o["usage"]["dualpath"]
    kept, evicted = u["tokens_kept"], u["tokens_evicted"]
    assert evicted > 0 and kept + evicted == o["usage"]["prompt_tokens"]
    # Kept tokens at the arena's bytes per decode token, against every
    # prompt token whole in f16.
    assert u["kv_bytes"] == round(kept * F16_TOKEN_BYTES * 16 / per_block)
    assert u["kv_bytes_full"] == (kept + evicted) * F16_TOKEN_BYTES
    full = chat(d, PROMPT + " What did Mira count?", max_tokens=12, dualpath={"keep_ratio": 1.0})
    uf = full["usage"]["dualpath"]
    assert uf["tokens_evicted"] == 0
    assert uf["kv_bytes"] < uf["kv_bytes_full"] * (0.55 if kind == "q8_0" else 0.3)


def test_per_request_decode_type(quantized):
    """"dualpath": {"decode_kv_type"} keeps one request's decode path in
    another type on the same arena: its kept tokens cost that type's bytes
    (16, 30 or 56 tokens in a 16-token f16 block), the same tokens are kept,
    and a type the server cannot keep, or an unknown name, is a 400 naming
    the field while the daemon keeps serving."""
    kind, d = quantized
    per_block = {"f16": 16, "q8_0": 30, "q4_0": 56}
    seen = {}
    for t in per_block:
        u = chat(d, PROMPT + " Which boat came in first?", max_tokens=8,
                 dualpath={"decode_kv_type": t})["usage"]["dualpath"]
        assert u["kv_bytes"] == round(u["tokens_kept"] * F16_TOKEN_BYTES * 16 / per_block[t]), (t, u)
        seen[t] = u
    assert len({(u["tokens_kept"], u["kv_bytes_full"]) for u in seen.values()}) == 1, seen
    assert seen["f16"]["kv_bytes"] > seen["q8_0"]["kv_bytes"] > seen["q4_0"]["kv_bytes"]
    default = chat(d, PROMPT + " Which boat came in first?", max_tokens=8)["usage"]["dualpath"]
    assert default == seen[kind]
    for bad, words in (("f32", "decode_kv_type f32 is not available"),
                       ("q5_1", "'dualpath.decode_kv_type' must be one of"),
                       (8, "'dualpath.decode_kv_type' must be one of")):
        st, _, raw = d.request("POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
            "dualpath": {"decode_kv_type": bad}})
        e = json.loads(raw)
        assert st == 400 and words in e["error"]["message"], e
    assert chat(d, "Hi", max_tokens=2)["choices"][0]["message"]["content"] is not None


@pytest.mark.heavy
def test_long_replies_fit_quantized():
    """Eight replies of 200 tokens after short prompts in a 28 MiB arena
    (79 blocks of 16 f16 tokens): at the end each holds 8 blocks in q8_0,
    64 in all with its prompt blocks freed, so nothing is ever preempted
    whatever the order requests arrive in; the f16 decode path needs 15
    blocks each, half as much again as the arena, and is reported beside it."""
    out = {}
    for kind in ("f16", "q8_0"):
        d = Daemon(extra=["--kv-memory", "28MiB", "--decode-kv-type", kind],
                   log_name=f"dualpathd-fit-{kind}")
        try:
            def one(i):
                return chat(d, f"Story {i}: tell me a long story about a lighthouse keeper.",
                            max_tokens=200, ignore_eos=True)
            res = parallel(one, 8)
            assert all(r["usage"]["completion_tokens"] == 200 for r in res)
            out[kind] = (metrics(base=d.url)["dualpath_preemptions_total"],
                         metrics(base=d.url)["dualpath_requests_running_peak"])
        finally:
            assert d.stop() == 0
    print(f"8 x 200-token replies in 28 MiB: f16 decode path {out['f16'][0]:.0f} preemptions "
          f"(peak {out['f16'][1]:.0f} running), q8_0 {out['q8_0'][0]:.0f} (peak {out['q8_0'][1]:.0f})")
    assert out["q8_0"][0] == 0


def test_quantized_whole_cache_with_dualpath_off():
    """kv_cache_type = q8_0 with the dual path off (llama.cpp's -ctk q8_0
    -ctv q8_0): the same kv_memory holds 64/34 of the f16 blocks (rows of
    64 values: 128 bytes in f16, 68 in q8_0), a chat is answered, and the
    same prompt's greedy answer starts as f16's does. With the dual path on
    the setting is refused at start, naming it."""
    got = {}
    for kind in ("f16", "q8_0"):
        d = Daemon(extra=["--no-dualpath", "--kv-memory", "64MiB", "--kv-cache-type", kind],
                   log_name=f"dualpathd-whole-{kind}")
        try:
            blocks = metrics(base=d.url)['dualpath_kv_blocks_capacity{pool="prefill"}']
            o = chat(d, PROMPT + " What did Mira count?", max_tokens=12)
            got[kind] = (blocks, o["choices"][0]["message"]["content"])
            assert o["usage"]["completion_tokens"] > 0
        finally:
            assert d.stop() == 0
    assert got["q8_0"][0] == int(got["f16"][0] * 128 // 68), got
    assert got["q8_0"][1].split()[:2] == got["f16"][1].split()[:2], got
    r = subprocess.run([BIN, "--config", "", "--model", MODEL, "--listen", "127.0.0.1:0",
                        "--kv-cache-type", "q8_0"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "kv_cache_type q8_0" in r.stderr and "dualpath = false" in r.stderr, r.stderr
