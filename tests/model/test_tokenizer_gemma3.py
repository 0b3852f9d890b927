#!/usr/bin/env python3
"""Gemma 3's SentencePiece tokenizer against llama.cpp's ids on the golden texts.

    ~/.cache/dualpath/venv/bin/python tests/model/test_tokenizer_gemma3.py \\
        --model ~/.cache/dualpath/models/gemma-3-270m-q4_k_m.gguf --bin build/tools/dp-logits

tests/golden/tokenizer_gemma3.jsonl holds, for each of the 333 valid-UTF-8
texts of tokenizer_smollm2.jsonl, the ids llama.cpp's llama_tokenize gives
with Gemma 3 270M's vocabulary (BOS added, no special-token parsing; written
by tools/llama_logits.cpp --tokenize, the llama.cpp of tools/llama-cpp.sh,
llama-cpp-python 0.3.36). Gemma's vocabulary has runs of spaces and newlines
as user-defined tokens, byte fallback and no space prefix: none of which the
SmolLM2 golden lines reach. Exit status: 0 all equal, 1 a text differs, 2 a
file is missing.
"""
import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "tools", "dp-logits"))
    a = ap.parse_args()
    for f in (a.model, a.bin):
        if not os.path.isfile(f):
            print(f"test_tokenizer_gemma3: ERROR: {f} is missing", file=sys.stderr)
            return 2
    golden = [json.loads(x) for x in open(os.path.join(ROOT, "tests", "golden",
                                                        "tokenizer_gemma3.jsonl"))]
    with tempfile.NamedTemporaryFile("w", suffix=".hex") as f:
        for g in golden:
            f.write(base64.b64decode(g["b64"]).hex() + "\n")
        f.flush()
        p = subprocess.run([a.bin, "--model", a.model, "--tokenize", f.name], capture_output=True,
                           text=True, timeout=300)
    if p.returncode:
        print(f"test_tokenizer_gemma3: dp-logits failed: {p.stderr[-300:]}", file=sys.stderr)
        return 1
    got = [json.loads(x) for x in p.stdout.splitlines()]
    bad = [i for i, g in enumerate(golden) if i >= len(got) or got[i] != g["ids"]]
    for i in bad[:5]:
        text = base64.b64decode(golden[i]["b64"])
        print(f"  differs: {text[:60]!r}: llama.cpp {golden[i]['ids'][:12]}, "
              f"dualpath {got[i][:12] if i < len(got) else None}")
    print(f"test_tokenizer_gemma3: {len(golden) - len(bad)}/{len(golden)} golden texts give "
          f"llama.cpp's ids ({sum(len(g['ids']) for g in golden)} ids)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
