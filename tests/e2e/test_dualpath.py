"""The dual path through the API: the per-request "dualpath" override, the
usage.dualpath report, the dual-path metrics, and a multi-turn chat that
takes its earlier turns back from the prefix cache."""
import json
import math
import shutil
import subprocess

import pytest

from conftest import BIN, MODEL, Daemon, metrics, parallel, request

SCORERS = ("knorm", "knorm_high", "snapkv", "recent", "random")

# About 300 tokens of prose that does not repeat itself (a repetitive prompt
# could trigger the path detector's own heuristics).
_SENTENCES = [
    "The old harbour town woke slowly under a grey sky.",
    "Fishermen carried nets past the bakery, where the first loaves cooled on racks.",
    "A girl named Mira counted gulls from the sea wall and wrote the numbers in a notebook.",
    "Her grandfather had kept such notebooks for forty years, one for every winter.",
    "He claimed the gulls knew when storms were coming long before the radio did.",
    "Nobody in town believed him, except the ferry captain, who never sailed on a day "
    "with fewer than twenty birds on the wall.",
    "That morning Mira counted seven.",
    "She ran down the cobbled lane to the pier, her boots loud on the wet stones.",
    "The captain was coiling rope and whistling a tune from the radio.",
    "When she showed him the page he stopped whistling and looked out at the water.",
    "The horizon was flat and bright, with no cloud anywhere.",
    "Still, he walked to the ticket booth and turned the sign from open to closed.",
    "Passengers grumbled on the benches and a man in a blue coat demanded a refund.",
    "By noon the wind had turned, and the bay was white with foam.",
    "The man in the blue coat bought Mira a hot chocolate at the harbour cafe.",
    "In the evening the whole town talked about the notebook, and the next winter "
    "three other children started counting gulls as well.",
    "The mayor put a small brass plaque on the sea wall in honour of the grandfather.",
    "Mira kept counting every morning, even in summer, when the storms were rare.",
]
LONG_PROMPT = " ".join(_SENTENCES)


def post(path, body, base=None):
    st, _, raw = request("POST", path, body, base=base)
    return st, json.loads(raw)


def complete(body, base=None):
    st, o = post("/v1/completions", body, base=base)
    assert st == 200, o
    return o


def dp_usage(o):
    u = o["usage"]
    assert set(u) >= {"prompt_tokens", "completion_tokens", "total_tokens", "dualpath"}, u
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    d = u["dualpath"]
    assert set(d) == {"tokens_kept", "tokens_evicted", "tokens_resumed", "kv_bytes",
                      "kv_bytes_full"}, d
    assert (d["kv_bytes"] == 0) == (d["tokens_kept"] == 0) and d["kv_bytes"] <= d["kv_bytes_full"]
    return d["tokens_kept"], d["tokens_evicted"]


@pytest.fixture(scope="module")
def dual(server):
    """The shared daemon runs the dual path (its default)."""
    m = metrics(server)
    if 'dualpath_kv_blocks_capacity{pool="decode"}' not in m:
        pytest.skip("the shared daemon runs without dualpath")
    return server


def test_keep_ratio_override_in_usage(dual):
    o = complete({"prompt": LONG_PROMPT, "max_tokens": 4, "temperature": 0,
                  "dualpath": {"keep_ratio": 0.3}})
    n = o["usage"]["prompt_tokens"]
    assert n >= 250, n
    kept, evicted = dp_usage(o)
    assert evicted > 0 and kept + evicted == n, (kept, evicted, n)
    # max(sinks + window, ceil(0.3 n)): never below the ratio, and well under the whole.
    assert math.ceil(0.3 * n) <= kept < n, (kept, n)
    o2 = complete({"prompt": LONG_PROMPT, "max_tokens": 4, "temperature": 0,
                   "dualpath": {"keep_ratio": 0.8}})
    kept2, evicted2 = dp_usage(o2)
    assert kept2 + evicted2 == n and kept2 >= math.ceil(0.8 * n) and kept2 > kept


def test_scorers_accepted(dual):
    for sc in SCORERS:
        o = complete({"prompt": LONG_PROMPT, "max_tokens": 2, "temperature": 0,
                      "dualpath": {"scorer": sc, "keep_ratio": 0.4, "enabled": True}})
        kept, evicted = dp_usage(o)
        assert evicted > 0 and kept + evicted == o["usage"]["prompt_tokens"], sc


def test_enabled_false_evicts_nothing(dual):
    o = complete({"prompt": LONG_PROMPT, "max_tokens": 4, "temperature": 0,
                  "dualpath": {"enabled": False, "keep_ratio": 0.3}})
    kept, evicted = dp_usage(o)
    assert evicted == 0, (kept, evicted)


@pytest.fixture(scope="module")
def f16_decode():
    """A daemon whose decode path keeps the prefill path's f16 (the default
    decode type on the CPU is kivi4)."""
    d = Daemon(extra=["--decode-kv-type", "same"])
    yield d.url
    assert d.stop() == 0


def test_keep_ratio_one_equals_disabled(f16_decode):
    """With nothing evicted and the decode path in f16, the dual path is the
    single path: the same bytes, the same tokens."""
    body = {"prompt": LONG_PROMPT, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    full = complete({**body, "dualpath": {"keep_ratio": 1.0}}, base=f16_decode)
    off = complete({**body, "dualpath": {"enabled": False}}, base=f16_decode)
    kept, evicted = dp_usage(full)
    assert evicted == 0 and kept == full["usage"]["prompt_tokens"]
    assert full["choices"][0]["text"] == off["choices"][0]["text"]
    assert full["usage"]["completion_tokens"] == off["usage"]["completion_tokens"] == 24


def test_keep_ratio_one_default_type_keeps_every_token(dual):
    """At the default decode type (kivi4 on the CPU) keep 1.0 evicts nothing
    and holds less than 0.6 of the f16 bytes (a short prompt: its lead and
    newest tokens stay f16)."""
    o = complete({"prompt": LONG_PROMPT, "max_tokens": 8, "temperature": 0,
                  "dualpath": {"keep_ratio": 1.0}})
    kept, evicted = dp_usage(o)
    assert evicted == 0 and kept == o["usage"]["prompt_tokens"]
    d = o["usage"]["dualpath"]
    assert d["kv_bytes"] < 0.6 * d["kv_bytes_full"], d


PK_FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. "
             "There and back again. ")


def _passkey_prompt(key, depth, reps=20):
    parts = ["There is an important pass key hidden inside a lot of irrelevant text. "
             "Find it and memorize it. I will quiz you about the pass key.\n\n"]
    for r in range(reps + 1):
        if r == depth:
            parts.append(f"The pass key is {key}. Remember it. {key} is the pass key. ")
        if r < reps:
            parts.append(PK_FILLER)
    parts.append("\n\nWhat is the pass key?")
    return "".join(parts)


# One key under ASan (the others run the same code at other depths).
@pytest.mark.parametrize("key,depth", [(95580, 0)] + [
    pytest.param(k, d, marks=pytest.mark.heavy)
    for k, d in [(4144133, 2), (3446332, 4), (566023, 9), (7694821, 20)]])
def test_passkey_survives_the_default_compression(dual, key, depth):
    """Retrieval at the daemon's defaults (every token kept, in the default
    decode type: kivi4 on the CPU) and with SnapKV evicting half of the prompt
    (keep 0.5, on the q8_0 decode path: eviction's own cost): a 5-7 digit key
    stated once in about 500 tokens of filler comes back as the whole cache
    gives it (these keys lost digits when SnapKV pooled over +-3 tokens: each
    digit is a token, and a key's last digits are not what the question
    attends to). Eviction at keep 0.5 on top of kivi4 is not held to it: at
    the AVX2 level it gave back 34672 for 3446332 (at AVX-512, every key)."""
    msgs = [{"role": "user", "content": _passkey_prompt(key, depth)}]
    body = {"messages": msgs, "max_tokens": 16, "temperature": 0}
    st, off = post("/v1/chat/completions", {**body, "dualpath": {"enabled": False}})
    assert st == 200, off
    assert str(key) in off["choices"][0]["message"]["content"], off
    st, dflt = post("/v1/chat/completions", body)
    assert st == 200, dflt
    assert str(key) in dflt["choices"][0]["message"]["content"], dflt
    st, on = post("/v1/chat/completions",
                  {**body, "dualpath": {"keep_ratio": 0.5, "decode_kv_type": "q8_0"}})
    assert st == 200, on
    kept, evicted = dp_usage(on)
    assert evicted > 0, (kept, evicted)
    assert str(key) in on["choices"][0]["message"]["content"], on


def test_chat_override_with_openai_client(dual, client, model_id):
    r = client.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": LONG_PROMPT + " What did Mira count?"}],
        max_tokens=8, temperature=0,
        extra_body={"dualpath": {"keep_ratio": 0.3, "scorer": "snapkv"}})
    u = r.usage.model_dump()
    assert u["prompt_tokens"] > 250 and u["completion_tokens"] >= 1
    d = u["dualpath"]
    assert d["tokens_evicted"] > 0
    assert d["tokens_kept"] + d["tokens_evicted"] == u["prompt_tokens"]


def test_usage_sums_over_choices(dual):
    o = complete({"prompt": LONG_PROMPT, "max_tokens": 3, "n": 2, "temperature": 0,
                  "dualpath": {"keep_ratio": 0.3}})
    kept, evicted = dp_usage(o)
    n = o["usage"]["prompt_tokens"]  # counted once per prompt, as OpenAI does
    assert len(o["choices"]) == 2 and evicted > 0
    assert kept + evicted == 2 * n, (kept, evicted, n)


def test_stream_usage_chunk_has_dualpath(dual):
    st, h, raw = request("POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": LONG_PROMPT}], "max_tokens": 4, "temperature": 0,
        "stream": True, "stream_options": {"include_usage": True},
        "dualpath": {"keep_ratio": 0.3}})
    assert st == 200 and h["Content-Type"].startswith("text/event-stream")
    events = [e for e in raw.decode().split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    last = json.loads(events[-2][6:])
    assert last["choices"] == []
    kept, evicted = dp_usage(last)
    assert evicted > 0 and kept + evicted == last["usage"]["prompt_tokens"]
    for e in events[:-2]:  # only the usage chunk carries usage
        assert "usage" not in json.loads(e[6:]) or json.loads(e[6:])["usage"] is None


BAD = [
    (1, "dualpath"),
    ("on", "dualpath"),
    ([], "dualpath"),
    ({"enable": True}, "dualpath"),
    ({"enabled": True, "budget": 3}, "dualpath"),
    ({"enabled": "yes"}, "dualpath.enabled"),
    ({"enabled": 1}, "dualpath.enabled"),
    ({"keep_ratio": 0}, "dualpath.keep_ratio"),
    ({"keep_ratio": -0.5}, "dualpath.keep_ratio"),
    ({"keep_ratio": 1.01}, "dualpath.keep_ratio"),
    ({"keep_ratio": "0.5"}, "dualpath.keep_ratio"),
    ({"keep_ratio": True}, "dualpath.keep_ratio"),
    ({"keep_ratio": 1e-300}, "dualpath.keep_ratio"),
    ({"scorer": "lru"}, "dualpath.scorer"),
    ({"scorer": "KNORM"}, "dualpath.scorer"),
    ({"scorer": ""}, "dualpath.scorer"),
    ({"scorer": 2}, "dualpath.scorer"),
    ({"keep_system": "yes"}, "dualpath.keep_system"),
    ({"keep_system": 1}, "dualpath.keep_system"),
    ({"keep_prefix": -1}, "dualpath.keep_prefix"),
    ({"keep_prefix": 1.5}, "dualpath.keep_prefix"),
    ({"keep_prefix": "16"}, "dualpath.keep_prefix"),
    ({"exempt_layers": -1}, "dualpath.exempt_layers"),
    ({"exempt_layers": 1.5}, "dualpath.exempt_layers"),
    ({"exempt_layers": "2"}, "dualpath.exempt_layers"),
]


@pytest.mark.parametrize("endpoint", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("value,param", BAD, ids=[json.dumps(b[0]) for b in BAD])
def test_invalid_override(server, endpoint, value, param):
    base = ({"prompt": "Hello"} if endpoint == "/v1/completions"
            else {"messages": [{"role": "user", "content": "Hello"}]})
    st, o = post(endpoint, {**base, "max_tokens": 2, "dualpath": value})
    assert st == 400, o
    assert o["error"]["type"] == "invalid_request_error"
    assert o["error"]["param"] == param, o
    assert "dualpath" in o["error"]["message"]
    # The server is fine afterwards, and null means "absent".
    st, o = post(endpoint, {**base, "max_tokens": 2, "dualpath": None})
    assert st == 200, o


def test_empty_and_null_members_mean_defaults(server):
    for dp in ({}, {"enabled": None, "keep_ratio": None, "scorer": None, "keep_system": None,
                    "keep_prefix": None}):
        o = complete({"prompt": "Hello", "max_tokens": 2, "dualpath": dp})
        dp_usage(o)


def migrations(m, scorer=None):
    """dualpath_migrations_total{scorer=...}, one scorer or all."""
    return sum(v for k, v in m.items() if k.startswith("dualpath_migrations_total{")
               and (scorer is None or f'scorer="{scorer}"' in k))


def _dual_metrics(m):
    names = ["dualpath_decode_path_sequences", 'dualpath_migrations_total{scorer="snapkv"}',
             'dualpath_scorer_fallbacks_total{kind="migration"}',
             "dualpath_tokens_kept_total", "dualpath_tokens_evicted_total",
             'dualpath_recompressions_total{scorer="snapkv"}', "dualpath_early_switches_total",
             "dualpath_early_signals_total", "dualpath_decode_queries_missed_total",
             "dualpath_migration_seconds_sum", "dualpath_migration_seconds_count",
             'dualpath_migration_seconds_bucket{le="+Inf"}', "dualpath_rebuilds_total",
             'dualpath_rebuild_tokens_total{source="prefix_cache"}',
             'dualpath_rebuild_tokens_total{source="host"}',
             "dualpath_host_tier_spilled_blocks_total", "dualpath_host_tier_blocks_capacity",
             "dualpath_preemptions_total", "dualpath_engine_prefill_tokens_total",
             'dualpath_kv_blocks_used{pool="prefill"}', 'dualpath_kv_blocks_capacity{pool="prefill"}']
    for k in names:
        assert k in m, k
    return names


def _check_migration_hist(m):
    buckets = sorted(((float(k.split('le="')[1].rstrip('"}')), v) for k, v in m.items()
                      if k.startswith("dualpath_migration_seconds_bucket{")), key=lambda b: b[0])
    assert len(buckets) >= 2 and math.isinf(buckets[-1][0])
    counts = [v for _, v in buckets]
    assert counts == sorted(counts), buckets  # cumulative
    assert counts[-1] == m["dualpath_migration_seconds_count"]


def test_metrics_present_and_moving(dual):
    before = metrics(dual)
    _dual_metrics(before)
    _check_migration_hist(before)
    assert before['dualpath_kv_blocks_capacity{pool="decode"}'] > 0
    assert 'dualpath_kv_blocks_used{pool="decode"}' in before
    o = complete({"prompt": LONG_PROMPT, "max_tokens": 4, "temperature": 0,
                  "dualpath": {"keep_ratio": 0.3}})
    kept, evicted = dp_usage(o)
    after = metrics(dual)
    _check_migration_hist(after)
    assert migrations(after) >= migrations(before) + 1
    assert after["dualpath_tokens_kept_total"] - before["dualpath_tokens_kept_total"] >= kept
    assert after["dualpath_tokens_evicted_total"] - before["dualpath_tokens_evicted_total"] >= evicted
    assert after["dualpath_migration_seconds_count"] > before["dualpath_migration_seconds_count"]
    assert after["dualpath_migration_seconds_sum"] > before["dualpath_migration_seconds_sum"]
    # Idle now: nothing left on the decode path.
    assert after["dualpath_decode_path_sequences"] == 0


def test_concurrent_snapkv_all_score_with_snapkv(dual):
    """16 requests at once (their prompts end in the same step or a few):
    every migration scores with SnapKV, none falls back to key norms."""
    before = metrics(dual)
    def one(i):
        return post("/v1/completions", {"prompt": f"{i}: " + " ".join(_SENTENCES[:2]),
                                        "max_tokens": 2, "temperature": 0,
                                        "dualpath": {"scorer": "snapkv", "keep_ratio": 0.5}})
    for st, o in parallel(one, 16):
        assert st == 200, o
    after = metrics(dual)
    assert migrations(after, "snapkv") - migrations(before, "snapkv") == 16
    assert migrations(after) - migrations(before) == 16
    fb = 'dualpath_scorer_fallbacks_total{kind="migration"}'
    assert after[fb] == before[fb]


def test_promtool_after_dualpath_traffic(dual):
    if not shutil.which("promtool"):
        pytest.skip("promtool is not installed (test_metrics.py tries to install it)")
    complete({"prompt": LONG_PROMPT, "max_tokens": 2, "dualpath": {"keep_ratio": 0.5}})
    _, _, body = request("GET", "/metrics")
    r = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True)
    out = (r.stdout + r.stderr).decode()
    assert r.returncode == 0 and not out.strip(), out


@pytest.fixture(scope="module")
def single_path_daemon():
    d = Daemon(["--no-dualpath"], log_name="dualpathd-nodual")
    yield d
    assert d.stop() == 0


def test_enabled_true_without_dualpath(single_path_daemon):
    base = single_path_daemon.url
    for endpoint, b in (("/v1/completions", {"prompt": "Hello"}),
                        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})):
        st, o = post(endpoint, {**b, "max_tokens": 2, "dualpath": {"enabled": True}}, base=base)
        assert st == 400, o
        assert o["error"]["type"] == "invalid_request_error"
        assert o["error"]["param"] == "dualpath.enabled"
        assert "dualpath" in o["error"]["message"]
        for dp in ({"enabled": False}, {"keep_ratio": 0.3}, None):
            st, o = post(endpoint, {**b, "max_tokens": 2, "dualpath": dp}, base=base)
            assert st == 200, o
            assert dp_usage(o)[1] == 0
    m = metrics(base)
    assert 'dualpath_kv_blocks_capacity{pool="prefill"}' in m
    assert not any('pool="decode"' in k for k in m)
    assert migrations(m) == 0
    if shutil.which("promtool"):
        _, _, body = request("GET", "/metrics", base=base)
        r = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True)
        out = (r.stdout + r.stderr).decode()
        assert r.returncode == 0 and not out.strip(), out


# ---- multi-turn chat through the prefix cache ----

QUESTIONS = [
    "Tell me a short story about a lighthouse keeper.",
    "Who was the main character?",
    "What did the keeper see at night?",
    "Give the story a different ending.",
    "Summarize our conversation in one sentence.",
]


def _chat(base, messages):
    st, o = post("/v1/chat/completions", {"messages": messages, "max_tokens": 24,
                                          "temperature": 0}, base=base)
    assert st == 200, o
    return o["choices"][0]["message"]["content"], o["usage"]


def _rebuild_tokens(m):
    return (m['dualpath_rebuild_tokens_total{source="prefix_cache"}']
            + m['dualpath_rebuild_tokens_total{source="host"}'])


@pytest.fixture(scope="module")
def no_resume_daemon():
    # q8_0: a reply's K/V go back to the prefix cache from a decode type
    # whose rows sit where the window's mapping says; kivi4's (the CPU's
    # default) are in sealed groups and are not written back (below).
    d = Daemon(["--no-resume-turns", "--decode-kv-type", "q8_0"], log_name="dualpathd-noresume")
    yield d
    assert d.stop() == 0


@pytest.mark.heavy
def test_multi_turn_chat_rebuilds(no_resume_daemon):
    # Without parked turns (resume_turns off) a later turn takes its history
    # back from the prefix cache: the path a turn takes when its previous
    # turn's compact cache was dropped for room.
    server = no_resume_daemon.url
    messages, answers = [], []
    prev_prompt = 0
    m_start = metrics(server)
    rebuilds0 = m_start["dualpath_rebuilds_total"]
    kept0 = m_start["dualpath_reply_blocks_kept_total"]
    for turn, q in enumerate(QUESTIONS, 1):
        messages.append({"role": "user", "content": q})
        m0 = metrics(server)
        text, usage = _chat(server, messages)
        m1 = metrics(server)
        answers.append(text)
        messages.append({"role": "assistant", "content": text})
        if turn >= 2:
            # The previous turn's prompt is a prefix of this one: its full
            # blocks come back instead of being prefilled again.
            bt = m1['dualpath_kv_block_tokens{pool="prefill"}']
            got = _rebuild_tokens(m1) - _rebuild_tokens(m0)
            assert got >= (prev_prompt // bt - 1) * bt, (turn, got, prev_prompt)
            assert m1["dualpath_rebuilds_total"] > m0["dualpath_rebuilds_total"]
            recomputed = (m1["dualpath_engine_prefill_tokens_total"]
                          - m0["dualpath_engine_prefill_tokens_total"])
            assert recomputed < usage["prompt_tokens"], (turn, recomputed, usage)
        prev_prompt = usage["prompt_tokens"]
    end = metrics(server)
    assert end["dualpath_rebuilds_total"] - rebuilds0 >= 4
    # Only the first turn migrated (the later ones run whole, compress_turns
    # off): its reply's K/V went back to the prefix cache for the next turn;
    # the later replies stay in place.
    assert end["dualpath_reply_blocks_kept_total"] - kept0 >= 1

    def converse(extra, name):
        d = Daemon(extra, log_name=name)
        try:
            out = [_chat(d.url, messages[:2 * turn + 1])[0] for turn in range(len(QUESTIONS))]
            return out, metrics(d.url)
        finally:
            assert d.stop() == 0
    # Every turn compressed: each reply's K/V go back for the next turn.
    q8 = ["--decode-kv-type", "q8_0"]
    _, m_all = converse(["--compress-turns", "always", "--no-resume-turns"] + q8,
                        "dualpathd-turns")
    assert m_all["dualpath_reply_blocks_kept_total"] >= len(QUESTIONS) - 1
    # kivi4 (the default): the prompt comes back from the prefix cache, the
    # reply is computed again with the new text.
    _, m_kivi = converse(["--compress-turns", "always", "--no-resume-turns"], "dualpathd-turns4")
    assert m_kivi["dualpath_reply_blocks_kept_total"] == 0
    assert m_kivi["dualpath_rebuilds_total"] >= 4
    # Exact rebuilds: with reuse_replies off every reply is recomputed over
    # the whole prefix, and the greedy answers are those of a daemon without
    # the prefix cache, which prefills every turn whole.
    exact, m_exact = converse(["--no-reuse-replies", "--compress-turns", "always",
                               "--no-resume-turns"], "dualpathd-noreuse")
    fresh, m_fresh = converse(["--no-prefix-cache", "--compress-turns", "always",
                               "--no-resume-turns"], "dualpathd-noprefix")
    assert m_fresh["dualpath_rebuilds_total"] == 0
    assert m_exact["dualpath_rebuilds_total"] >= 4
    assert m_exact["dualpath_reply_blocks_kept_total"] == 0
    assert exact == fresh


def test_later_chat_turns_run_whole(server):
    # A chat turn after an earlier reply that this daemon did not keep (a
    # history the client brings) runs whole while the KV memory has room
    # for it (compress_turns = auto, the default; the shared daemon's memory
    # is far from full): its prompt stays in the prefix cache for the next
    # turn anyway, so a compact copy would add memory, not free it
    # (docs/dualpath.md). A request can still ask for its turn to be
    # compressed.
    msgs = [{"role": "user", "content": "Name three animals that live in the sea."},
            {"role": "assistant", "content": "A whale, a shark and an octopus."},
            {"role": "user", "content": "And three fruits?"}]
    # One request alone first: the daemon is idle after it. (Right after a
    # step that ran several sequences, as the test before may have left it,
    # a turn arriving alone is taken for the first of a burst and continues
    # compressed; tests/unit/test_engine.c.)
    _chat(server, [{"role": "user", "content": "Say hello."}])
    m0 = metrics(server)
    _, u2 = _chat(server, msgs)
    m1 = metrics(server)
    assert u2["dualpath"]["tokens_kept"] == 0 and u2["dualpath"]["tokens_evicted"] == 0, u2
    assert u2["dualpath"]["tokens_resumed"] == 0, u2
    assert m1["dualpath_tokens_kept_total"] == m0["dualpath_tokens_kept_total"]
    # So does one whose previous turn this daemon served and parked: with
    # room it takes the exact history (its parked cache is dropped), and
    # answers as with dualpath off.
    first = [{"role": "user", "content": "Name three colours of the rainbow."}]
    text, u1 = _chat(server, first)
    assert u1["dualpath"]["tokens_kept"] > 0
    later = first + [{"role": "assistant", "content": text},
                     {"role": "user", "content": "And three fruits?"}]
    _, u3 = _chat(server, later)
    assert u3["dualpath"]["tokens_resumed"] == 0 and u3["dualpath"]["tokens_evicted"] == 0, u3
    st, o = post("/v1/chat/completions", {"messages": msgs, "max_tokens": 24, "temperature": 0,
                                          "dualpath": {"enabled": True}}, base=server)
    assert st == 200, o
    assert o["usage"]["dualpath"]["tokens_kept"] > 0
    # An assistant message that is the last one (a prefill to continue) is
    # not an earlier reply: the turn migrates.
    st, o = post("/v1/chat/completions",
                 {"messages": [{"role": "user", "content": "Count to five."},
                               {"role": "assistant", "content": "One, two,"}],
                  "max_tokens": 8, "temperature": 0}, base=server)
    assert st == 200, o
    assert o["usage"]["dualpath"]["tokens_kept"] > 0


def test_next_turn_continues_the_parked_turn(server):
    # A turn that migrated leaves its compact cache parked (resume_turns,
    # the default): a next turn that is to be compressed (here asked for;
    # by default, when memory binds) continues it. Its history (the
    # previous prompt and the reply) is not computed again; only the new
    # text is, on the decode path, and the prompt's end compacts the whole
    # to the keep ratio.
    msgs, prev = [{"role": "user", "content": "Name three colours."}], None
    for turn, q in enumerate(["And three fruits?", "And three birds?", "Which is largest?"]):
        m0 = metrics(server)
        st, o = post("/v1/chat/completions", {"messages": msgs, "max_tokens": 24, "temperature": 0,
                                              "dualpath": {"enabled": True}}, base=server)
        assert st == 200, o
        text, u = o["choices"][0]["message"]["content"], o["usage"]
        m1 = metrics(server)
        d = u["dualpath"]
        assert d["tokens_kept"] > 0 and d["tokens_kept"] + d["tokens_evicted"] == u["prompt_tokens"], u
        computed = (m1["dualpath_engine_prefill_tokens_total"]
                    - m0["dualpath_engine_prefill_tokens_total"])
        if prev is None:
            assert d["tokens_resumed"] == 0, u
        else:
            # The previous prompt came back, and the reply as far as the
            # prompt's last 32 tokens (SnapKV's window, computed in one step
            # for its queries).
            want = min(prev["prompt_tokens"] + prev["completion_tokens"] - 1, u["prompt_tokens"] - 32)
            assert d["tokens_resumed"] >= max(want, prev["prompt_tokens"]), (u, prev)
            assert m1["dualpath_turns_resumed_total"] == m0["dualpath_turns_resumed_total"] + 1
            assert computed == u["prompt_tokens"] - d["tokens_resumed"], (computed, u)
            assert computed < u["prompt_tokens"] - prev["prompt_tokens"], (computed, u, prev)
        assert m1["dualpath_turns_parked_total"] == m0["dualpath_turns_parked_total"] + 1
        assert text.strip(), u
        msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": q}]
        prev = u
    m = metrics(server)
    assert m["dualpath_parked_turns"] >= 1
    assert m["dualpath_resumed_tokens_total"] > 0


@pytest.fixture(scope="module")
def budget_daemon():
    d = Daemon(["--decode-budget", "64"], log_name="dualpathd-budget")
    yield d
    assert d.stop() == 0


@pytest.mark.heavy
def test_decode_budget_recompresses_with_snapkv_and_keeps_outputs(budget_daemon):
    """Under a decode budget long greedy replies are recompressed every 16
    tokens, each recompression scored by SnapKV over the sequence's own
    decode queries (none falls back to key norms, none misses a query), and
    four requests together answer as each does alone."""
    base = budget_daemon.url
    prompts = [f"Write a long story about a {w} who travels the world." for w in
               ("cat", "sailor", "robot", "baker")]
    def one(p):
        return post("/v1/chat/completions", {"messages": [{"role": "user", "content": p}],
                                             "max_tokens": 160, "temperature": 0,
                                             "ignore_eos": True}, base=base)
    before = metrics(base)
    alone = []
    for p in prompts:
        st, o = one(p)
        assert st == 200, o
        alone.append(o["choices"][0]["message"]["content"])
    mid = metrics(base)
    rec = 'dualpath_recompressions_total{scorer="snapkv"}'
    # 160 tokens past a budget of 64 (recompressed to 48): several each.
    assert mid[rec] - before[rec] >= 4 * 5
    res = parallel(lambda i: one(prompts[i]), 4)
    assert all(st == 200 for st, _ in res), res
    together = [o["choices"][0]["message"]["content"] for _, o in res]
    assert together == alone
    after = metrics(base)
    assert after[rec] - mid[rec] == mid[rec] - before[rec]
    assert sum(v for k, v in after.items() if k.startswith("dualpath_recompressions_total{")) == \
        after[rec]
    fb = 'dualpath_scorer_fallbacks_total{kind="recompression"}'
    assert after[fb] == before[fb]
    assert after["dualpath_decode_queries_missed_total"] == 0


def test_early_switch_scores_with_snapkv():
    """early_switch = true: a templated, repetitive prompt of about 1100
    tokens (longer than one step's 512) switches to the decode path after
    its first chunk, and the switch and its tail's compaction score with
    SnapKV over the chunks' own queries (nothing falls back to key norms);
    the repetition decides, so no kept set is measured for it. A prompt of
    random words has its kept set measured (SnapKV too) at
    the chunk ends past min_tokens."""
    import random
    # Keep 0.9 (the default keeps every token): the tail's compaction evicts.
    d = Daemon(["--early-switch", "--keep-ratio", "0.9"], log_name="dualpathd-early")
    try:
        ticket = ("Ticket {n}: the customer reports that the printer on floor 3 shows error "
                  "E-{e} after a paper jam. Status: open. Priority: normal. ")
        rep = "".join(ticket.format(n=1000 + i, e=40 + i % 7) for i in range(36))
        rep += "How many tickets mention floor 3?"
        m0 = metrics(d.url)
        o = complete({"prompt": rep, "max_tokens": 4, "temperature": 0}, base=d.url)
        m1 = metrics(d.url)
        assert o["usage"]["prompt_tokens"] > 1000, o["usage"]
        assert m1["dualpath_early_switches_total"] - m0["dualpath_early_switches_total"] == 1
        # At the end of its first 512-token step (min_tokens 256).
        assert (m1["dualpath_early_switch_tokens_total"]
                - m0["dualpath_early_switch_tokens_total"]) == 512
        assert m1["dualpath_early_signals_total"] == m0["dualpath_early_signals_total"]
        assert migrations(m1, "snapkv") - migrations(m0, "snapkv") == 1
        assert migrations(m1) - migrations(m0) == 1
        kept, evicted = dp_usage(o)
        assert evicted > 0 and kept + evicted == o["usage"]["prompt_tokens"], o["usage"]
        # Ended at its first token, before its prompt's end chose: all kept.
        o = complete({"prompt": rep.replace("Ticket 1", "Case 1"), "max_tokens": 1,
                      "temperature": 0}, base=d.url)
        assert dp_usage(o) == (o["usage"]["prompt_tokens"], 0), o["usage"]
        m1 = metrics(d.url)

        rng = random.Random(5)
        words = [w.strip(".,").lower() for w in LONG_PROMPT.split()]
        text = " ".join(rng.choice(words) for _ in range(900))
        o = complete({"prompt": text, "max_tokens": 4, "temperature": 0}, base=d.url)
        m2 = metrics(d.url)
        assert o["usage"]["prompt_tokens"] > 600, o["usage"]  # a chunk ends at 512
        assert m2["dualpath_early_signals_total"] - m1["dualpath_early_signals_total"] >= 1
        assert migrations(m2, "snapkv") - migrations(m1, "snapkv") == 1
        for k, v in m2.items():
            if k.startswith("dualpath_scorer_fallbacks_total{"):
                assert v == m0[k], k
    finally:
        assert d.stop() == 0


@pytest.fixture(scope="module")
def exempt_daemon():
    d = Daemon(["--exempt-layers", "2"], log_name="dualpathd-exempt")
    yield d
    assert d.stop() == 0


def test_exempt_layers_counted_and_refusable(exempt_daemon, server):
    """With exempt_layers = 2 a request's usage.dualpath.kv_bytes holds every
    prompt token of its two exempt layers beside the kept ones: 16 f16 tokens'
    bytes hold 30 q8_0 tokens, 15 exempt blocks of 2 of the 30 layers, so an
    exempt token costs 16 / (30 x 15) of an f16 one. A request may ask for
    none (the same kept tokens, without those bytes), not for another count;
    the gauge reads zero once nothing runs."""
    base = exempt_daemon.url
    body = {"prompt": LONG_PROMPT, "max_tokens": 4, "temperature": 0}
    o = complete(body, base=base)
    n = o["usage"]["prompt_tokens"]
    d = o["usage"]["dualpath"]
    z = complete({**body, "dualpath": {"exempt_layers": 0}}, base=base)["usage"]["dualpath"]
    assert z["tokens_kept"] == d["tokens_kept"] and z["kv_bytes_full"] == d["kv_bytes_full"]
    per_f16 = d["kv_bytes_full"] / n
    assert abs(d["kv_bytes"] - z["kv_bytes"] - n * per_f16 * 16 / (30 * 15)) <= 1, (d, z, n)
    same = complete({**body, "dualpath": {"exempt_layers": 2}}, base=base)["usage"]["dualpath"]
    assert same == d
    st, e = post("/v1/completions", {**body, "dualpath": {"exempt_layers": 3}}, base=base)
    assert st == 400 and "exempt_layers" in e["error"]["message"], e
    # The shared daemon has none: only 0 is accepted there.
    st, e = post("/v1/completions", {**body, "dualpath": {"exempt_layers": 2}}, base=server)
    assert st == 400 and "exempt_layers" in e["error"]["message"], e
    assert complete({**body, "dualpath": {"exempt_layers": 0}}, base=server)
    m = metrics(base)
    assert m["dualpath_exempt_blocks"] == 0


def test_exempt_layers_beyond_the_model_refused_at_start():
    r = subprocess.run([BIN, "--config", "", "--model", MODEL, "--listen", "127.0.0.1:0",
                        "--exempt-layers", "31"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "exempt_layers 31 exceeds the model's 30 layers" in r.stderr, r.stderr
