#!/usr/bin/env python3
"""early_switch.py: the early switch measured through the daemon, against the
switch at the prompt's end, on prompts with heavy repetition and on plain
text.

Three daemons run one after the other on the same model and settings:
dualpath off (the whole cache: the reference), the defaults (the switch at
the prompt's end) and --early-switch. Each answers every prompt greedily.
Every request runs alone, and while it runs the KV blocks in use are
polled, so that the peak of each request is what the daemon held, not an
estimate.

Workloads (generated, seeded):
  tickets  templated support tickets (the same sentence with other numbers,
           as help-desk queues and logs look), then a question about them;
  passkey  a 5-7 digit key stated once at one of 10 depths in repeated filler
           (the usual passkey test), then the question; an answer counts when
           it contains the key;
  text     consecutive passages of a plain text (default the GPL-3 that
           Debian ships), then a request to summarize; no repetition beyond
           the text's own.

Reported per workload and mode: requests switched early and the mean switch
point (dualpath_early_switch_tokens_total / dualpath_early_switches_total),
mean prompt tokens, mean peak KV bytes held while the request ran (blocks in
use x block bytes) and the KV bytes kept after its prompt
(usage.dualpath.kv_bytes), each relative to the whole cache's, greedy
answers identical to the whole cache's and their mean identical prefix,
passkeys given back.

Then the concurrency run: --conc long ticket prompts sent at once to each
of the three daemons at --conc-kv-mib of KV memory (where a prompt's
prefill blocks bind admission): peak and mean running requests (polled every
50 ms), preemptions, wall time.

Then the timing run (--time-prompts N, 0: none): what the early switch
costs in prefill time, where its signals are measured but a plain text
never switches, and where a repetitive prompt does. The defaults and
--early-switch run side by side (both daemons up, each request alone,
the two daemons taking turns prompt by prompt, the first of each pair
alternating), on N prompts of --time-words words of each workload, every
prompt new to both (nothing from a prefix cache), max_tokens 1: the time
to the end of the prompt. Reported: the median seconds of each, their
ratio, and the stability signals measured per prompt
(dualpath_early_signals_total).

usage: loadtest/early_switch.py [--bin B] [--model M] [--prompts N] [--gen N]
       [--words N] [--text FILE] [--kv-mib N] [--conc N] [--conc-words N]
       [--conc-kv-mib N] [--time-prompts N] [--time-words N] [--only-time]
       [--out FILE]
"""
import argparse
import os
import random
import sys
import threading
import time

from dp_daemon import Daemon

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def used_blocks(m):
    return m['dualpath_kv_blocks_used{pool="prefill"}'] + m.get('dualpath_kv_blocks_used{pool="decode"}', 0)


def run_one(d, body, block_bytes):
    """Answers body on d alone, polling the blocks in use: (reply, peak bytes)."""
    base = used_blocks(d.metrics())
    peak = [base]
    done = threading.Event()

    def poll():
        while not done.is_set():
            peak[0] = max(peak[0], used_blocks(d.metrics()))
            time.sleep(0.01)
    t = threading.Thread(target=poll)
    t.start()
    try:
        o = d.post("/v1/completions", body)
    finally:
        done.set()
        t.join()
    return o, (peak[0] - base) * block_bytes


# ---- workloads -------------------------------------------------------------

FILLER = ("The grass is green. The sky is blue. The sun is yellow. Here we go. "
          "There and back again. ")
PRODUCTS = ["printer", "laptop", "router", "phone", "monitor", "scanner"]
ISSUES = ["shows error E-{e}", "does not turn on", "restarts every {e} minutes",
          "is slow since the update", "lost its settings"]


def tickets(rng, words):
    out, i = [], 0
    while len(out) * 30 < words:
        out.append(f"Ticket {4000 + i}: customer {rng.randint(100, 999)} reports that the "
                   f"{rng.choice(PRODUCTS)} on floor {rng.randint(1, 6)} "
                   f"{rng.choice(ISSUES).format(e=rng.randint(10, 99))}. Status: "
                   f"{rng.choice(['open', 'pending', 'open'])}. Priority: "
                   f"{rng.choice(['normal', 'high', 'normal'])}.")
        i += 1
    floor = rng.randint(1, 6)
    return "\n".join(out) + f"\n\nThe tickets about floor {floor} are Ticket", None


def passkey(rng, words, depth):
    key = rng.randint(10000, 9999999)
    reps = max(words // 20, 10)
    at = depth * reps // 10
    parts = ["There is an important pass key hidden inside a lot of irrelevant text. "
             "Find it and memorize it. I will quiz you about the pass key.\n\n"]
    for r in range(reps + 1):
        if r == at:
            parts.append(f"The pass key is {key}. Remember it. {key} is the pass key. ")
        if r < reps:
            parts.append(FILLER)
    parts.append("\n\nWhat is the pass key? The pass key is")
    return "".join(parts), key


def text_prompt(passage):
    return passage + "\n\nSummarize the passage above in one sentence:", None


def identical_prefix(a, b):
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def timing(a):
    """The timing run (module docstring): a markdown table."""
    words = open(a.text, errors="replace").read().split()
    rng = random.Random(3)
    work = {"text": [], "tickets": []}
    for i in range(a.time_prompts):
        # Passages that start at different words: no two share a prefix.
        start = (i * 997) % max(len(words) - a.time_words, 1)
        work["text"].append(text_prompt(" ".join(words[start:start + a.time_words]))[0])
        work["tickets"].append(tickets(rng, a.time_words)[0])
    logdir = os.environ.get("TMPDIR", "/tmp")
    ds = {mode: Daemon(a.bin, a.model, ["--kv-memory", f"{a.kv_mib}MiB"] + extra,
                       os.path.join(logdir, f"early-switch-time-{mode}.log"))
          for mode, extra in (("end", []), ("early", ["--early-switch"]))}
    lines = [f"{a.time_prompts} prompts of each workload, each new to both daemons, "
             "max_tokens 1, the two daemons taking turns:", "",
             "| workload | prompt tokens | switch at the prompt's end s (median) | "
             "early switch s (median) | ratio | switched early | signals per prompt |",
             "|---|---|---|---|---|---|---|"]
    try:
        for w, prompts in work.items():
            secs = {"end": [], "early": []}
            m0 = ds["early"].metrics()
            ptok = 0
            for i, prompt in enumerate(prompts):
                order = ("end", "early") if i % 2 == 0 else ("early", "end")
                for mode in order:
                    t0 = time.time()
                    o = ds[mode].post("/v1/completions", {"prompt": prompt, "max_tokens": 1,
                                                          "temperature": 0})
                    secs[mode].append(time.time() - t0)
                ptok += o["usage"]["prompt_tokens"]
            m1 = ds["early"].metrics()
            sig = m1.get("dualpath_early_signals_total", 0) - m0.get("dualpath_early_signals_total", 0)
            sw = m1.get("dualpath_early_switches_total", 0) - m0.get("dualpath_early_switches_total", 0)
            med = {k: sorted(v)[len(v) // 2] for k, v in secs.items()}
            n = len(prompts)
            lines.append("| %s | %.0f | %.3f | %.3f | %.3f | %d/%d | %.1f |" % (
                w, ptok / n, med["end"], med["early"], med["early"] / med["end"], sw, n, sig / n))
    finally:
        for d in ds.values():
            d.stop()
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/daemon/dualpathd"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--prompts", type=int, default=10, help="prompts per workload")
    ap.add_argument("--gen", type=int, default=48, help="greedy tokens per answer")
    ap.add_argument("--words", type=int, default=900, help="about how many words per prompt")
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--kv-mib", type=int, default=256)
    ap.add_argument("--out", default=None, help="also write the markdown table here")
    ap.add_argument("--conc", type=int, default=8,
                    help="the concurrency run: this many long ticket prompts at once")
    ap.add_argument("--conc-words", type=int, default=1200)
    ap.add_argument("--conc-kv-mib", type=int, default=96)
    ap.add_argument("--time-prompts", type=int, default=12)
    ap.add_argument("--time-words", type=int, default=2000)
    ap.add_argument("--only-time", action="store_true", help="the timing run alone")
    a = ap.parse_args()
    if a.only_time:
        table = timing(a)
        print(table)
        if a.out:
            with open(a.out, "w") as f:
                f.write(table + "\n")
        return

    rng = random.Random(1)
    words = open(a.text, errors="replace").read().split()
    work = {"tickets": [], "passkey": [], "text": []}
    for i in range(a.prompts):
        work["tickets"].append(tickets(rng, a.words))
        work["passkey"].append(passkey(rng, a.words, i % 10))
        start = (i * a.words) % max(len(words) - a.words, 1)
        work["text"].append(text_prompt(" ".join(words[start:start + a.words])))

    common = ["--kv-memory", f"{a.kv_mib}MiB"]
    answers = {}  # (mode, workload) -> list of (text-ish tokens, usage, peak, key)
    switched = {}
    logdir = os.environ.get("TMPDIR", "/tmp")
    # Three daemons, so that no mode takes another's prompt from its prefix
    # cache: each computes every prompt itself.
    for mode, extra in (("whole", ["--no-dualpath"]), ("end", []), ("early", ["--early-switch"])):
        d = Daemon(a.bin, a.model, common + extra, os.path.join(logdir, f"early-switch-{mode}.log"))
        # One arena block's bytes: the KV memory over its blocks.
        m = d.metrics()
        block_bytes = a.kv_mib * 1024 * 1024 / m['dualpath_kv_blocks_capacity{pool="prefill"}']
        for w, items in work.items():
            m0 = d.metrics()
            rows = []
            for prompt, key in items:
                body = {"prompt": prompt, "max_tokens": a.gen, "temperature": 0, "logprobs": 0}
                o, peak = run_one(d, body, block_bytes)
                toks = o["choices"][0]["logprobs"]["tokens"]
                rows.append((toks, o["usage"], peak, key, o["choices"][0]["text"]))
            answers[(mode, w)] = rows
            m1 = d.metrics()
            n = m1.get("dualpath_early_switches_total", 0) - m0.get("dualpath_early_switches_total", 0)
            at = (m1.get("dualpath_early_switch_tokens_total", 0)
                  - m0.get("dualpath_early_switch_tokens_total", 0))
            fb = sum(v - m0.get(k, 0) for k, v in m1.items()
                     if k.startswith("dualpath_scorer_fallbacks_total{"))
            switched[(mode, w)] = (n, at / n if n else 0, fb)
        d.stop()

    # The concurrency run: long ticket prompts all at once in a small KV
    # memory, where a prompt's prefill blocks bind admission.
    crng = random.Random(2)
    conc_prompts = [tickets(crng, a.conc_words)[0] for _ in range(a.conc)]
    conc = {}
    for mode, extra in (("whole", ["--no-dualpath"]), ("end", []), ("early", ["--early-switch"])):
        d = Daemon(a.bin, a.model, ["--kv-memory", f"{a.conc_kv_mib}MiB"] + extra,
                   os.path.join(logdir, f"early-switch-conc-{mode}.log"))
        m0 = d.metrics()
        samples, done = [], threading.Event()

        def poll():
            while not done.is_set():
                samples.append(d.metrics()["dualpath_requests_running"])
                time.sleep(0.05)
        t = threading.Thread(target=poll)
        t.start()
        t0 = time.time()
        outs = [None] * a.conc

        def one(i):
            outs[i] = d.post("/v1/completions", {"prompt": conc_prompts[i], "max_tokens": 16,
                                                 "temperature": 0, "ignore_eos": True})
        ths = [threading.Thread(target=one, args=(i,)) for i in range(a.conc)]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        wall = time.time() - t0
        done.set()
        t.join()
        m1 = d.metrics()
        d.stop()
        if any(o is None for o in outs):
            sys.exit(f"early_switch: a request of the concurrency run failed ({mode})")
        samples = samples or [0]
        conc[mode] = (max(samples), sum(samples) / len(samples), wall,
                      sum(o["usage"]["prompt_tokens"] for o in outs) / a.conc,
                      m1.get("dualpath_early_switches_total", 0) - m0.get("dualpath_early_switches_total", 0),
                      m1.get("dualpath_preemptions_total", 0) - m0.get("dualpath_preemptions_total", 0))

    lines = ["| workload | mode | switched early | mean switch point | prompt tokens | "
             "peak KV bytes | KV bytes kept | identical answers | identical prefix | passkeys |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for w in work:
        whole = answers[("whole", w)]
        wpeak = sum(r[2] for r in whole) / len(whole)
        end = answers[("end", w)]
        full = [(r[1].get("dualpath") or {}).get("kv_bytes_full") for r in end]
        wbytes = sum(full) / len(full) if all(f for f in full) else None
        for mode in ("whole", "end", "early"):
            rows = answers[(mode, w)]
            n = len(rows)
            ptok = sum(r[1]["prompt_tokens"] for r in rows) / n
            peak = sum(r[2] for r in rows) / n
            kept = [(r[1].get("dualpath") or {}).get("kv_bytes") for r in rows]
            kept = sum(kept) / n if all(k is not None for k in kept) else None
            same = sum(r[0] == whole[i][0] for i, r in enumerate(rows))
            pre = sum(identical_prefix(r[0], whole[i][0]) for i, r in enumerate(rows)) / n
            keys = sum(str(r[3]) in r[4] for r in rows) if rows[0][3] else None
            sw = switched.get((mode, w))
            lines.append("| %s | %s | %s | %s | %.0f | %.3f | %s | %d/%d | %.1f | %s |" % (
                w, {"whole": "dualpath off", "end": "switch at the prompt's end",
                    "early": "early switch"}[mode],
                f"{sw[0]:.0f}/{n}" if sw else "-", f"{sw[1]:.0f}" if sw and sw[0] else "-",
                ptok, peak / wpeak if wpeak else 0,
                f"{kept / wbytes:.3f}" if kept is not None and wbytes else "-",
                same, n, pre, f"{keys}/{n}" if keys is not None else "-"))
        fbs = [switched[(m, w)][2] for m in ("end", "early")]
        if any(fbs):
            lines.append(f"| {w} | scorer fallbacks | {fbs} | | | | | | | |")
    lines += ["", f"{a.conc} ticket prompts at once, {a.conc_kv_mib} MiB of KV memory, 16 tokens "
              "each (ignore_eos):", "",
              "| mode | prompt tokens | switched early | peak running | mean running | "
              "preemptions | wall s |", "|---|---|---|---|---|---|---|"]
    for mode in ("whole", "end", "early"):
        pk, mean, wall, ptok, sw, pre = conc[mode]
        lines.append("| %s | %.0f | %d/%d | %d | %.1f | %d | %.1f |" % (
            {"whole": "dualpath off", "end": "switch at the prompt's end",
             "early": "early switch"}[mode], ptok, sw, a.conc, pk, mean, pre, wall))
    if a.time_prompts > 0:
        lines += ["", timing(a)]
    table = "\n".join(lines)
    print(table)
    if a.out:
        with open(a.out, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
