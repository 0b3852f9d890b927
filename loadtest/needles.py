#!/usr/bin/env python3
"""needles.py: several needles in real text, asked for through the daemon's
chat API under concurrent load, the question read before or after the text
was compacted. The HTTP counterpart of dp-eval's needle columns.

Each of SESSIONS conversations gets its own passage of a real text (the GPL
by default: prose, no sentence said twice) of about --tokens tokens, with
--needles facts "The special magic number for <word> is <7 digits>." at
spread depths, and asks for one of them (the depth asked rotates over the
sessions). Two ways, each as a chat app sends it, all sessions at once:

  aware     one message: the passage, then the question. The prompt's end
            (the question) scores what is kept.
  agnostic  the passage in a first message ("reply OK when you have read
            it"), the question in the next turn. Under load the second turn
            continues the first turn's parked compact cache, chosen before the
            question existed (the query-agnostic case: dualpath_turns_resumed
            says how many did).

An answer counts when it contains the asked number. Each configuration runs
in a daemon of its own, one after the other, on the same conversations.

usage: loadtest/needles.py [--bin B] [--model M] [--text FILE] [--sessions N]
       [--tokens N] [--needles N] [--kv-mib N] [--threads N]
       [--config NAME=FLAGS ...] [--out FILE]
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
KEYS = ["apple", "harbor", "violet", "copper", "lantern", "meadow", "falcon", "glacier",
        "orchid", "saddle", "walnut", "canyon", "pepper", "quartz", "ember", "thimble"]
INTRO = ("Read the following text carefully. Hidden in it are special magic numbers, each for "
         "a different word. Memorize them: I will ask you about them.\n\n")


def boundary(s, at):
    """The first sentence or line end at or after at (a needle never cuts one)."""
    m = re.compile(r"\. |\n").search(s, at)
    return m.end() if m else len(s)


def conversations(text, n, tokens, needles, seed):
    rng = random.Random(seed)
    chars = 4 * (tokens - 50 - 16 * needles)  # about 4 characters a token in English prose
    if chars >= len(text):
        raise SystemExit(f"needles.py: the text has {len(text)} characters, "
                         f"{chars} are needed for {tokens} tokens")
    out = []
    for i in range(n):
        off = (len(text) - chars) * i // max(n - 1, 1)
        passage = text[off:off + chars]
        keys = [KEYS[(i * needles + k) % len(KEYS)] for k in range(needles)]
        vals = [str(rng.randint(1000000, 9999999)) for _ in range(needles)]
        doc, prev = INTRO, 0
        for d in range(needles):  # depth d holds needle (d + i) % needles
            k = (d + i) % needles
            at = boundary(passage, len(passage) * (2 * d + 1) // (2 * needles))
            doc += passage[prev:at] + f" The special magic number for {keys[k]} is {vals[k]}."
            prev = at
        doc += passage[prev:]
        asked = i % needles
        q = f"What is the special magic number for {keys[asked]}? Answer with the number only."
        out.append({"doc": doc, "question": q, "value": vals[asked]})
    return out


def ask(d, c, mode, gen, barrier):
    if mode == "aware":
        barrier.wait()
        msgs = [{"role": "user", "content": c["doc"] + "\n\n" + c["question"]}]
    else:
        msgs = [{"role": "user", "content": c["doc"] + "\n\nReply OK when you have read it."}]
        barrier.wait()
        r = d.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 8, "temperature": 0})
        msgs += [{"role": "assistant", "content": r["choices"][0]["message"]["content"]},
                 {"role": "user", "content": c["question"]}]
        barrier.wait()  # every second turn arrives while the others run
    r = d.post("/v1/chat/completions", {"messages": msgs, "max_tokens": gen, "temperature": 0})
    ans = r["choices"][0]["message"]["content"]
    return c["value"] in ans, ans


def run_config(a, name, flags, convs, idx):
    d, _, flags = config_daemon(a, flags, f"/tmp/needles-{idx}.log")
    row = {"name": name, "flags": " ".join(flags)}
    try:
        for mode in ("aware", "agnostic"):
            m0 = d.metrics()
            t0 = time.time()
            barrier = threading.Barrier(len(convs))
            with concurrent.futures.ThreadPoolExecutor(len(convs)) as ex:
                res = list(ex.map(lambda c: ask(d, c, mode, a.gen, barrier), convs))
            m1 = d.metrics()
            row[mode] = sum(ok for ok, _ in res)
            row[mode + "_answers"] = [ans for _, ans in res]
            row[mode + "_s"] = time.time() - t0
            row[mode + "_resumed"] = (m1.get("dualpath_turns_resumed_total", 0) -
                                      m0.get("dualpath_turns_resumed_total", 0))
    finally:
        d.stop()
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/daemon/dualpathd"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--sessions", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--needles", type=int, default=4)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--kv-mib", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--config", action="append", default=[], metavar="NAME=FLAGS")
    ap.add_argument("--out")
    a = ap.parse_args()
    configs = [c.split("=", 1) for c in a.config] or [
        ("dualpath off", "--no-dualpath"), ("defaults", ""), ("keep 1.0", "--keep-ratio 1.0")]
    with open(a.text, encoding="utf-8", errors="replace") as f:
        text = f.read()
    convs = conversations(text, a.sessions, a.tokens, a.needles, seed=7)
    rows = []
    for i, (name, flags) in enumerate(configs):
        r = run_config(a, name, shlex.split(flags), convs, i)
        rows.append(r)
        print(f"{name:28s} aware {r['aware']:2d}/{a.sessions} ({r['aware_s']:.0f} s)  "
              f"agnostic {r['agnostic']:2d}/{a.sessions} ({r['agnostic_s']:.0f} s, "
              f"{r['agnostic_resumed']:.0f} turns resumed)", flush=True)
    lines = [f"# needles.py: {a.sessions} sessions at once, about {a.tokens}-token passages of "
             f"`{a.text}` with {a.needles} needles, answers up to {a.gen} tokens, greedy, "
             f"{a.kv_mib} MiB of KV, {a.threads} threads", "",
             "| configuration | flags | aware | agnostic (second turn) | turns resumed |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | `{r['flags'] or '(defaults)'}` | {r['aware']}/{a.sessions} | "
                     f"{r['agnostic']}/{a.sessions} | {r['agnostic_resumed']:.0f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
            for r in rows:
                for mode in ("aware", "agnostic"):
                    f.write(f"\n## {r['name']}, {mode}\n")
                    for c, ans in zip(convs, r[mode + "_answers"]):
                        f.write(f"- {c['value']}: {ans!r}\n")


if __name__ == "__main__":
    main()
