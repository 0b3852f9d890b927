#!/usr/bin/env python3
"""multiturn_recall.py: does the daemon remember what a user said turns ago,
under concurrent load? Through the daemon's HTTP API, as a chat app sends it.

SESSIONS conversations run at once (one thread each). In its first message
each user tells the assistant a fact of its own (a number, a name, a city);
the next TURNS - 2 messages talk about other things (real, varied questions);
the last asks for the fact back. Replies are greedy, up to --gen tokens, and
each turn's history is the conversation's own earlier replies (as a chat app
sends it). A session recalls when its last reply contains its fact.

With several sessions at once the server is busy, so a later turn continues
its parked compact cache (the path the defaults take under load); the
daemon's counters say how many turns did (dualpath_turns_resumed_total) and
how many tokens they did not compute again. Each configuration runs in a
daemon of its own, one after the other, on the same conversations.

usage: loadtest/multiturn_recall.py [--bin B] [--model M] [--sessions N]
       [--turns N] [--gen N] [--kv-mib N] [--rounds N]
       [--config NAME=FLAGS ...] [--out FILE]
  --config "keep 1.0=--keep-ratio 1.0" adds a row (repeatable; FLAGS may
  start with @BINARY: another dualpathd, for an A/B of two builds); without
  one: dualpath off, the defaults, keep 1.0, --no-resume-turns.
"""
import argparse
import concurrent.futures
import os
import random
import re
import shlex
import threading
import time

from dp_daemon import config_daemon

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))

# What a user tells: a kind of fact, how it is said, how it is asked for.
FACTS = [
    ("locker number", lambda r: str(r.randint(1000, 9999))),
    ("membership code", lambda r: str(r.randint(10000, 99999))),
    ("pet's name", lambda r: r.choice(["Biscuit", "Pepper", "Marlowe", "Juniper", "Tofu",
                                       "Waffles", "Clementine", "Ziggy", "Pickles", "Nugget"])),
    ("home town", lambda r: r.choice(["Tromso", "Valparaiso", "Nagasaki", "Timbuktu", "Reykjavik",
                                      "Cusco", "Zanzibar", "Bruges", "Galway", "Hobart"])),
]
# Other things to talk about in between: questions on unrelated subjects,
# so that the turns in between do not ask about the fact.
OTHER = [
    "How do bees make honey?",
    "What is the difference between weather and climate?",
    "Give me three tips for a job interview.",
    "Why is the sky blue?",
    "How does a bicycle stay upright?",
    "What should I pack for a weekend of hiking?",
    "Explain what a prime number is.",
    "Suggest a simple recipe for dinner with rice and beans.",
    "How do airplanes fly?",
    "What are some good habits for better sleep?",
    "Why do leaves change color in autumn?",
    "How does a refrigerator keep food cold?",
    "What is photosynthesis?",
    "Give me two ideas for a birthday present for my sister.",
    "How do I start learning to play the guitar?",
    "What causes earthquakes?",
]


def sessions(n, turns, seed):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind, make = FACTS[i % len(FACTS)]
        value = make(rng)
        msgs = [f"Please remember this: my {kind} is {value}. I will ask you about it later."]
        msgs += rng.sample(OTHER, turns - 2)
        msgs.append(f"What is my {kind}? Answer with just the {kind}.")
        out.append({"kind": kind, "value": value, "turns": msgs})
    return out


def run_session(d, s, gen, barrier):
    history = []
    last = ""
    for t, user in enumerate(s["turns"]):
        history.append({"role": "user", "content": user})
        # Every session sends turn t at about the same time: the burst a
        # chat app's users make, and the load under which turns park.
        barrier.wait()
        r = d.post("/v1/chat/completions", {"messages": history, "max_tokens": gen,
                                            "temperature": 0})
        last = r["choices"][0]["message"]["content"]
        history.append({"role": "assistant", "content": last})
    ok = re.search(r"\b" + re.escape(s["value"]) + r"\b", last, re.I) is not None
    return ok, last


def run_config(a, name, flags, convs, idx):
    d, binary, flags = config_daemon(a, flags, f"/tmp/multiturn-recall-{idx}.log")
    try:
        m0 = d.metrics()
        t0 = time.time()
        barrier = threading.Barrier(len(convs))
        with concurrent.futures.ThreadPoolExecutor(len(convs)) as ex:
            res = list(ex.map(lambda s: run_session(d, s, a.gen, barrier), convs))
        dt = time.time() - t0
        m1 = d.metrics()
    finally:
        d.stop()

    def delta(k):
        return m1.get(k, 0.0) - m0.get(k, 0.0)
    shown = " ".join(flags) if binary == a.bin else " ".join(["@" + binary] + flags)
    return {"name": name, "flags": shown, "recalled": sum(ok for ok, _ in res),
            "n": len(res), "seconds": dt, "answers": [last for _, last in res],
            "resumed": delta("dualpath_turns_resumed_total"),
            "resumed_tokens": delta("dualpath_resumed_tokens_total"),
            "prefill": delta("dualpath_engine_prefill_tokens_total")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/daemon/dualpathd"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--kv-mib", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1, help="other conversations each round (seed)")
    ap.add_argument("--config", action="append", default=[], metavar="NAME=FLAGS")
    ap.add_argument("--out")
    a = ap.parse_args()
    configs = [c.split("=", 1) for c in a.config] or [
        ("dualpath off", "--no-dualpath"), ("defaults", ""), ("keep 1.0", "--keep-ratio 1.0"),
        ("--no-resume-turns", "--no-resume-turns")]
    rows = []
    for rnd in range(a.rounds):
        convs = sessions(a.sessions, a.turns, seed=11 + rnd)
        for i, (name, flags) in enumerate(configs):
            r = run_config(a, name, shlex.split(flags), convs, i)
            r["round"] = rnd
            rows.append(r)
            print(f"round {rnd} {name:28s} recalled {r['recalled']:2d}/{r['n']}  "
                  f"{r['seconds']:6.1f} s  turns resumed {r['resumed']:.0f} "
                  f"({r['resumed_tokens']:.0f} tokens not computed again), "
                  f"prompt tokens computed {r['prefill']:.0f}", flush=True)
    lines = [f"# multiturn_recall.py: {a.sessions} sessions at once, {a.turns} turns, "
             f"replies up to {a.gen} tokens, greedy, {a.kv_mib} MiB of KV, {a.threads} threads, "
             f"{a.rounds} round(s)", "",
             "| configuration | flags | recalled | s | turns resumed | tokens resumed |",
             "|---|---|---|---|---|---|"]
    for name, _ in configs:
        rs = [r for r in rows if r["name"] == name]
        rec = sum(r["recalled"] for r in rs)
        n = sum(r["n"] for r in rs)
        lines.append(f"| {name} | `{rs[0]['flags'] or '(defaults)'}` | {rec}/{n} | "
                     f"{sum(r['seconds'] for r in rs):.1f} | {sum(r['resumed'] for r in rs):.0f} | "
                     f"{sum(r['resumed_tokens'] for r in rs):.0f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
            for r in rows:
                f.write(f"\n## round {r['round']} {r['name']}\n")
                for s, ans in zip(sessions(a.sessions, a.turns, 11 + r["round"]), r["answers"]):
                    f.write(f"- {s['kind']} {s['value']}: {ans!r}\n")


if __name__ == "__main__":
    main()
