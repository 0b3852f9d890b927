"""A chat's system prompt kept whole on the decode path (keep_system_prompt,
on by default). With the decode path in the prefill path's type (f16) its
whole blocks stay where the prefill path wrote them, so requests that share
a system prompt share those blocks while they decode, as they do with
dualpath off; with a q8_0 decode path the first request's copy of it (whole
decode blocks of 30 tokens) is taken by the next ones while it lives; with
kivi4 (the CPU's default) each request holds the prefill blocks by reference
at its migration and seals its own groups as it grows. Only the rest of each
prompt is compressed.
/metrics counts the tokens so kept (dualpath_tokens_in_place_total), the
per-request "dualpath" object turns it off (keep_system) or names a prefix of
any prompt (keep_prefix), and sharing never changes an output."""
import json

import pytest

from conftest import Daemon, hold_stream, metrics, parallel, request

SYSTEM = ("You are the help desk assistant of the Harbour Street public library. Answer in one or "
          "two short sentences, politely, and only about the library: its opening hours (nine to "
          "six on weekdays, ten to four on Saturdays, closed on Sundays), borrowing (up to twelve "
          "items for three weeks, renewable twice online), fines (none for children's books), the "
          "reading rooms on the first floor, the makerspace in the basement, and the events "
          "calendar posted by the entrance. If a question is about something else, say that you "
          "can only help with the library.")
NOTICE = ("I found this notice by the entrance and I am not sure what it means for me: the "
          "library will repaint the reading rooms on the first floor over two weeks next month, "
          "one room at a time, and while a room is closed its shelves of periodicals move to the "
          "makerspace in the basement, where the long tables will be kept free for readers; the "
          "events calendar lists the dates, and loans that fall due while a room is closed may be "
          "renewed a third time at the desk. ")
QUESTIONS = ["When do you open on Saturday?", "How many books can I borrow?",
             "Is there a fine for a late picture book?", "Where is the makerspace?",
             "Can I renew a loan online?", "Are you open on Sunday?",
             "Where are the reading rooms?", "Where can I see upcoming events?"]


@pytest.fixture(scope="module")
def dual():
    """A daemon whose decode path is f16, as its prefill path: a decode table
    holds the prefill blocks of a system prompt by reference. It evicts (keep
    0.9; the default keeps every token), so that what is kept whole shows."""
    d = Daemon(extra=["--decode-kv-type", "same", "--keep-ratio", "0.9"])
    yield d.url
    assert d.stop() == 0


def chat(question, system=SYSTEM, base=None, **extra):
    msgs = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": question}]
    st, _, raw = request("POST", "/v1/chat/completions",
                         {"messages": msgs, "temperature": 0, "max_tokens": 24, **extra},
                         base=base)
    o = json.loads(raw)
    assert st == 200, o
    return o


def in_place(base):
    return metrics(base)["dualpath_tokens_in_place_total"]


def test_system_prompt_kept_in_place(dual):
    before = in_place(dual)
    o = chat(NOTICE + QUESTIONS[4], base=dual)
    got = in_place(dual) - before
    u = o["usage"]["dualpath"]
    # Whole blocks of 16 tokens; the system prompt is about 130 tokens.
    assert got > 0 and got % 16 == 0, got
    assert u["tokens_evicted"] > 0 and u["tokens_kept"] > got
    # Without it the whole prompt is compressed: fewer kept, none in place.
    before = in_place(dual)
    off = chat(NOTICE + QUESTIONS[4], dualpath={"keep_system": False}, base=dual)
    assert in_place(dual) == before
    assert off["usage"]["dualpath"]["tokens_kept"] < u["tokens_kept"]
    assert (off["usage"]["dualpath"]["tokens_kept"] + off["usage"]["dualpath"]["tokens_evicted"] ==
            u["tokens_kept"] + u["tokens_evicted"])


def test_keep_prefix_on_completions(dual):
    prompt = SYSTEM + "\n\nQuestion: " + QUESTIONS[1] + "\nAnswer:"
    for asked, want in ((0, 0), (40, 32), (64, 64)):
        before = in_place(dual)
        st, _, raw = request("POST", "/v1/completions", base=dual, body={
            "prompt": prompt, "max_tokens": 4, "temperature": 0, "dualpath": {"keep_prefix": asked}})
        assert st == 200, raw
        assert in_place(dual) - before == want, asked
    # An explicit prefix wins over keep_system on chat.
    before = in_place(dual)
    chat(QUESTIONS[1], dualpath={"keep_prefix": 16, "keep_system": True}, base=dual)
    assert in_place(dual) - before == 16


def test_no_system_prompt_nothing_in_place(dual):
    before = in_place(dual)
    chat(SYSTEM + " " + QUESTIONS[2], system=None, base=dual)
    assert in_place(dual) == before


@pytest.mark.heavy
def test_sharing_never_changes_output(dual):
    """Each question alone, then all eight at once (their system prompt's
    blocks shared by every one of them): the same greedy answers."""
    alone = [chat(q, base=dual)["choices"][0]["message"]["content"] for q in QUESTIONS]
    together = parallel(lambda i: chat(QUESTIONS[i], base=dual)["choices"][0]["message"]["content"],
                        len(QUESTIONS))
    assert together == alone


def _decode_block_tokens(base):
    m = metrics(base)
    if 'dualpath_kv_blocks_capacity{pool="decode"}' not in m:
        pytest.skip("the shared daemon runs without dualpath")
    return int(m.get("dualpath_kv_block_tokens{pool=\"decode\"}", 0))


def test_system_prompt_shared_in_decode_blocks(q8_server):
    """A q8_0 decode path cannot hold the prefill path's f16 blocks: the
    first request copies the system prompt's whole decode blocks, and a
    request that starts with the same system prompt while the first still
    decodes takes those blocks instead of copying. The first runs until the
    second is done (it is cancelled then), so the order is fixed by events,
    not by speed."""
    server = q8_server
    dbt = _decode_block_tokens(server)
    assert dbt == 30
    # At its first token it has migrated and named its copy.
    holder = hold_stream("/v1/chat/completions",
                         {"messages": [{"role": "system", "content": SYSTEM},
                                       {"role": "user", "content": QUESTIONS[0]}],
                          "temperature": 0, "max_tokens": 4000, "ignore_eos": True}, base=server)
    before = in_place(server)
    o = chat(QUESTIONS[3], base=server)
    got = in_place(server) - before
    holder.close()
    assert got > 0 and got % dbt == 0, (got, dbt)
    assert o["usage"]["dualpath"]["tokens_kept"] > got
    # Sharing never changes an output: the same question alone.
    assert chat(QUESTIONS[3], base=server)["choices"][0]["message"]["content"] == \
        o["choices"][0]["message"]["content"]
