"""Runs the dp-logits tool for the model tests (test_logits.py,
test_weight_types.py, test_architectures.py)."""
import subprocess
import tempfile

import numpy as np

import ref_llama

# What a synthetic model's logits must hold against ref_llama's, per matmul
# path: (mean relative L2, max relative L2, top-1 agreement).
BOUNDS = {"exact": (1e-4, 1e-3, 0.99), "int8": (4e-2, 8e-2, 0.85)}


def teacher(binary, model, tokens, exact, timeout):
    """Teacher-forced logits of model at every position of tokens, flat f64
    (positions x vocab), on the exact f32 matmul path or the default int8
    one. Returns (logits, None), or (None, the failure as a message)."""
    with tempfile.NamedTemporaryFile(suffix=".f32") as out:
        cmd = [binary, "--model", model, "--tokens", ",".join(map(str, tokens)),
               "--teacher", out.name] + (["--exact"] if exact else [])
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0:
            return None, f"dp-logits --teacher failed: {p.stderr.strip()[-500:]}"
        return np.fromfile(out.name, dtype=np.float32).astype(np.float64), None


def check_paths(binary, path, tokens, label, width, timeout, failures):
    """path's teacher-forced logits on the exact and the int8 matmul paths
    against ref_llama's: prints a row per path (label padded to width) and
    appends each failure, label first, to failures."""
    ref = ref_llama.forward(ref_llama.load(path), tokens)
    ref_top = np.argmax(ref, axis=1)
    for mode in ("exact", "int8"):
        c, err = teacher(binary, path, tokens, mode == "exact", timeout)
        if err:
            failures.append(f"{label} {mode}: {err}")
            continue
        if c.size != ref.size:
            failures.append(f"{label} {mode}: {c.size} logits, expected {ref.size}")
            continue
        c = c.reshape(ref.shape)
        rel = np.linalg.norm(c - ref, axis=1) / np.linalg.norm(ref, axis=1)
        agree = float(np.mean(np.argmax(c, axis=1) == ref_top))
        mean_b, max_b, agree_b = BOUNDS[mode]
        ok = rel.mean() < mean_b and rel.max() < max_b and agree >= agree_b
        print(f"{label:<{width}} {mode:<6} {len(tokens):>9} {rel.mean():>12.3e} {rel.max():>11.3e} "
              f"{100 * agree:>6.1f} %  {'ok' if ok else 'FAIL'}")
        if not ok:
            failures.append(f"{label} {mode}: mean rel L2 {rel.mean():.3e} (< {mean_b:g}), max "
                            f"{rel.max():.3e} (< {max_b:g}), top-1 {100 * agree:.1f} % "
                            f"(>= {100 * agree_b:g} %)")
