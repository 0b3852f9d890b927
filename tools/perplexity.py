#!/usr/bin/env python3
"""Perplexity of a text through dualpath's forward pass, by llama-perplexity's
rule: chunks of --ctx tokens, each from an empty cache, the second half of each
chunk scored. Prints one line: "PPL x over n chunks of ctx (t tokens)".

    python tools/perplexity.py --bin build/tools/dp-logits --model M --text F [--exact]

Tokens come from the GGUF's own vocabulary and merges (tests/model/ref_llama's
tokenizer); the logits from `dp-logits --teacher` (the daemon's forward pass).
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "model"))
import ref_llama  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--exact", action="store_true", help="the exact f32 matmul (dp-logits --exact)")
    ap.add_argument("--max-chunks", type=int, default=0)
    a = ap.parse_args()
    with open(a.text, encoding="utf-8", errors="replace") as f:
        tokens = ref_llama.Vocab(a.model).encode(f.read())
    n_chunks = len(tokens) // a.ctx
    if a.max_chunks:
        n_chunks = min(n_chunks, a.max_chunks)
    if n_chunks < 1:
        sys.exit(f"perplexity: the text has {len(tokens)} tokens, fewer than one chunk of {a.ctx}")
    nll, count = 0.0, 0
    first = a.ctx // 2
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "logits.f32")
        for c in range(n_chunks):
            chunk = tokens[c * a.ctx:(c + 1) * a.ctx]
            cmd = [a.bin, "--model", a.model, "--tokens", ",".join(map(str, chunk)),
                   "--teacher", out] + (["--exact"] if a.exact else [])
            subprocess.run(cmd, check=True, stderr=subprocess.DEVNULL)
            lg = np.fromfile(out, dtype=np.float32).reshape(len(chunk), -1).astype(np.float64)
            rows = lg[first:a.ctx - 1]  # position j predicts token j + 1
            m = rows.max(axis=1, keepdims=True)
            lse = m[:, 0] + np.log(np.exp(rows - m).sum(axis=1))
            nll += float(np.sum(lse - rows[np.arange(len(rows)), chunk[first + 1:a.ctx]]))
            count += len(rows)
    print(f"PPL {np.exp(nll / count):.4f} over {n_chunks} chunks of {a.ctx} ({len(tokens)} tokens)")


if __name__ == "__main__":
    main()
