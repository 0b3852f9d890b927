#!/usr/bin/env python3
"""The C forward pass against the NumPy reference, on a synthetic model of each architecture.

    ~/.cache/dualpath/venv/bin/python tests/model/test_architectures.py \\
        --synth build/tools/dp-synth --bin build/tools/dp-logits

For each architecture the forward pass runs (model/arch.h) dp-synth writes a
small seeded model with that architecture's tensors and keys:

  * llama3: LLaMA with rope_freqs.weight (Llama 3's per-pair RoPE factors,
    uniform in [1, 8] here so that every pair is scaled);
  * mistral: LLaMA with heads of 96 at dim 256 and 4 heads
    (attention.key_length, as Mistral Nemo's heads are not dim / n_heads);
  * qwen2: Q, K and V biases and NeoX RoPE; qwen2-yarn with YaRN (factor 4
    over an original context of 4096: its ramp runs over pairs 6 to 16);
  * qwen3: per-head Q and K RMSNorms, NeoX RoPE, and heads of 96 with
    dim 256 and 4 heads (attention.key_length: not dim / n_heads);
  * phi3: Q, K and V in one tensor, the gate and up projections in another,
    NeoX RoPE; phi3-longrope with LongRoPE's factors and attention factor,
    an original context of 16 tokens (so that the long factors rotate), and
    phi3-shortrope with one of 1000 (the short factors);
  * gemma3: 7 layers, the sixth global and the others windows of 8 tokens
    (so that 48 positions slide them; their RoPE base 10000, the global's
    1e6), one KV head, the scaled embedding, per-head Q/K norms, the norms
    after attention and FFN, GELU gating, tied embeddings;
  * llama: the plain layout, for comparison.

dp-logits --teacher gives the logits at every position of a fixed token
sequence, with the exact f32 matmul and with the default integer path, and
ref_llama.py (written apart from model/ and kernels/) gives the reference.
Bounds (dp_logits.BOUNDS, as test_weight_types.py's): exact mean relative L2 < 1e-4, max < 1e-3,
top-1 >= 99 %; the int8 path < 4e-2, < 8e-2, >= 85 %.

Exit status: 0 all passed, 1 an architecture failed, 2 a tool is missing.
"""

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dp_logits import check_paths  # noqa: E402

BASE = ["--shape", "tiny", "--dim", "256", "--ffn", "512", "--vocab", "512", "--heads", "4",
        "--kv-heads", "2", "--layers", "2", "--type", "q8_0"]
ARCHS = {
    "llama": [],
    "llama3": ["--rope-freqs", "--rope-base", "500000"],
    "mistral": ["--head-dim", "96"],
    "qwen2": ["--arch", "qwen2", "--rope-base", "1000000"],
    "qwen2-yarn": ["--arch", "qwen2", "--rope-base", "1000000", "--ctx", "16384", "--yarn", "4096"],
    "qwen3": ["--arch", "qwen3", "--head-dim", "96", "--rope-base", "1000000"],
    "phi3": ["--arch", "phi3"],
    "phi3-longrope": ["--arch", "phi3", "--longrope", "16"],
    "phi3-shortrope": ["--arch", "phi3", "--ctx", "2048", "--longrope", "1000"],
    "gemma3": ["--arch", "gemma3", "--layers", "7", "--kv-heads", "1", "--sliding-window", "8",
               "--rope-base", "1000000"],
}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--synth", default="build/tools/dp-synth", help="the dp-synth tool")
    ap.add_argument("--bin", default="build/tools/dp-logits", help="the dp-logits tool")
    ap.add_argument("--archs", default=",".join(ARCHS))
    ap.add_argument("--positions", type=int, default=48)
    ap.add_argument("--timeout", type=float, default=300)
    a = ap.parse_args(argv)
    for tool in (a.synth, a.bin):
        if not (os.path.isfile(tool) and os.access(tool, os.X_OK)):
            print(f"test_architectures: ERROR: {tool!r} does not exist or is not executable",
                  file=sys.stderr)
            return 2
    rng = np.random.default_rng(20261207)
    tokens = [int(t) for t in rng.integers(3, 512, size=a.positions)]
    print(f"{'arch':<13} {'matmul':<6} {'positions':>9} {'mean rel L2':>12} {'max rel L2':>11} "
          f"{'top-1':>8}")
    failures = []
    names = a.archs.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        for i, name in enumerate(names):
            path = os.path.join(tmp, f"synth-{name}.gguf")
            p = subprocess.run([a.synth, "--out", path, "--seed", str(300 + i)] + BASE + ARCHS[name],
                               capture_output=True, text=True, timeout=a.timeout)
            if p.returncode != 0:
                failures.append(f"{name}: dp-synth failed: {p.stderr.strip()[-300:]}")
                continue
            check_paths(a.bin, path, tokens, name, 7, a.timeout, failures)
    for f in failures:
        print(f"FAIL {f}")
    bad = {f.split()[0].rstrip(":") for f in failures}
    print(f"{len(names) - len(bad)} architectures passed, {len(bad)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
