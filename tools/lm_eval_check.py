"""lm_eval_check.py: lm-evaluation-harness scores a multiple-choice task
through dualpathd (its `local-completions` model, the server's own tokenizer
through /tokenizer_info, /tokenize and /detokenize), and every loglikelihood
it logged is compared with the NumPy reference forward of the same GGUF
(tests/model/ref_llama.py, float64, its own tokenizer built from the GGUF).

The task's items are generated here (arithmetic, capitals, opposites, days
and months; a fixed seed), since this machine reaches PyPI but not the
Hugging Face hub, where lm-eval's own tasks keep their data.

Two daemon configurations run in turn:
  reference  exact_matmul = true, kv_cache_type = f32: the reference's
             arithmetic; every loglikelihood must equal the reference's to
             --tol (default 1e-3 nats), or the script exits 1.
  default    the daemon's defaults (int8 activations in the matmuls as
             llama.cpp's, an f16 KV cache; the reference rounds its KV to f16
             too): reported, with how often the two pick the same answer.

  usage: tools/lm-eval-check.sh [DUALPATHD] [MODEL]   (sets up the venv)
"""
import argparse
import glob
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "model"))
import ref_llama  # noqa: E402

TASK = "dp_generated_mc"

CAPITALS = [("France", "Paris"), ("Italy", "Rome"), ("Germany", "Berlin"), ("Spain", "Madrid"),
            ("Japan", "Tokyo"), ("Russia", "Moscow"), ("Egypt", "Cairo"), ("Greece", "Athens"),
            ("Austria", "Vienna"), ("Portugal", "Lisbon"), ("Ireland", "Dublin"),
            ("Norway", "Oslo"), ("Poland", "Warsaw"), ("Canada", "Ottawa"),
            ("Australia", "Canberra"), ("China", "Beijing"), ("Kenya", "Nairobi"),
            ("Peru", "Lima"), ("Cuba", "Havana"), ("Sweden", "Stockholm")]
OPPOSITES = [("hot", "cold"), ("big", "small"), ("up", "down"), ("fast", "slow"),
             ("happy", "sad"), ("light", "dark"), ("old", "young"), ("open", "closed"),
             ("high", "low"), ("early", "late"), ("full", "empty"), ("hard", "soft"),
             ("rich", "poor"), ("strong", "weak"), ("wet", "dry"), ("loud", "quiet"),
             ("thick", "thin"), ("clean", "dirty"), ("long", "short"), ("left", "right")]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]


def items(seed):
    """(question, choices, label) tuples: about 240 items of 4 choices."""
    rng = random.Random(seed)
    out = []

    def add(q, right, wrong):
        ch = [right] + rng.sample(wrong, 3)
        rng.shuffle(ch)
        # lm-eval puts its target_delimiter (" ") between question and choice.
        out.append({"question": q, "choices": ch, "label": ch.index(right)})

    for _ in range(100):
        a, b = rng.randint(2, 60), rng.randint(2, 40)
        s = a + b
        add(f"What is {a} plus {b}?", str(s), [str(x) for x in {s + 1, s - 1, s + 10, a * b} - {s}])
    for _ in range(80):
        a, b = rng.randint(20, 90), rng.randint(1, 19)
        d = a - b
        add(f"What is {a} minus {b}?", str(d), [str(x) for x in {d + 1, d - 1, d + 10, a + b} - {d}])
    caps = [c for _, c in CAPITALS]
    for country, cap in CAPITALS:
        add(f"What is the capital of {country}?", cap, [c for c in caps if c != cap])
    words = [w for p in OPPOSITES for w in p]
    for a, b in OPPOSITES:
        add(f"What is the opposite of {a}?", b, [w for w in words if w not in (a, b)])
    for seq in (DAYS, MONTHS):
        for i, x in enumerate(seq):
            nxt = seq[(i + 1) % len(seq)]
            add(f"What comes after {x}?", nxt, [y for y in seq if y not in (x, nxt)])
    return out


def write_task(d, seed):
    with open(os.path.join(d, "items.jsonl"), "w") as f:
        for it in items(seed):
            f.write(json.dumps(it) + "\n")
    with open(os.path.join(d, TASK + ".yaml"), "w") as f:
        f.write(f"""task: {TASK}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {os.path.join(d, "items.jsonl")}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
""")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def start_daemon(binary, model, port, extra, log):
    p = subprocess.Popen([binary, "--model", model, "--listen", f"127.0.0.1:{port}",
                          "--model-name", "smollm2"] + extra,
                         stdout=log, stderr=subprocess.STDOUT)
    # Wait on the daemon's own readiness answer (or its exit), not a clock.
    while p.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                if r.status == 200:
                    return p
        except OSError:
            time.sleep(0.2)
    raise SystemExit(f"dualpathd exited with {p.returncode} before it was ready")


def run_lm_eval(py, port, taskdir, outdir, concurrent):
    args = (f"model=smollm2,base_url=http://127.0.0.1:{port}/v1/completions,"
            f"tokenizer_backend=remote,tokenized_requests=True,num_concurrent={concurrent},"
            f"max_retries=1,timeout=600")
    cmd = [py, "-m", "lm_eval", "--model", "local-completions", "--model_args", args,
           "--tasks", TASK, "--include_path", taskdir, "--log_samples",
           "--output_path", outdir, "--batch_size", "1"]
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    t0 = time.time()
    subprocess.run(cmd, check=True, env=env)
    samples = glob.glob(os.path.join(outdir, "**", f"samples_{TASK}_*.jsonl"), recursive=True)
    results = glob.glob(os.path.join(outdir, "**", "results_*.json"), recursive=True)
    if not samples or not results:
        raise SystemExit(f"lm_eval wrote no samples/results under {outdir}")
    with open(max(results, key=os.path.getmtime)) as f:
        acc = json.load(f)["results"][TASK]["acc,none"]
    with open(max(samples, key=os.path.getmtime)) as f:
        return [json.loads(l) for l in f], acc, time.time() - t0


def encode_pair(vocab, context, continuation):
    """lm-eval's split: trailing spaces of the context move to the
    continuation; the whole is encoded once and cut at the context's length."""
    n = len(context) - len(context.rstrip())
    if n:
        continuation = context[-n:] + continuation
        context = context[:-n]
    whole = vocab.encode(context + continuation)
    ctx = vocab.encode(context)
    return whole, len(ctx)


def reference_ll(model, vocab, context, continuation, kv_dtype, memo):
    key = (context, continuation, kv_dtype)
    if key not in memo:
        whole, n_ctx = encode_pair(vocab, context, continuation)
        ls = ref_llama.log_softmax(ref_llama.forward(model, whole, kv_dtype))
        memo[key] = float(sum(ls[p - 1, whole[p]] for p in range(n_ctx, len(whole))))
    return memo[key]


def compare(samples, model, vocab, kv_dtype, memo):
    diffs, same_pick, ref_right = [], 0, 0
    for s in samples:
        got = [float(r[0][0]) for r in s["resps"]]
        args = [s["arguments"][f"gen_args_{i}"] for i in range(len(s["arguments"]))]
        want = [reference_ll(model, vocab, a["arg_0"], a["arg_1"], kv_dtype, memo) for a in args]
        diffs += [abs(g - w) for g, w in zip(got, want)]
        same_pick += int(np.argmax(got) == np.argmax(want))
        ref_right += int(np.argmax(want) == int(s["target"]))
    return np.array(diffs), same_pick, ref_right


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dualpathd", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--tol", type=float, default=1e-3)
    ap.add_argument("--concurrent", type=int, default=8)
    ap.add_argument("--out", default=None, help="folder for the logs and lm-eval's output")
    a = ap.parse_args()
    out = a.out or tempfile.mkdtemp(prefix="dp-lm-eval.")
    os.makedirs(out, exist_ok=True)
    taskdir = os.path.join(out, "task")
    os.makedirs(taskdir, exist_ok=True)
    write_task(taskdir, a.seed)
    model = ref_llama.load(a.model)
    vocab = ref_llama.Vocab(a.model)
    configs = [("reference", ["--exact-matmul", "--kv-cache-type", "f32"], "f32"),
               ("default", [], "f16")]
    rows, ok = [], True
    for name, extra, kv_dtype in configs:
        port = free_port()
        with open(os.path.join(out, f"dualpathd-{name}.log"), "w") as log:
            d = start_daemon(a.dualpathd, a.model, port, extra, log)
            try:
                samples, acc, secs = run_lm_eval(sys.executable, port, taskdir,
                                                 os.path.join(out, name), a.concurrent)
            finally:
                d.terminate()
                d.wait()
        diffs, same, ref_right = compare(samples, model, vocab, kv_dtype, {})
        n = len(samples)
        rows.append((name, n, len(diffs), acc, ref_right / n, same, diffs.mean(), diffs.max(), secs))
        if name == "reference" and not diffs.max() <= a.tol:
            ok = False
    print(f"\nlm-eval local-completions vs the NumPy reference ({a.model}):")
    print(f"{'daemon config':<14}{'items':>6}{'requests':>9}{'acc':>7}{'ref acc':>8}"
          f"{'same pick':>10}{'mean |dLL|':>12}{'max |dLL|':>11}{'lm-eval s':>10}")
    for name, n, nr, acc, racc, same, mean, mx, secs in rows:
        print(f"{name:<14}{n:>6}{nr:>9}{acc:>7.3f}{racc:>8.3f}{same:>6}/{n:<3}"
              f"{mean:>12.2e}{mx:>11.2e}{secs:>10.1f}")
    print(f"reference config: every loglikelihood within {a.tol:g} nats: "
          f"{'yes' if ok else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
