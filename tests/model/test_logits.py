#!/usr/bin/env python3
"""Acceptance test: the C forward pass against the NumPy reference (ref_llama.py).

    ~/.cache/dualpath/venv/bin/python tests/model/test_logits.py \\
        --model models/SmolLM2-135M-Instruct.Q4_1.gguf --bin build/tools/dp-logits

For each prompt below (fixed token ids) it runs

    dp-logits --model M --tokens 1,2,3 --steps 32

which must print ONE JSON object on stdout:

    {"logits_last": [vocab floats: the logits at the last prompt position],
     "greedy":      [32 token ids, greedy decoding after the prompt]}

and compares it with the reference:
  * relative L2 error ||c - r|| / ||r|| of logits_last below --tol (1e-3);
  * the greedy ids identical.

Exit status: 0 all passed, 1 a prompt failed, 2 the binary is missing.

The tolerance presumes that the C side computes with the exactly dequantized
weights in float32 (a float32 C implementation lands near 1e-6).  Quantizing
the activations for integer dot products, as llama.cpp does on the CPU (Q8_1
against Q4_1 weights) with its f16 KV cache, moves these logits by 1e-2..1e-1
relative L2 on this 135M Q4_1 model and even flips the argmax of the
"chat-france" prompt; llama.cpp running on the same weights dequantized to
F32, with an F32 KV cache, agrees with ref_llama to ~1e-6 and with all 32
greedy tokens on every prompt here.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ref_llama  # noqa: E402
from dp_logits import path_stats  # noqa: E402

# The prompts, as token ids of SmolLM2-135M-Instruct (49152-token GPT-2-style
# BPE).  They were made once with ref_llama.Vocab.encode (an HF `tokenizers`
# BPE built from the GGUF vocabulary and merges); chat ones use the model's
# chat template with its default system prompt (ref_llama.chat_prompt).
# "min margin" is the smallest gap between the reference's best and second-best
# logit over the 32 greedy steps: prompts were picked so that no step is a
# near-tie that honest float32 rounding could flip.
SYS = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28,
       7018, 411, 407, 19712, 8182, 2, 198]
# = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
USER = [1, 4093, 198]           # "<|im_start|>user\n"
END = [2, 198, 1, 520, 9531, 198]  # "<|im_end|>\n<|im_start|>assistant\n"

PROMPTS = [
    # "Hello"  -> "-by-date-but-not-yet-final-version-of-..."   (min margin 0.14)
    ("hello", [19556]),
    # "The capital of France is"  -> " Paris.\n\nThe answer is: 2018-01-22 ..."   (0.05)
    ("france", [504, 3575, 282, 4649, 314]),
    # 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'
    #   -> "```\n\nThis implementation uses a recursive approach ..."   (0.026)
    ("code", [1604, 3987, 46477, 24, 94, 727, 472, 1620, 14362, 260, 304, 29, 373, 24681,
              46477, 1230, 7996, 198]),
    # "Counting: 1, 2, 3, 4, 5, 6, 7,"  (digits are single tokens)  -> " 8, 9, 10, 11, ..."   (2.1)
    ("count", [9825, 274, 42, 216, 33, 28, 216, 34, 28, 216, 35, 28, 216, 36, 28, 216, 37, 28,
               216, 38, 28, 216, 39, 28]),
    # chat: "What is the capital of France?"  -> "The capital of France is Paris.<|im_end|>..."   (0.08)
    ("chat-france", SYS + USER + [1780, 314, 260, 3575, 282, 4649, 47] + END),
    # chat: "Write a haiku about the ocean."  -> "In the depths of the ocean, a silent beauty,\n..."   (0.11)
    ("chat-haiku", SYS + USER + [19161, 253, 421, 30614, 563, 260, 5065, 30] + END),
    # chat: "Explain in two sentences why the sky is blue, and then list the seven colours of
    #        the rainbow in order, starting from red."  -> "The sky is blue because of ..."   (0.049)
    ("chat-sky", SYS + USER + [36971, 281, 827, 8545, 1701, 260, 6376, 314, 4461, 28, 284, 965,
                               1398, 260, 4962, 14797, 282, 260, 24594, 281, 1686, 28, 4335, 429,
                               2382, 30] + END),
]


class LazyVocab:
    def __init__(self, path):
        self.path, self.v = path, None

    def decode(self, ids):
        if self.v is None:
            self.v = ref_llama.Vocab(self.path)
        return self.v.decode(ids)


def run_c(binary, model, tokens, steps, timeout):
    """Run dp-logits; returns (result dict, None) or (None, error text)."""
    cmd = [binary, "--model", model, "--tokens", ",".join(map(str, tokens)), "--steps", str(steps),
           "--exact"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout}s: {' '.join(cmd)}"
    except OSError as e:
        return None, f"could not run {binary}: {e}"
    if p.returncode != 0:
        return None, f"exit status {p.returncode}; stderr: {p.stderr.strip()[-2000:]}"
    out = p.stdout.strip()
    try:
        res = json.loads(out)
    except json.JSONDecodeError:
        # tolerate stray lines around the object, but say so
        objs = [ln for ln in out.splitlines() if ln.lstrip().startswith("{")]
        try:
            res = json.loads(objs[-1])
        except (IndexError, json.JSONDecodeError):
            return None, f"stdout is not a JSON object: {out[:300]!r}"
        print(f"  warning: dp-logits printed more than one JSON object on stdout", file=sys.stderr)
    if not isinstance(res, dict) or "logits_last" not in res or "greedy" not in res:
        return None, f"JSON lacks logits_last/greedy: keys {list(res)[:10] if isinstance(res, dict) else type(res)}"
    return res, None


# A text for the teacher-forced check of the default (int8-activation) path:
# plain prose, code and a list, so that the positions see different kinds of
# continuation. Tokenized by ref_llama.Vocab.encode.
TEACHER_TEXT = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk. He counted the steps, "
    "one hundred and twelve of them, and at the top he wiped the salt from the great lens before "
    "lighting the lamp. Ships passing in the night never saw him, only the beam that swept across "
    "the water every ten seconds. In winter the storms came from the north and the waves broke "
    "over the rocks below, and he wrote in his logbook the time, the wind and the state of the "
    "sea.\n\ndef mean(values):\n    total = 0\n    for v in values:\n        total += v\n"
    "    return total / len(values)\n\nShopping list:\n1. bread\n2. two litres of milk\n"
    "3. apples, pears and a lemon\n4. coffee beans\n\nQuestion: what is the capital of Italy? "
    "Answer: Rome. Question: how many legs does a spider have? Answer: eight. Question: which "
    "planet is closest to the sun? Answer: Mercury. The committee met on Tuesday to discuss the "
    "budget for the coming year, and after a long debate it agreed to spend more on the library, "
    "the swimming pool and the repair of the old bridge over the river. The vote was close: seven "
    "members in favour, five against, and one who said she would need to read the report again "
    "before she could decide anything at all. Outside, the rain had stopped and children were "
    "already racing paper boats along the gutter."
)


def teacher_check(binary, model, ref_model, timeout, min_positions=256):
    """Teacher-forced logits at every position of TEACHER_TEXT on both matmul
    paths against the reference. Returns (table lines, failures).

    Bounds, from measurement on SmolLM2-135M Q4_1 (the test prints the
    figures each run): the exact path lands near 1e-6 relative L2 per
    position (worst 3e-6) and agrees on every argmax. The default path
    quantizes each matmul's activations to int8 per 32 values, as llama.cpp's
    CPU backend does: over the 295 positions, mean relative L2 3.4e-2 on
    both levels, worst 0.16 (AVX-512) and 0.13 (AVX2), top-1 agreement 95.6 %
    and 97.3 %. The bounds leave about 2x room on the errors and a few points
    on the agreement; the baseline level has no integer path and meets the
    exact bounds."""
    tokens = ref_llama.Vocab(model).encode(TEACHER_TEXT)
    if len(tokens) < min_positions:
        return [], [f"teacher text has only {len(tokens)} tokens (< {min_positions})"]
    ref = ref_llama.forward(ref_model, tokens)
    lines, fails = [], []
    bounds = {"exact": (1e-4, 1e-3, 0.99), "int8": (7e-2, 3e-1, 0.92)}
    for st in path_stats(binary, model, tokens, ref, bounds, timeout):
        if st["err"]:
            fails.append(f"{st['mode']}: {st['err']}")
            continue
        lines.append(f"{st['mode']:<6} {len(tokens):>9} {st['mean']:>13.3e} {st['max']:>12.3e} "
                     f"{100 * st['agree']:>8.1f} %  {'ok' if st['ok'] else 'FAIL'}")
        if not st["ok"]:
            fails.append(f"{st['mode']}: {st['why']}")
    return lines, fails


def compare(name, tokens, c, ref, vocab, tol, steps):
    """Returns (row for the table, list of failure messages)."""
    r_first, r_ids, r_step_logits = ref
    fails = []
    cl = np.asarray(c["logits_last"], dtype=np.float64)
    cg = [int(t) for t in c["greedy"]]
    if cl.shape != r_first.shape:
        fails.append(f"logits_last has {cl.size} values, expected {r_first.size}")
        rel = maxabs = float("nan")
    elif not np.all(np.isfinite(cl)):
        fails.append(f"logits_last has {int(np.sum(~np.isfinite(cl)))} non-finite values")
        rel = maxabs = float("nan")
    else:
        rel = float(np.linalg.norm(cl - r_first) / np.linalg.norm(r_first))
        maxabs = float(np.max(np.abs(cl - r_first)))
        if not rel < tol:
            fails.append(f"rel L2 error {rel:.3e} >= {tol:g} (max abs diff {maxabs:.3e}; "
                         f"C argmax {int(np.argmax(cl))}, ref argmax {int(np.argmax(r_first))})")
    if len(cg) != steps:
        fails.append(f"greedy has {len(cg)} ids, expected {steps}")
    same = 0
    while same < min(len(cg), len(r_ids)) and cg[same] == r_ids[same]:
        same += 1
    if cg != r_ids and len(cg) > same and same < len(r_ids):
        lg = r_step_logits[same]
        c_tok = cg[same]
        gap = float(lg[r_ids[same]] - lg[c_tok]) if 0 <= c_tok < lg.size else float("nan")
        tie = " (a near-tie: the gap is within the logit error)" if gap <= 2 * maxabs else ""
        fails.append(f"greedy differs at step {same}: C {c_tok} {vocab.decode([c_tok]) if 0 <= c_tok < lg.size else '?'!r}, "
                     f"ref {r_ids[same]} {vocab.decode([r_ids[same]])!r}; the reference prefers its token by "
                     f"{gap:.4f}{tie}\n      C:   {vocab.decode([t for t in cg if 0 <= t < lg.size])!r}\n"
                     f"      ref: {vocab.decode(r_ids)!r}")
    margin = min((ref_llama.top2_margin(lg) for lg in r_step_logits), default=float("nan"))
    row = (name, len(tokens), rel, maxabs, f"{same}/{steps}", margin, "ok" if not fails else "FAIL")
    return row, fails


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--bin", default="build/tools/dp-logits", help="the dp-logits tool")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--tol", type=float, default=1e-3, help="max relative L2 error of logits_last")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per dp-logits run")
    ap.add_argument("--only", help="comma-separated prompt names to run")
    ap.add_argument("--teacher-only", action="store_true",
                    help="only the teacher-forced check of both matmul paths (e.g. per CPU level)")
    a = ap.parse_args(argv)

    if not (os.path.isfile(a.bin) and os.access(a.bin, os.X_OK)):
        print(f"test_logits: ERROR: the C tool {a.bin!r} does not exist or is not executable "
              f"(build it first, e.g. meson compile -C build)", file=sys.stderr)
        return 2
    if not os.path.isfile(a.model):
        print(f"test_logits: ERROR: model {a.model!r} not found", file=sys.stderr)
        return 2

    prompts = [] if a.teacher_only else PROMPTS
    if a.only:
        want = set(a.only.split(","))
        prompts = [p for p in PROMPTS if p[0] in want]

    t0 = time.time()
    model = ref_llama.load(a.model)
    vocab = LazyVocab(a.model)  # only to show text when something fails
    print(f"reference loaded in {time.time() - t0:.1f}s; {len(prompts)} prompts, {a.steps} steps, "
          f"tol {a.tol:g}; C tool {a.bin}")

    rows, failures = [], []
    t_c = t_ref = 0.0
    for name, tokens in prompts:
        t = time.time()
        c, err = run_c(a.bin, a.model, tokens, a.steps, a.timeout)
        t_c += time.time() - t
        if err:
            rows.append((name, len(tokens), float("nan"), float("nan"), "-", float("nan"), "FAIL"))
            failures.append((name, [f"dp-logits failed: {err}"]))
            continue
        t = time.time()
        ref = ref_llama.generate(model, tokens, a.steps)
        t_ref += time.time() - t
        row, fails = compare(name, tokens, c, ref, vocab, a.tol, a.steps)
        rows.append(row)
        if fails:
            failures.append((name, fails))

    def fmt(v, f):
        if isinstance(v, float) and math.isnan(v):
            return "-".rjust(int(f.split(".")[0]))
        return format(v, f)

    print()
    print(f"{'prompt':<12} {'tokens':>6} {'rel L2 err':>11} {'max |diff|':>11} {'greedy':>7} "
          f"{'ref margin':>10}  result")
    for name, n, rel, mx, g, margin, res in rows:
        print(f"{name:<12} {n:>6} {fmt(rel, '11.3e')} {fmt(mx, '11.3e')} {g:>7} "
              f"{fmt(margin, '10.4f')}  {res}")
    if not a.only:
        t = time.time()
        lines, fails = teacher_check(a.bin, a.model, model, a.timeout)
        print(f"\nteacher-forced logits at every position vs the reference ({time.time() - t:.1f}s):")
        print(f"{'matmul':<6} {'positions':>9} {'mean rel L2':>13} {'max rel L2':>12} {'top-1':>10}")
        for ln in lines:
            print(ln)
        rows.append(("teacher",))
        if fails:
            failures.append(("teacher", fails))
    print(f"\ntime: C tool {t_c:.1f}s, reference {t_ref:.1f}s, total {time.time() - t0:.1f}s")
    for name, fails in failures:
        for f in fails:
            print(f"FAIL {name}: {f}")
    n_fail = len(failures)
    print(f"{len(rows) - n_fail} passed, {n_fail} failed")
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main())
