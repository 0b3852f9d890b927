#!/usr/bin/env python3
# grammar_cost.py: what constrained decoding costs the daemon per step, read
# from its own counters: 32 concurrent JSON-schema requests, then the same
# prompts unconstrained, against one dualpathd.
"""The per-step cost of grammar masks at N concurrent constrained sequences.

Starts dualpathd (its defaults), sends N concurrent chat requests whose
replies are held to JSON schemas (tests/e2e/schemas.json, cycled: each
schema's grammar is compiled per request, its masks cached per state and
shared by requests of the same schema), then the same requests without a
schema, and reads /metrics around each run: steps, engine busy time, masks
computed and cached, and the time spent masking
(dualpath_grammar_seconds_total), and the tokens taken without a mask (drawn
from the unmasked row and allowed by the grammar). Prints the masking time
per step and per mask, its share of the step time, and each run's output
tok/s.

Usage: ~/.cache/dualpath/venv/bin/python loadtest/grammar_cost.py
           [--bin build/daemon/dualpathd] [--concurrency 32] [--max-tokens 96] [--rounds 2]
Not a test: timings vary run to run; read the ratios.
"""
import argparse
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def post(base, path, body, timeout=900):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def metrics(base):
    out = {}
    with urllib.request.urlopen(base + "/metrics", timeout=60) as r:
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
    return out


def run(base, bodies, conc):
    m0 = metrics(base)
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(conc) as ex:
        res = list(ex.map(lambda b: post(base, "/v1/chat/completions", b), bodies))
    wall = time.time() - t0
    m1 = metrics(base)
    d = {k: m1.get(k, 0) - m0.get(k, 0) for k in m1}
    toks = sum(r["usage"]["completion_tokens"] for r in res)
    return res, d, wall, toks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "daemon", "dualpathd"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    schemas = json.load(open(os.path.join(ROOT, "tests", "e2e", "schemas.json")))
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    base = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile(prefix="grammar-cost-", suffix=".log", delete=False)
    proc = subprocess.Popen([a.bin, "--config", "", "--model", a.model, "--listen", f"127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(base + "/health", timeout=2)
                break
            except OSError:
                if proc.poll() is not None:
                    sys.exit(f"dualpathd exited; see {log.name}")
                time.sleep(0.2)
        n = a.concurrency
        rows = []
        for rnd in range(a.rounds):
            picks = [schemas[(rnd * n + i) % len(schemas)] for i in range(n)]
            msgs = [[{"role": "user", "content": f"Give an example {p['name'].replace('_', ' ')} as JSON."}]
                    for p in picks]
            common = {"max_tokens": a.max_tokens, "temperature": 0.7, "seed": 7}
            for kind in ("constrained", "free"):
                bodies = []
                for p, m in zip(picks, msgs):
                    b = {"messages": m, **common}
                    if kind == "constrained":
                        b["response_format"] = {"type": "json_schema",
                                                "json_schema": {"name": p["name"], "schema": p["schema"]}}
                    bodies.append(b)
                _, d, wall, toks = run(base, bodies, n)
                steps = d.get("dualpath_engine_steps_total", 0)
                busy = d.get("dualpath_engine_busy_seconds_total", 0)
                gs = d.get("dualpath_grammar_seconds_total", 0)
                mc = d.get('dualpath_grammar_masks_total{source="computed"}', 0)
                mh = d.get('dualpath_grammar_masks_total{source="cached"}', 0)
                sk = d.get('dualpath_grammar_masks_total{source="skipped"}', 0)
                rows.append((rnd, kind, steps, busy, gs, mc, mh, sk, toks, wall))
        print(f"dualpathd {a.bin}, {n} concurrent chat requests, max_tokens {a.max_tokens}, "
              f"temperature 0.7; constrained: JSON schemas of tests/e2e/schemas.json, cycled\n")
        print("| round | requests | steps | step ms (mean) | masking ms per step | masking share of step time "
              "| masks computed | masks cached | tokens without a mask | us per mask | output tokens | output tok/s |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for rnd, kind, steps, busy, gs, mc, mh, sk, toks, wall in rows:
            masks = mc + mh
            print(f"| {rnd + 1} | {kind} | {steps:.0f} | {1e3 * busy / max(steps, 1):.1f} "
                  f"| {1e3 * gs / max(steps, 1):.2f} | {100 * gs / busy if busy else 0:.1f} % "
                  f"| {mc:.0f} | {mh:.0f} | {sk:.0f} | {1e6 * gs / masks if masks else 0:.0f} | {toks} "
                  f"| {toks / wall:.1f} |")
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    print(f"\ndaemon log: {log.name}")


if __name__ == "__main__":
    main()
