#!/usr/bin/env python3
"""sliding_window.py: what keeping a model's sliding-window layers at their
window buys (kvcache/swa.h), through the daemon over HTTP, one
configuration after the other on the same machine and memory.

Per configuration (a label and dualpathd flags; the first is the
reference), two runs:
  - agreement: N windows of real text (--text), each answered greedily
    with --gen tokens, compared with the reference's answers (identical
    answers, and the mean length of the common prefix);
  - load: dp-loadgen's corpus workload (--input-len words a prompt,
    --output-len tokens each, ignore_eos, --concurrency at once), while
    /metrics is read every 100 ms: mean and peak sequences running,
    output tok/s, requests completed and failed, the sliding pool's
    blocks in use at most, the daemon's peak resident memory (VmHWM).

Usage (Gemma 3 270M, 64 MiB of KV, 2 threads):
  loadtest/sliding_window.py --bin build/daemon/dualpathd \\
      --loadgen build/loadtest/dp-loadgen --model GEMMA.gguf --kv-mib 64 \\
      --config "apart:" --config "swa_full:--swa-full"
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dp_daemon import config_daemon  # noqa: E402


def words_windows(path, n, length, seed=7):
    """n windows of `length` words from the text, spread over it."""
    with open(path, encoding="utf-8", errors="replace") as f:
        w = f.read().split()
    if len(w) < length + n:
        sys.exit(f"sliding_window.py: {path} has {len(w)} words, fewer than asked")
    step = (len(w) - length) // n
    return [" ".join(w[i * step + seed % 5:i * step + seed % 5 + length]) for i in range(n)]


def agreement(d, prompts, gen):
    out = []
    for p in prompts:
        r = d.post("/v1/completions", {"prompt": p, "max_tokens": gen, "temperature": 0})
        out.append(r["choices"][0]["text"])
    return out


def vm_hwm_mib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


def load(a, d, label):
    running, sliding, stop = [], [], threading.Event()

    def sample():
        while not stop.is_set():
            try:
                m = d.metrics()
                running.append(m.get("dualpath_requests_running", 0.0))
                sliding.append(m.get('dualpath_kv_blocks_used{pool="sliding"}', 0.0))
            except OSError:
                pass
            stop.wait(0.1)

    t = threading.Thread(target=sample)
    t.start()
    with tempfile.NamedTemporaryFile("r", suffix=".json") as js:
        cmd = [a.loadgen, "--base-url", d.url, "--workload", "corpus", "--prompt-file", a.text,
               "--input-len", str(a.input_len), "--output-len", str(a.output_len), "--ignore-eos",
               "-n", str(a.requests), "-c", str(a.concurrency), "--no-progress", "-q",
               "--json", js.name, "--label", label]
        subprocess.run(cmd, check=True, timeout=3600)
        rep = json.load(open(js.name))
    stop.set()
    t.join()
    peak = d.metric("dualpath_requests_running_peak")
    cap = d.metric('dualpath_kv_blocks_capacity{pool="sliding"}')
    return {"mean_running": sum(running) / max(len(running), 1), "peak_running": peak,
            "tok_s": rep["output_throughput"], "completed": rep["completed"],
            "failed": rep.get("failed", 0), "sliding_max": max(sliding or [0.0]),
            "sliding_cap": cap, "hwm": vm_hwm_mib(d.proc.pid)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True)
    ap.add_argument("--loadgen", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--kv-mib", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--config", action="append", required=True,
                    help="LABEL:FLAGS (dualpathd flags, space-separated); the first is the "
                         "reference")
    ap.add_argument("--prompts", type=int, default=12, help="agreement prompts")
    ap.add_argument("--prompt-words", type=int, default=600)
    ap.add_argument("--gen", type=int, default=48)
    ap.add_argument("--input-len", type=int, default=1200)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--logdir", default=tempfile.gettempdir())
    a = ap.parse_args()
    prompts = words_windows(a.text, a.prompts, a.prompt_words)
    rows, ref = [], None
    for c in a.config:
        label, _, flags = c.partition(":")
        d, _, _ = config_daemon(a, flags.split(), os.path.join(a.logdir, f"sw-{label}.log"))
        try:
            texts = agreement(d, prompts, a.gen)
            r = load(a, d, label)
        finally:
            d.stop()
        if ref is None:
            ref = texts
        r["same"] = sum(x == y for x, y in zip(texts, ref))
        r["prefix"] = sum(len(os.path.commonprefix([x, y]))
                          for x, y in zip(texts, ref)) / len(ref)
        r["ref_len"] = sum(len(x) for x in ref) / len(ref)
        rows.append((label, flags, r))
        print(f"{label}: {json.dumps(r)}", file=sys.stderr)
    print(f"\n{a.kv_mib} MiB of KV, {a.threads} threads; agreement: {a.prompts} windows of "
          f"{a.prompt_words} words of {os.path.basename(a.text)}, {a.gen} greedy tokens, against "
          f"'{rows[0][0]}'; load: {a.requests} requests of {a.input_len} words + {a.output_len} "
          f"tokens, {a.concurrency} at once\n")
    print("| config | flags | answers identical | common prefix (chars of ~"
          f"{rows[0][2]['ref_len']:.0f}) | mean / peak running | output tok/s | completed / "
          "failed | sliding blocks at most (of) | VmHWM MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, flags, r in rows:
        print(f"| {label} | `{flags or '(defaults)'}` | {r['same']}/{a.prompts} "
              f"| {r['prefix']:.0f} "
              f"| {r['mean_running']:.1f} / {r['peak_running']:.0f} | {r['tok_s']:.1f} | "
              f"{r['completed']:.0f} / {r['failed']:.0f} | {r['sliding_max']:.0f} "
              f"({r['sliding_cap']:.0f}) | {r['hwm']:.0f} |")


if __name__ == "__main__":
    main()
