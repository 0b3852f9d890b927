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


def path_stats(binary, path, tokens, ref, bounds, timeout):
    """path's teacher-forced logits on the exact and the int8 matmul paths
    against the reference logits ref ([len(tokens), vocab]): per mode, a
    dict with its error (a string, or None) or its mean and max relative L2,
    top-1 agreement, whether they hold bounds[mode] (mean, max, agreement)
    and the message saying why not."""
    ref_top = np.argmax(ref, axis=1)
    for mode in ("exact", "int8"):
        c, err = teacher(binary, path, tokens, mode == "exact", timeout)
        if not err and c.size != ref.size:
            err = f"{c.size} logits, expected {ref.size}"
        if err:
            yield {"mode": mode, "err": err}
            continue
        c = c.reshape(ref.shape)
        rel = np.linalg.norm(c - ref, axis=1) / np.linalg.norm(ref, axis=1)
        agree = float(np.mean(np.argmax(c, axis=1) == ref_top))
        mean_b, max_b, agree_b = bounds[mode]
        ok = rel.mean() < mean_b and rel.max() < max_b and agree >= agree_b
        why = (f"mean rel L2 {rel.mean():.3e} (< {mean_b:g}), max {rel.max():.3e} (< {max_b:g}), "
               f"top-1 agreement {100 * agree:.1f} % (>= {100 * agree_b:g} %)")
        yield {"mode": mode, "err": None, "mean": rel.mean(), "max": rel.max(), "agree": agree,
               "ok": ok, "why": why}


def check_paths(binary, path, tokens, label, width, timeout, failures):
    """path's teacher-forced logits on the exact and the int8 matmul paths
    against ref_llama's: prints a row per path (label padded to width) and
    appends each failure, label first, to failures."""
    ref = ref_llama.forward(ref_llama.load(path), tokens)
    for s in path_stats(binary, path, tokens, ref, BOUNDS, timeout):
        if s["err"]:
            failures.append(f"{label} {s['mode']}: {s['err']}")
            continue
        print(f"{label:<{width}} {s['mode']:<6} {len(tokens):>9} {s['mean']:>12.3e} "
              f"{s['max']:>11.3e} {100 * s['agree']:>6.1f} %  {'ok' if s['ok'] else 'FAIL'}")
        if not s["ok"]:
            failures.append(f"{label} {s['mode']}: {s['why']}")
