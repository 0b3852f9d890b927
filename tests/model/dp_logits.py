"""Runs the dp-logits tool for the model tests (test_logits.py,
test_weight_types.py)."""
import subprocess
import tempfile

import numpy as np


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
