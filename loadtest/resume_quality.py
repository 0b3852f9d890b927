#!/usr/bin/env python3
"""resume_quality.py: what parked turns cost in answers, through the daemon.

Four daemons run one after the other on the same model: dualpath off (the
whole cache: the reference), the defaults (one request at a time leaves the
server idle, where a later turn runs whole), --compress-turns always (a
later turn continues its previous turn's parked compact cache, as under
load) and --no-resume-turns (a later turn computes its history again from
its tokens, whole while memory has room).
Each answers the same conversations greedily, turn after turn, every turn's
history being the reference's own earlier replies (so that each turn is
compared on the same messages). A daemon's parked cache then holds its own
reply, which may differ from the reference's: the turn continues the cache
as far as the tokens agree (the previous prompt at least) and computes the
rest.

Reported per daemon, over the later turns (the first turn of a conversation
is compressed the same way by both dualpath daemons): replies identical to
the reference's, the mean identical prefix in words, prompt tokens the
daemon computed (dualpath_engine_prefill_tokens_total) and tokens resumed
(usage.dualpath.tokens_resumed).

usage: loadtest/resume_quality.py [--bin B] [--model M] [--conversations N]
       [--turns N] [--gen N] [--out FILE]
"""
import argparse
import os
import random

from dp_daemon import Daemon

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))

TOPICS = ["a lighthouse keeper", "a baker in a small town", "a robot that learns to paint",
          "a sailor lost at sea", "a cat that runs a library", "a girl who builds a kite",
          "an old clock maker", "a fox and a crow", "a city under the sea",
          "a train that never stops", "a gardener and a storm", "two friends on a mountain"]
FOLLOW = ["Who is the main character?", "What happens next?", "Where does the story take place?",
          "How does it end?", "Give the story a title.", "What did they learn?",
          "Describe the weather in the story.", "Which moment is the saddest?",
          "Tell it again in one sentence.", "What would you change?"]


def conversations(n, turns, seed=7):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        qs = [f"Tell me a short story about {TOPICS[i % len(TOPICS)]}."]
        qs += rng.sample(FOLLOW, turns - 1)
        out.append(qs)
    return out


def same_prefix_words(a, b):
    wa, wb = a.split(), b.split()
    k = 0
    while k < min(len(wa), len(wb)) and wa[k] == wb[k]:
        k += 1
    return k


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/daemon/dualpathd"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--gen", type=int, default=48)
    ap.add_argument("--out")
    a = ap.parse_args()
    convs = conversations(a.conversations, a.turns)
    # One request at a time leaves the server idle, where the defaults run a
    # later turn whole (compress_turns = auto): the parked path is measured
    # with --compress-turns always, which continues it as a busy server does.
    modes = [("dualpath off", ["--no-dualpath"]),
             ("defaults, idle (later turns run whole)", []),
             ("parked turns (--compress-turns always)", ["--compress-turns", "always"]),
             ("--no-resume-turns", ["--no-resume-turns"])]
    replies = {}
    stats = {}
    for name, extra in modes:
        d = Daemon(a.bin, a.model, extra, f"/tmp/resume-quality-{len(replies)}.log")
        try:
            p0 = d.metric("dualpath_engine_prefill_tokens_total")
            got, resumed, later_computed = [], 0, 0
            for ci, qs in enumerate(convs):
                msgs, row = [], []
                for t, q in enumerate(qs):
                    msgs.append({"role": "user", "content": q})
                    m0 = d.metric("dualpath_engine_prefill_tokens_total")
                    o = d.post("/v1/chat/completions", {"messages": msgs, "max_tokens": a.gen,
                                                        "temperature": 0})
                    m1 = d.metric("dualpath_engine_prefill_tokens_total")
                    text = o["choices"][0]["message"]["content"]
                    row.append(text)
                    if t > 0:
                        resumed += o["usage"].get("dualpath", {}).get("tokens_resumed", 0)
                        later_computed += m1 - m0
                    # The history is the reference's replies (the first mode's).
                    ref = replies["dualpath off"][ci][t] if replies else text
                    msgs.append({"role": "assistant", "content": ref})
                got.append(row)
            replies[name] = got
            stats[name] = (d.metric("dualpath_engine_prefill_tokens_total") - p0, later_computed,
                           resumed)
        finally:
            d.stop()
    ref = replies["dualpath off"]
    lines = [f"{a.conversations} conversations of {a.turns} turns, replies of at most {a.gen} "
             "tokens, greedy; each turn's history is dualpath off's replies.", "",
             "| daemon | later turns identical to dualpath off | mean identical prefix (words) "
             "| prompt tokens computed (later turns) | tokens resumed |", "|---|---|---|---|---|"]
    for name, _ in modes:
        same = pref = n = 0
        for ci in range(len(convs)):
            for t in range(1, a.turns):
                x, r = replies[name][ci][t], ref[ci][t]
                same += x == r
                pref += same_prefix_words(x, r)
                n += 1
        total, later, res = stats[name]
        lines.append(f"| {name} | {same} / {n} | {pref / n:.1f} | {int(later)} | {res} |")
    out = "\n".join(lines)
    print(out)
    if a.out:
        with open(a.out, "w") as f:
            f.write(out + "\n")


if __name__ == "__main__":
    main()
