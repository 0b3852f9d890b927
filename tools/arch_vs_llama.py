#!/usr/bin/env python3
"""The table of tools/arch-vs-llama.sh: dualpath's logits against llama.cpp's,
per architecture, on synthetic GGUFs (see the script), and with --real on
real model files: their tokenizer on the golden texts and their logits over
a real text."""
import base64
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
    "qwen2 YaRN (factor 4, original context 4096)": ["--arch", "qwen2", "--rope-base", "1000000",
                                                     "--ctx", "16384", "--yarn", "4096"],
    "qwen3 (head 96)": ["--arch", "qwen3", "--head-dim", "96", "--rope-base", "1000000"],
    "phi3 (fused QKV, gate/up)": ["--arch", "phi3"],
    "phi3 LongRoPE, long factors (original context 16)": ["--arch", "phi3", "--longrope", "16"],
    "phi3 LongRoPE, short factors (original context 1000)": ["--arch", "phi3", "--ctx", "2048",
                                                             "--longrope", "1000"],
    "gemma3 (7 layers, windows of 8)": ["--arch", "gemma3", "--layers", "7", "--kv-heads", "1",
                                        "--sliding-window", "8", "--rope-base", "1000000"],
}


def log_softmax(x):
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def compare(a, path, tokens, name):
    """One table row: the logits at every position of tokens, then greedy
    tokens after them, through both."""
    tl = ",".join(map(str, tokens))
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
    top1 = float(np.mean(ours.argmax(-1) == theirs.argmax(-1)))
    same = sum(1 for x, y in zip(ours_greedy, theirs_greedy) if x == y)
    first = next((k for k, (x, y) in enumerate(zip(ours_greedy, theirs_greedy)) if x != y), None)
    note = "" if first is None else f" (first differs at {first})"
    print(f"| {name} | {len(tokens)} | {diff:.2e} | {kl:.2e} | {100 * top1:.1f} % | "
          f"{same}/{a.steps}{note} |", flush=True)


def golden_texts():
    """The valid-UTF-8 inputs of the tokenizer's golden file."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = []
    with open(os.path.join(root, "tests", "golden", "tokenizer_smollm2.jsonl")) as f:
        for line in f:
            d = json.loads(line)
            if d.get("pre") == "smollm" and "text" in d and not d.get("special"):
                out.append(base64.b64decode(d["b64"]))
    return out


def real(a, path, text_path):
    """A real file: its tokenizer on the golden texts, then the logits over
    the first --real-tokens tokens of a real text."""
    texts = golden_texts()
    hexf = os.path.join(a.tmp, "texts.hex")
    with open(hexf, "w") as f:
        for t in texts:
            f.write(t.hex() + "\n")
    p = subprocess.run([a.bin, "--model", path, "--tokenize", hexf], check=True,
                       capture_output=True, text=True)
    ours = [json.loads(x) for x in p.stdout.splitlines()]
    p = subprocess.run([a.llama, "--tokenize", path, hexf], check=True, capture_output=True,
                       text=True)
    theirs = [json.loads(x) for x in p.stdout.splitlines()]
    bad = [i for i, (x, y) in enumerate(zip(ours, theirs)) if x != y]
    name = os.path.basename(path)
    print(f"tokenizer of {name}: {len(texts) - len(bad)}/{len(texts)} golden texts give "
          f"llama.cpp's ids", flush=True)
    for i in bad[:5]:
        print(f"  differs: {texts[i][:60]!r}: ours {ours[i][:12]} theirs {theirs[i][:12]}")
    with open(text_path, "rb") as f:
        hx = f.read().hex()
    with open(hexf, "w") as f:
        f.write(hx + "\n")
    p = subprocess.run([a.bin, "--model", path, "--tokenize", hexf], check=True,
                       capture_output=True, text=True)
    tokens = json.loads(p.stdout.splitlines()[0])[:a.real_tokens]
    print("| model | positions | max abs logit diff | mean KL (nats) | top-1 equal | "
          "greedy tokens equal |")
    print("|---|---|---|---|---|---|")
    compare(a, path, tokens, name)
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--synth", required=True)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--llama", required=True)
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--positions", type=int, default=64)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--real", action="append", default=[], help="a real GGUF file")
    ap.add_argument("--text", help="with --real: the text whose logits are compared")
    ap.add_argument("--real-tokens", type=int, default=700)
    a = ap.parse_args()
    if a.real:
        return max(real(a, path, a.text) for path in a.real)
    rng = np.random.default_rng(20261207)
    tokens = [int(t) for t in rng.integers(3, 509, size=a.positions)]
    print("| architecture | positions | max abs logit diff | mean KL (nats) | top-1 equal | "
          "greedy tokens equal |")
    print("|---|---|---|---|---|---|")
    for i, (name, extra) in enumerate(ARCHS.items()):
        path = os.path.join(a.tmp, f"arch{i}.gguf")
        subprocess.run([a.synth, "--out", path, "--seed", str(500 + i)] + BASE + extra,
                       check=True, capture_output=True)
        compare(a, path, tokens, name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
