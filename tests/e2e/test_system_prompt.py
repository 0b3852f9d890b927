"""A chat's system prompt kept whole on the decode path (keep_system_prompt,
on by default): its whole blocks stay where the prefill path wrote them, so
requests that share a system prompt share those blocks while they decode, as
they do with dualpath off; only the rest of each prompt is compressed.
/metrics counts the tokens so kept (dualpath_tokens_in_place_total), the
per-request "dualpath" object turns it off (keep_system) or names a prefix of
any prompt (keep_prefix), and sharing never changes an output."""
import json

import pytest

from conftest import metrics, parallel, request

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
def dual(server):
    if 'dualpath_kv_blocks_capacity{pool="decode"}' not in metrics(server):
        pytest.skip("the shared daemon runs without dualpath")
    return server


def chat(question, system=SYSTEM, **extra):
    msgs = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": question}]
    st, _, raw = request("POST", "/v1/chat/completions",
                         {"messages": msgs, "temperature": 0, "max_tokens": 24, **extra})
    o = json.loads(raw)
    assert st == 200, o
    return o


def in_place(base):
    return metrics(base)["dualpath_tokens_in_place_total"]


def test_system_prompt_kept_in_place(dual):
    before = in_place(dual)
    o = chat(NOTICE + QUESTIONS[4])
    got = in_place(dual) - before
    u = o["usage"]["dualpath"]
    # Whole blocks of 16 tokens; the system prompt is about 130 tokens.
    assert got > 0 and got % 16 == 0, got
    assert u["tokens_evicted"] > 0 and u["tokens_kept"] > got
    # Without it the whole prompt is compressed: fewer kept, none in place.
    before = in_place(dual)
    off = chat(NOTICE + QUESTIONS[4], dualpath={"keep_system": False})
    assert in_place(dual) == before
    assert off["usage"]["dualpath"]["tokens_kept"] < u["tokens_kept"]
    assert (off["usage"]["dualpath"]["tokens_kept"] + off["usage"]["dualpath"]["tokens_evicted"] ==
            u["tokens_kept"] + u["tokens_evicted"])


def test_keep_prefix_on_completions(dual):
    prompt = SYSTEM + "\n\nQuestion: " + QUESTIONS[1] + "\nAnswer:"
    for asked, want in ((0, 0), (40, 32), (64, 64)):
        before = in_place(dual)
        st, _, raw = request("POST", "/v1/completions", {
            "prompt": prompt, "max_tokens": 4, "temperature": 0, "dualpath": {"keep_prefix": asked}})
        assert st == 200, raw
        assert in_place(dual) - before == want, asked
    # An explicit prefix wins over keep_system on chat.
    before = in_place(dual)
    chat(QUESTIONS[1], dualpath={"keep_prefix": 16, "keep_system": True})
    assert in_place(dual) - before == 16


def test_no_system_prompt_nothing_in_place(dual):
    before = in_place(dual)
    chat(SYSTEM + " " + QUESTIONS[2], system=None)
    assert in_place(dual) == before


def test_sharing_never_changes_output(dual):
    """Each question alone, then all eight at once (their system prompt's
    blocks shared by every one of them): the same greedy answers."""
    alone = [chat(q)["choices"][0]["message"]["content"] for q in QUESTIONS]
    together = parallel(lambda i: chat(QUESTIONS[i])["choices"][0]["message"]["content"],
                        len(QUESTIONS))
    assert together == alone
