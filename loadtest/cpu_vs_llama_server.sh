#!/usr/bin/env bash
# cpu_vs_llama_server.sh: the served CPU comparison, over HTTP with dp-loadgen:
# llama.cpp's llama-server and dualpathd in turn at each concurrency, same
# GGUF, same threads, each server on its defaults (dualpathd: its default
# config; llama-server: -np = the concurrency, a context of that many
# requests, f16 KV as both default to).
#
#   usage: loadtest/cpu_vs_llama_server.sh [--out FILE] [--types "Q4_K_M Q8_0 ..."]
#
# --types: the model requantized to each type by llama.cpp's llama-quantize
# (tools/requant.sh, cached); a table per type, in the order given.
#
# Workload: random prompts of 256 words (about 256 tokens), max_tokens 128
# with ignore_eos so that every reply has 128 tokens, temperature 0,
# streamed. Reported per server and concurrency: output tok/s (streamed:
# every token that arrived within the time limit, also of requests still
# running then; completed: tokens of finished requests), TTFT p50/p99, TPOT
# p50, and dualpathd / llama-server ratios.
#
# Environment: CONCS (default "1 8 32"), THREADS (default 2), CELL_S (time
# limit per run, default 120), REQS_PER_CONC (requests per run = concurrency
# x this, default 4; at least 8), DP_CPU_LEVEL (dualpathd's kernel level),
# LLAMA_BIN (directory of llama-server; default tools/llama-cpp.sh's build).
set -u -o pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
OUT=""
TYPES=""
while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT=$2; shift 2 ;;
        --types) TYPES=$2; shift 2 ;;
        *) echo "usage: $0 [--out FILE] [--types \"Q4_K_M Q8_0 ...\"]" >&2; exit 2 ;;
    esac
done
CONCS=${CONCS:-1 8 32}
THREADS=${THREADS:-2}
CELL_S=${CELL_S:-120}
PER=${REQS_PER_CONC:-4}
MODEL=${DP_MODEL_PATH:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
DAEMON=${DP_DAEMON:-$root/build/daemon/dualpathd}
LOADGEN=${DP_LOADGEN:-$root/build/loadtest/dp-loadgen}
LLAMA_BIN=${LLAMA_BIN:-$("$root/tools/llama-cpp.sh")} || { echo "no llama.cpp build" >&2; exit 1; }
PY=${DP_CACHE:-$HOME/.cache/dualpath}/venv/bin/python
PORT=${DP_PORT:-8098}
URL=http://127.0.0.1:$PORT
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell}
work=$(mktemp -d /tmp/dp-cpu-served.XXXXXX)

. "$here/serve_lib.sh"
cell() { # name conc command...
    local name=$1 c=$2; shift 2
    "$@" >"$work/$name-$c.log" 2>&1 & local pid=$!
    wait_health || { echo "$name did not start; see $work/$name-$c.log" >&2; kill $pid; return 1; }
    local n=$(( c * PER )); [ $n -lt 8 ] && n=8
    "$LOADGEN" --base-url "$URL" --api completions --no-progress -q -t "$CELL_S" --seed 11 \
        --workload random --input-len 256 --output-len 128 --ignore-eos -n "$n" -c "$c" \
        --json "$work/$name-$c.json" >/dev/null 2>"$work/$name-$c.err"
    kill -TERM $pid; wait $pid 2>/dev/null
}
models=("$MODEL")
if [ -n "$TYPES" ]; then
    # shellcheck disable=SC2086
    mapfile -t models < <("$root/tools/requant.sh" --model "$MODEL" $TYPES)
    [ ${#models[@]} -gt 0 ] || exit 1
fi
[ -n "$OUT" ] && : > "$OUT"
base=$work
for MODEL in "${models[@]}"; do
work=$base/$(basename "$MODEL" .gguf)
mkdir -p "$work"
for c in $CONCS; do
    cell llama-server "$c" "$LLAMA_BIN/llama-server" -m "$MODEL" --host 127.0.0.1 --port "$PORT" \
        -t "$THREADS" -np "$c" -c $(( c * 512 ))
    cell dualpathd "$c" "$DAEMON" --config= --model "$MODEL" --listen "127.0.0.1:$PORT" --threads "$THREADS"
done
kern=$(sed -n 's/.*(cpu backend, \([a-z0-9]*\) kernels, \([a-z0-9]*\) matmul.*/\1, \2 matmul/p' \
    "$work"/dualpathd-*.log | head -1)
{
    [ ${#models[@]} -gt 1 ] && echo "== $(basename "$MODEL")"
    echo "threads $THREADS; 256-word prompts, 128 output tokens (ignore_eos), temperature 0, streamed;"
    echo "dualpathd: default config (${kern:-?} kernels); llama-server: -np = concurrency, -c = 512 per slot."
    echo "Time limit ${CELL_S} s per run; servers alternate at each concurrency."
    echo
    echo "| concurrency | server | streamed tok/s | completed tok/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | completed |"
    echo "|---|---|---|---|---|---|---|---|"
    "$PY" - "$work" $CONCS <<'PY'
import json, os, sys
work, concs = sys.argv[1], sys.argv[2:]
for c in concs:
    rows = {}
    for name in ("llama-server", "dualpathd"):
        p = os.path.join(work, f"{name}-{c}.json")
        if not os.path.exists(p):
            print(f"| {c} | {name} | failed | | | | | |")
            continue
        r = rows[name] = json.load(open(p))
        print(f"| {c} | {name} | {r['streamed_output_throughput']:.1f} | {r['output_throughput']:.1f} | {r['median_ttft_ms']:.0f} | "
              f"{r['p99_ttft_ms']:.0f} | {r['median_tpot_ms']:.1f} | {r['completed']} |")
    if len(rows) == 2:
        l, d = rows["llama-server"], rows["dualpathd"]
        ratio = lambda a, b: f"{a / b:.2f}x" if b else "-"
        print(f"| {c} | **ratio** dualpathd / llama-server | **{ratio(d['streamed_output_throughput'], l['streamed_output_throughput'])}** | "
              f"{ratio(d['output_throughput'], l['output_throughput'])} | "
              f"{ratio(d['median_ttft_ms'], l['median_ttft_ms'])} | {ratio(d['p99_ttft_ms'], l['p99_ttft_ms'])} | "
              f"{ratio(d['median_tpot_ms'], l['median_tpot_ms'])} | |")
PY
    echo
} | tee ${OUT:+-a "$OUT"}
done
echo "logs and JSON in $base" >&2
