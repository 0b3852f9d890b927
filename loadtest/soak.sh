#!/usr/bin/env bash
# The soak: dualpathd on the default model with its default settings, under
# dp-loadgen at 32 concurrent requests for a given time, mixed as clients
# mix them (four dp-loadgen processes side by side):
#   12  multi-turn chat sessions, streamed, no max_tokens (the common case)
#    8  non-streamed completions
#    6  streamed completions whose client gives up after 2 s (cancelled midway),
#       arriving at 0.3/s (a closed loop would mostly prefill prompts for nobody)
#    6  streamed completions sharing a system prompt
# Then checks what must hold after any load: the daemon alive, no 5xx,
# nothing running or waiting, every KV block free (the prefix cache may hold
# blocks a new request would take back: those are reported), and resident
# memory at the end within 5 % of its value after warm-up. Writes its figures
# to OUT (default /tmp/dualpath-soak) and exits non-zero when a check fails.
#   usage: loadtest/soak.sh [SECONDS (default 600)] [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
. loadtest/serve_lib.sh
SECS="${1:-600}"
OUT="${2:-/tmp/dualpath-soak}"
BIN="${DUALPATHD_BIN:-build/daemon/dualpathd}"
LG=build/loadtest/dp-loadgen
MODEL="${DUALPATHD_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
WARMUP="${SOAK_WARMUP_S:-60}"
mkdir -p "$OUT"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
URL="http://127.0.0.1:$PORT"
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Haswell}"

"$BIN" --config "" --model "$MODEL" --listen "127.0.0.1:$PORT" >"$OUT/dualpathd.log" 2>&1 &
PID=$!
trap 'kill -KILL $PID 2>/dev/null || true' EXIT
wait_health || { echo "soak: the daemon did not start" >&2; exit 1; }
rss() { awk '/^VmRSS/ {print $2}' "/proc/$PID/status"; }
metric() { curl -s "$URL/metrics" | awk -v k="$1" '$1 == k {print $2}'; }

# /health's 503s while loading are not failures: count from here.
FIVEXX0=$(curl -s "$URL/metrics" | awk '/^dualpath_http_responses_total\{code="5/ {s += $2} END {print s + 0}')
echo "soak: dualpathd pid $PID on $URL, $SECS s at concurrency 32; figures in $OUT"
common=(--base-url "$URL" -n 0 -t "$SECS" --seed 7 --no-progress -q --temperature 0.7)
$LG "${common[@]}" --api chat --workload chat --turns 4 --input-len 24:80 --no-max-tokens \
    -c 12 --json "$OUT/chat.json" --timeout 300 &
P1=$!
$LG "${common[@]}" --workload random --input-len 32:256 --output-len 16:96 --no-stream \
    -c 8 --json "$OUT/nonstream.json" --timeout 300 &
P2=$!
$LG "${common[@]}" --workload random --input-len 64:256 --output-len 400 --ignore-eos \
    -c 6 --rate 0.3 --json "$OUT/cancelled.json" --timeout 2 &
P3=$!
$LG "${common[@]}" --workload prefix --prefix-len 200 --num-prefixes 2 --input-len 16:48 \
    --output-len 32:128 -c 6 --json "$OUT/prefix.json" --timeout 300 &
P4=$!

sleep "$WARMUP"
RSS_WARM=$(rss)
echo "soak: resident memory after ${WARMUP} s of load: $RSS_WARM KiB"
wait $P1 $P2 $P3 $P4 || true

fail=0
check() { if eval "$2"; then echo "soak: ok   $1"; else echo "soak: FAIL $1"; fail=1; fi; }
kill -0 "$PID" 2>/dev/null || { echo "soak: FAIL the daemon died" >&2; tail -30 "$OUT/dualpathd.log" >&2; exit 1; }
# Cancelled requests finish asynchronously: wait for the engine to settle.
for _ in $(seq 1 600); do
    [ "$(metric dualpath_requests_running)" = 0 ] && [ "$(metric dualpath_requests_waiting)" = 0 ] && break
    sleep 0.1
done
RSS_END=$(rss)
curl -s "$URL/metrics" >"$OUT/metrics.txt"
running=$(metric dualpath_requests_running)
waiting=$(metric dualpath_requests_waiting)
used_p=$(metric 'dualpath_kv_blocks_used{pool="prefill"}')
used_d=$(metric 'dualpath_kv_blocks_used{pool="decode"}')
fivexx=$(awk -v z="$FIVEXX0" '/^dualpath_http_responses_total\{code="5/ {s += $2} END {print s - z}' \
    "$OUT/metrics.txt")
codes=$(awk -F'[{}"]' '/^dualpath_http_responses_total\{/ {printf "%s=%s ", $3, $5}' "$OUT/metrics.txt")
python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import json, sys
out = sys.argv[1]
for name in ("chat", "nonstream", "cancelled", "prefix"):
    r = json.load(open(f"{out}/{name}.json"))
    fails = r.get("failures_by_reason") or {}
    print(f"{name:10} completed={r['completed']} failed={r['failed']} "
          f"incomplete={r['incomplete']} output_tokens={r['total_output_tokens']} "
          f"output_tok/s={r['output_throughput']:.1f} failures={fails}")
PY
echo "soak: responses by status: $codes"
echo "soak: resident memory $RSS_WARM KiB after warm-up, $RSS_END KiB at the end"
check "no 5xx responses ($fivexx)" '[ "$fivexx" = 0 ]'
check "nothing running or waiting ($running, $waiting)" '[ "$running" = 0 ] && [ "$waiting" = 0 ]'
check "every KV block free (prefill $used_p, decode $used_d used)" '[ "$used_p" = 0 ] && [ "$used_d" = 0 ]'
check "resident memory within 5 % of warm-up" \
    'python3 -c "import sys; sys.exit(0 if abs($RSS_END - $RSS_WARM) <= 0.05 * $RSS_WARM else 1)"'
grep -E "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:" "$OUT/dualpathd.log" && fail=1
kill -TERM "$PID"
wait "$PID" && echo "soak: ok   dualpathd exited 0 on SIGTERM" || { echo "soak: FAIL exit status"; fail=1; }
trap - EXIT
exit $fail
