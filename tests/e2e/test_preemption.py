"""Preemption keeps outputs, over HTTP, with dualpath on (the default) and the exact f32 cache: the
same greedy requests sent together to a daemon whose KV memory is small enough
to force preemptions give the text each gives alone on the shared daemon (the
same settings, more memory), because a preempted compact cache is swapped out
and restored as it was. n = 4 prefills its prompt once and its copies share
the first one's compaction (q8_0) or prefill blocks (kivi4)."""
import json

import pytest

from conftest import Daemon, hold_stream, metrics, parallel, request

PROMPTS = [f"Request {i}: " + "The history of the river valley is long and varied, and " * 6
           for i in range(12)]


def body(p):
    return {"prompt": p, "max_tokens": 160, "temperature": 0, "ignore_eos": True}


def complete(p, base=None):
    st, _, b = request("POST", "/v1/completions", body(p), base=base)
    assert st == 200, b
    return json.loads(b)


@pytest.mark.heavy
def test_outputs_equal_alone_under_preemption():
    # Both daemons keep the exact f32 cache: with f16, a last-bit difference
    # between batch compositions (the matmul is not batch-invariant) can
    # round to another f16 value and flip a near-tie, which is not what this
    # test is about.
    big = Daemon(extra=["--kv-cache-type", "f32"], log_name="dualpathd-alone")
    try:
        alone = [complete(p, base=big.url)["choices"][0]["text"] for p in PROMPTS]
    finally:
        assert big.stop() == 0
    d = Daemon(extra=["--kv-memory", "48MiB", "--kv-cache-type", "f32"], log_name="dualpathd-preempt")
    try:
        out = parallel(lambda i: complete(PROMPTS[i], base=d.url), len(PROMPTS))
        for i, o in enumerate(out):
            assert o["choices"][0]["text"] == alone[i], i
        m = metrics(base=d.url)
        # Decode-path preemptions are swaps (a prefill-path one is recomputed
        # over the whole cache, which is exact), none fell back to recompute.
        assert m['dualpath_swaps_total{direction="out"}'] >= 5, m["dualpath_preemptions_total"]
        assert m["dualpath_decode_recomputes_total"] == 0
        assert m['dualpath_swaps_total{direction="in"}'] == m['dualpath_swaps_total{direction="out"}']
        assert m["dualpath_swap_bytes"] == 0
        # The swap space (swap_space, 4 GiB by default) was taken at start-up.
        assert (4 << 30) - (1 << 20) < m["dualpath_swap_space_bytes"] <= 4 << 30
        for o in out:
            assert o["usage"]["completion_tokens"] == 160
    finally:
        assert d.stop() == 0


@pytest.fixture(params=["default", "q8_0"])
def shares_server(request, server):
    return (request.param, server if request.param == "default" else
            request.getfixturevalue("q8_server"))


def test_n4_prefills_the_prompt_once(shares_server):
    kind, base = shares_server
    prompt = "Shared: " + "A long system prompt that every choice starts from. " * 30
    m0 = metrics(base)
    # 8 tokens each, EOS or not: the first choice still decodes when the
    # others migrate (its compaction lives while it runs).
    st, _, b = request("POST", "/v1/completions",
                       {"prompt": prompt, "n": 4, "max_tokens": 8, "temperature": 0,
                        "ignore_eos": True}, base=base)
    assert st == 200, b
    r = json.loads(b)
    p = r["usage"]["prompt_tokens"]
    m1 = metrics(base)
    computed = m1["dualpath_engine_prefill_tokens_total"] - m0["dualpath_engine_prefill_tokens_total"]
    in_place = m1["dualpath_tokens_in_place_total"] - m0["dualpath_tokens_in_place_total"]
    kept = m1["dualpath_tokens_kept_total"] - m0["dualpath_tokens_kept_total"]
    shares = m1["dualpath_kept_shares_total"] - m0["dualpath_kept_shares_total"]
    if kind == "q8_0":
        # The choices are queued together: the three copies take the first's
        # compaction (a kept share) in whole q8_0 decode blocks of 30 tokens,
        # copying only its last partial block.
        assert shares == 3
        assert in_place >= 3 * (kept // 4 - 30), (in_place, kept)
    else:
        # kivi4 (the CPU's default) keeps every choice's prompt by reference
        # to the prefill blocks at its migration (each seals its own groups
        # as it grows): no copy to share.
        assert shares == 0
        assert in_place >= 4 * (p // 16 - 1) * 16, (in_place, p)
    texts = {c["text"] for c in r["choices"]}
    assert len(texts) == 1  # greedy: the four choices agree
    # The prompt once, then per copy only what cannot be shared: below one
    # block of 16 tokens (keeping the first's compaction, a copy scores
    # nothing, so it computes no SnapKV window of its own).
    assert computed <= p + 3 * 16, (computed, p)
    assert computed < 2 * p


def test_identical_request_keeps_a_running_compaction(shares_server):
    """A request whose prompt a running request already holds on the decode
    path computes only its last partial block and selects nothing: with q8_0
    it keeps that compaction (a kept share); with kivi4 it takes the same
    prefill blocks by reference. The first runs until the second is done (it
    is cancelled then), so the order is fixed by events, not by speed."""
    kind, base = shares_server
    prompt = "Identical: " + "Every request here asks the very same long question, word for word. " * 20
    # At its first token it has migrated and named its compaction.
    holder = hold_stream("/v1/completions", {"prompt": prompt, "max_tokens": 4000,
                                             "temperature": 0, "ignore_eos": True}, base=base)
    m0 = metrics(base)
    st, _, b = request("POST", "/v1/completions",
                       {"prompt": prompt, "max_tokens": 4, "temperature": 0}, base=base)
    m1 = metrics(base)
    holder.close()
    assert st == 200, b
    p = json.loads(b)["usage"]["prompt_tokens"]
    shares = m1["dualpath_kept_shares_total"] - m0["dualpath_kept_shares_total"]
    assert shares == (1 if kind == "q8_0" else 0)
    computed = m1["dualpath_engine_prefill_tokens_total"] - m0["dualpath_engine_prefill_tokens_total"]
    assert computed <= 16, (computed, p)
