#!/usr/bin/env python3
"""The C forward pass against the NumPy reference, on a synthetic model of each weight type.

    ~/.cache/dualpath/venv/bin/python tests/model/test_weight_types.py \\
        --synth build/tools/dp-synth --bin build/tools/dp-logits

For each block type a user's GGUF may hold (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) dp-synth writes a small seeded model whose every matrix is
of that type (dim 256 and ffn 512: whole K-quant super-blocks), and
dp-logits --teacher gives the logits at every position of a fixed token
sequence, once with the exact f32 matmul and once with the default integer
path (activations quantized to int8 for the repacked x8 kernels). The
reference (ref_llama.py) dequantizes with gguf-py's own decoders
(gguf.quants.dequantize), written independently of kernels/quant.c, so a
layout slip on either side fails here.

Bounds: the exact path must agree as test_logits.py requires of it (mean
relative L2 < 1e-4, max < 1e-3, top-1 >= 99 %; measured 4.0-4.7e-7 for
every type). The int8 path measured a mean relative L2 of 1.80-1.91e-2, max
2.34-2.94e-2 and top-1 agreement of 93.8-100 % at the AVX2 level (the random
weights' logits are flat, so near-ties are many); the bounds leave about 2x
room. At
the portable level, which has no integer path, both rows are exact.

Exit status: 0 all passed, 1 a type failed, 2 a tool is missing.
"""

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dp_logits import check_paths  # noqa: E402

TYPES = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k"]
SHAPE = ["--shape", "tiny", "--dim", "256", "--ffn", "512", "--vocab", "512", "--heads", "4",
         "--kv-heads", "2", "--layers", "2"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--synth", default="build/tools/dp-synth", help="the dp-synth tool")
    ap.add_argument("--bin", default="build/tools/dp-logits", help="the dp-logits tool")
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--positions", type=int, default=48)
    ap.add_argument("--timeout", type=float, default=300)
    a = ap.parse_args(argv)
    for tool in (a.synth, a.bin):
        if not (os.path.isfile(tool) and os.access(tool, os.X_OK)):
            print(f"test_weight_types: ERROR: {tool!r} does not exist or is not executable",
                  file=sys.stderr)
            return 2
    rng = np.random.default_rng(20261207)
    tokens = [int(t) for t in rng.integers(3, 512, size=a.positions)]
    print(f"{'type':<6} {'matmul':<6} {'positions':>9} {'mean rel L2':>12} {'max rel L2':>11} "
          f"{'top-1':>8}")
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, t in enumerate(a.types.split(",")):
            path = os.path.join(tmp, f"synth-{t}.gguf")
            p = subprocess.run([a.synth, "--out", path, "--type", t, "--seed", str(100 + i)] + SHAPE,
                               capture_output=True, text=True, timeout=a.timeout)
            if p.returncode != 0:
                failures.append(f"{t}: dp-synth failed: {p.stderr.strip()[-300:]}")
                continue
            check_paths(a.bin, path, tokens, t, 6, a.timeout, failures)
    for f in failures:
        print(f"FAIL {f}")
    print(f"{len(a.types.split(',')) - len({f.split()[0] for f in failures})} types passed, "
          f"{len({f.split()[0] for f in failures})} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
