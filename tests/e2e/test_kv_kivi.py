"""kivi4, the decode path's grouped 4-bit KV type, as the daemon serves it:
a group of 56 tokens per arena block (keys per channel, values per token),
a sequence's first arena block and its newest tokens in the arena's f16;
usage.dualpath reports the bytes held (the lead and whole groups at an arena
block each, the residual in f16); chats under concurrent load, multi-turn through parked turns, all
answered; settings it does not keep refused at start-up with their names."""
import json
import subprocess

import pytest

from conftest import BIN, MODEL, Daemon, metrics, parallel

# SmolLM2-135M: 30 layers x 3 KV heads x 64, K and V.
F16_TOKEN_BYTES = 30 * 3 * 64 * 2 * 2
BLOCK_BYTES = 16 * F16_TOKEN_BYTES
GROUP = 56
TEXT = ("The harbour master kept a ledger of every ship that came in: the Heron on Monday with "
        "salt, the Marigold on Tuesday with timber, the Northern Star on Wednesday with wool, "
        "and on Thursday a small boat called the Osprey that carried only letters. ") * 3


def chat(d, messages, **extra):
    # A bound on a hang, not on speed (the ASan daemon on a busy machine).
    st, _, raw = d.request("POST", "/v1/chat/completions", {
        "messages": messages, "temperature": 0, **extra}, timeout=900)
    o = json.loads(raw)
    assert st == 200, o
    return o


def held_bytes(kept):
    # The lead (the first arena block, whole), the whole groups short of the
    # recent window (one arena block of the newest tokens, whole), the rest
    # in f16 (kvcache/manager.h kv_mgr_group_sealed).
    lead = recent = 16
    if kept < lead + GROUP + recent:
        return kept * F16_TOKEN_BYTES
    groups = (kept - lead - recent) // GROUP
    sealed = lead + groups * GROUP
    return (1 + groups) * BLOCK_BYTES + (kept - sealed) * F16_TOKEN_BYTES


@pytest.fixture(scope="module")
def kivi():
    d = Daemon(extra=["--decode-kv-type", "kivi4"], log_name="dualpathd-kivi4")
    yield d
    assert d.stop() == 0


def test_groups_per_block(kivi):
    assert metrics(base=kivi.url)['dualpath_kv_block_tokens{pool="decode"}'] == GROUP
    assert metrics(base=kivi.url)['dualpath_kv_block_tokens{pool="prefill"}'] == 16
    assert f"{GROUP} in kivi4 on the decode path" in kivi.log_text()


def test_usage_reports_held_bytes(kivi):
    before = metrics(base=kivi.url)["dualpath_kv_groups_sealed_total"]
    o = chat(kivi, [{"role": "user", "content": TEXT * 6 + "Which ship carried wool?"}],
             max_tokens=80, dualpath={"enabled": True})
    assert o["choices"][0]["message"]["content"]
    u = o["usage"]["dualpath"]
    kept = u["tokens_kept"]
    assert kept == o["usage"]["prompt_tokens"] and u["tokens_evicted"] == 0, u
    assert u["kv_bytes"] == held_bytes(kept), u
    assert u["kv_bytes_full"] == kept * F16_TOKEN_BYTES
    # (989 tokens: the lead, 17 groups and a residual of 21 f16 tokens,
    # 0.312 of the f16 bytes; 0.286 per token once sealed.)
    assert u["kv_bytes"] < 0.35 * u["kv_bytes_full"], u
    # The prompt's groups, then the reply's as they filled.
    sealed = metrics(base=kivi.url)["dualpath_kv_groups_sealed_total"] - before
    assert sealed >= (kept + 80) // GROUP - 1, sealed


def test_shared_prompt_groups(kivi):
    """n = 2 (and a later request with the same prompt, through the first's
    parked turn): the prompt's groups are sealed once, from the prefix
    cache's blocks, and held by both (kvcache/gshare.h); the answers are
    those of one request."""
    msgs = [{"role": "user", "content": TEXT * 3 + "Which ship carried wool?"}]
    m0 = metrics(base=kivi.url)
    o = chat(kivi, msgs, max_tokens=40, n=2, dualpath={"enabled": True})
    m1 = metrics(base=kivi.url)
    shared = m1["dualpath_kv_groups_shared_total"] - m0["dualpath_kv_groups_shared_total"]
    # Every whole group of the prompt short of the recent window.
    assert shared >= (o["usage"]["prompt_tokens"] - 32) // GROUP, shared
    a, b = (c["message"]["content"] for c in o["choices"])
    assert a == b
    assert chat(kivi, msgs, max_tokens=40)["choices"][0]["message"]["content"] == a


def test_concurrent_multiturn(kivi):
    """Eight three-turn chats at once: each turn continues its parked cache
    (groups and residual as they were), every answer comes back."""
    def conv(i):
        msgs = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": f"My locker number is {4170 + i}. " + TEXT +
                 "Summarize the ledger in one sentence."}]
        outs = []
        for q in ("Name the ship that came on Tuesday.", "What is my locker number?"):
            o = chat(kivi, msgs, max_tokens=40)
            outs.append(o)
            msgs += [{"role": "assistant", "content": o["choices"][0]["message"]["content"]},
                     {"role": "user", "content": q}]
        outs.append(chat(kivi, msgs, max_tokens=40))
        return outs
    before = metrics(base=kivi.url)["dualpath_turns_resumed_total"]
    res = parallel(conv, 8)
    for outs in res:
        for o in outs:
            assert o["choices"][0]["finish_reason"] in ("stop", "length"), o
    assert metrics(base=kivi.url)["dualpath_turns_resumed_total"] > before
    st, _, _ = kivi.request("GET", "/health")
    assert st == 200


def test_per_request_kivi4_on_a_q8_0_server():
    """A request may ask for kivi4 on a server whose decode path is q8_0:
    another view of the same arena."""
    d = Daemon(extra=["--decode-kv-type", "q8_0"], log_name="dualpathd-kivi4-request")
    try:
        u = chat(d, [{"role": "user", "content": TEXT + "Which ship carried salt?"}],
                 max_tokens=8, dualpath={"decode_kv_type": "kivi4", "enabled": True})["usage"]
        assert u["dualpath"]["kv_bytes"] == held_bytes(u["dualpath"]["tokens_kept"]), u
    finally:
        assert d.stop() == 0


@pytest.mark.parametrize("flags,chosen", [
    ([], f"{GROUP} in kivi4"),
    (["--exempt-layers", "2"], "30 in q8_0"),
    (["--decode-budget", "256"], "30 in q8_0"),
    (["--early-switch"], "30 in q8_0"),
])
def test_auto_chooses_kivi4_where_it_is_kept(flags, chosen):
    """decode_kv_type = auto (the default) on the CPU: kivi4, or q8_0 where
    a setting kivi4 refuses is given; never a start-up error."""
    d = Daemon(extra=flags, log_name="dualpathd-auto")
    try:
        assert chosen in d.log_text(), d.log_text()
        o = chat(d, [{"role": "user", "content": TEXT + "Which ship carried salt?"}], max_tokens=8)
        assert o["usage"]["completion_tokens"] > 0
    finally:
        assert d.stop() == 0


@pytest.mark.parametrize("flags,words", [
    (["--decode-budget", "256"], "decode_budget"),
    (["--exempt-layers", "2"], "exempt_layers"),
    (["--early-switch"], "early_switch"),
])
def test_refused_settings(flags, words):
    r = subprocess.run([BIN, "--model", MODEL, "--listen", "127.0.0.1:0", "--decode-kv-type",
                        "kivi4"] + flags, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "kivi4" in r.stderr and words in r.stderr, r.stderr
