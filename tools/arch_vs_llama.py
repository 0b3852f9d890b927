#!/usr/bin/env python3
"""The table of tools/arch-vs-llama.sh: dualpath's logits against llama.cpp's,
per architecture, on synthetic GGUFs (see the script)."""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

BASE = ["--shape", "tiny", "--dim", "256", "--ffn", "512", "--vocab", "512", "--heads", "4",
        "--kv-heads", "2", "--layers", "2", "--type", "f32"]
ARCHS = {
    "llama": [],
    "llama3 (rope_freqs)": ["--rope-freqs", "--rope-base", "500000"],
    "llama (head 96, as Mistral Nemo)": ["--head-dim", "96"],
    "qwen2": ["--arch", "qwen2", "--rope-base", "1000000"],
    "qwen3 (head 96)": ["--arch", "qwen3", "--head-dim", "96", "--rope-base", "1000000"],
    "phi3 (fused QKV, gate/up)": ["--arch", "phi3"],
}


def log_softmax(x):
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--synth", required=True)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--llama", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--positions", type=int, default=64)
    ap.add_argument("--steps", type=int, default=64)
    a = ap.parse_args()
    rng = np.random.default_rng(20261207)
    tokens = [int(t) for t in rng.integers(3, 509, size=a.positions)]
    tl = ",".join(map(str, tokens))
    print("| architecture | max abs logit diff | mean KL (nats) | greedy tokens equal |")
    print("|---|---|---|---|")
    for i, (name, extra) in enumerate(ARCHS.items()):
        path = os.path.join(a.tmp, f"arch{i}.gguf")
        subprocess.run([a.synth, "--out", path, "--seed", str(500 + i)] + BASE + extra,
                       check=True, capture_output=True)
        ours_f = os.path.join(a.tmp, "ours.f32")
        subprocess.run([a.bin, "--model", path, "--tokens", tl, "--teacher", ours_f, "--exact"],
                       check=True, capture_output=True)
        p = subprocess.run([a.bin, "--model", path, "--tokens", tl, "--steps", str(a.steps),
                            "--exact"], check=True, capture_output=True, text=True)
        ours_greedy = json.loads(p.stdout)["greedy"]
        theirs_f = os.path.join(a.tmp, "theirs.f32")
        p = subprocess.run([a.llama, path, tl, theirs_f, str(a.steps)], check=True,
                           capture_output=True, text=True)
        theirs_greedy = json.loads(p.stdout)
        ours = np.fromfile(ours_f, dtype=np.float32).astype(np.float64).reshape(len(tokens), -1)
        theirs = np.fromfile(theirs_f, dtype=np.float32).astype(np.float64).reshape(ours.shape)
        diff = np.abs(ours - theirs).max()
        lt, lo = log_softmax(theirs), log_softmax(ours)
        kl = float(np.mean(np.sum(np.exp(lt) * (lt - lo), axis=-1)))
        same = sum(1 for x, y in zip(ours_greedy, theirs_greedy) if x == y)
        first = next((k for k, (x, y) in enumerate(zip(ours_greedy, theirs_greedy)) if x != y), None)
        note = "" if first is None else f" (first differs at {first})"
        print(f"| {name} | {diff:.2e} | {kl:.2e} | {same}/{a.steps}{note} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
