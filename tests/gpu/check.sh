#!/usr/bin/env bash
# check.sh: builds the CUDA configuration (build-gpu) for the local GPU and checks it:
# check_kernels (every CUDA op against the CPU reference on fixed-seed random
# inputs, greedy generation on both backends on a synthetic model, the 7B-shaped
# benchmark), then one chat completion served over HTTP by dualpathd on the GPU.
# Runs on a bare, offline CUDA machine: when .gpu-deps/ is there (made by
# tests/gpu/prepare.sh on a networked machine) its .deb files are unpacked into
# a private prefix (tests/gpu/offline_env.sh) instead of calling scripts/deps.sh.
#
# Usage: tests/gpu/check.sh [--out DIR] [--quick] [--serve-only] [check_kernels options:
#                           --seed N, --no-bench, --bench-only, ...]
#   --out DIR      write check.log (the whole output), summary.json (steps, exit status,
#                  what failed) and dualpathd.log there (default: BUILD/check-out)
#   --quick        kernels without the benchmark + the served request (under 3 minutes)
#   --serve-only   the build and the served request only (DP_GPU_SERVE_DEVICE=cpu
#                  serves on the CPU: the step itself, checked without a GPU)
# Environment: DP_GPU_BUILD (build-gpu), DP_GPU_DEPS (.gpu-deps), DP_GPU_DEPS_PREFIX
#   (build-gpu-deps), DP_CUDA_ARCH (e.g. 90; default: the local GPU's, from nvidia-smi,
#   else the build's list), DP_GPU_JOBS (ninja -j), DP_GPU_CHECK_LIMIT (seconds for
#   check_kernels), DP_GPU_MODEL (the served model; default models/SmolLM2-135M-Instruct.Q4_1.gguf
#   or .gpu-deps/model/*.gguf, else a synthetic one; "synthetic" forces that one),
#   DP_GPU_SERVE_DEVICE (cuda), DP_GPU_SERVE_LIMIT (seconds to /health and the answer).
# Exit: 0 passed; 1 a check failed; 2 build or set-up error; 3 no usable CUDA device
# (the build still ran: a machine without a GPU checks that the CUDA code compiles).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2

QUICK=0
SERVE_ONLY=0
OUT=""
KARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --out) [ $# -ge 2 ] || { echo "check.sh: --out needs a folder"; exit 2; }; OUT=$2; shift 2 ;;
        --out=*) OUT=${1#--out=}; shift ;;
        --quick) QUICK=1; shift ;;
        --serve-only) SERVE_ONLY=1; shift ;;
        -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) KARGS+=("$1"); shift ;;
    esac
done

BUILD=${DP_GPU_BUILD:-build-gpu}
DEPS=${DP_GPU_DEPS:-.gpu-deps}
PREFIX=${DP_GPU_DEPS_PREFIX:-build-gpu-deps}
# Time for check_kernels itself; the build takes 1-2 minutes on 16 cores, and
# the whole script must stay under 8 minutes (3 with --quick).
if [ "$QUICK" = 1 ]; then RUN_LIMIT=${DP_GPU_CHECK_LIMIT:-120}; else RUN_LIMIT=${DP_GPU_CHECK_LIMIT:-300}; fi
SERVE_LIMIT=${DP_GPU_SERVE_LIMIT:-120}
SERVE_DEVICE=${DP_GPU_SERVE_DEVICE:-cuda}
MODE=full
[ "$QUICK" = 1 ] && MODE=quick
[ "$SERVE_ONLY" = 1 ] && MODE=serve-only

[ -n "$OUT" ] || OUT="$BUILD/check-out"
mkdir -p "$OUT" || { echo "check.sh: cannot create $OUT"; exit 2; }
OUT=$(cd "$OUT" && pwd)
LOG="$OUT/check.log"
: > "$LOG"
rm -f "$OUT/summary.json"
exec > >(tee -a "$LOG") 2>&1
TEE_PID=$!

# ---- the summary -----------------------------------------------------------
T_START=$(date +%s)
STARTED=$(date -u +%Y-%m-%dT%H:%M:%SZ)
STEPS_JSON=()
FAILED=()
INFO_ARCH="" INFO_DEPS="" INFO_DEVICE="" INFO_MODEL="" INFO_ANSWER=""
STEP_NAME="" STEP_T0=0 SERVE_PID=""

json_str() {
    local s
    s=$(printf '%s' "$1" | tr -d '\000-\010\013\014\016-\037')
    s=${s//\\/\\\\}; s=${s//\"/\\\"}; s=${s//$'\n'/\\n}; s=${s//$'\t'/\\t}; s=${s//$'\r'/\\r}
    printf '"%s"' "$s"
}
step() {
    STEP_NAME=$1
    STEP_T0=$(date +%s)
    echo "check.sh: == $1"
}
# step_done STATUS RC DETAIL: STATUS ok, failed, warning or skipped.
step_done() {
    STEPS_JSON+=("{\"name\": $(json_str "$STEP_NAME"), \"status\": $(json_str "$1"), \"rc\": $2, \"seconds\": $(( $(date +%s) - STEP_T0 )), \"detail\": $(json_str "${3:-}")}")
    [ "$1" = failed ] && FAILED+=("$STEP_NAME")
    STEP_NAME=""
}
# finish RC MESSAGE: the summary, the log flushed, exit RC.
finish() {
    local rc=$1 msg=$2 result s i
    trap - EXIT
    # A daemon of the serve step left by an interruption.
    [ -n "$SERVE_PID" ] && kill -KILL "$SERVE_PID" 2>/dev/null
    [ -n "$STEP_NAME" ] && step_done failed "$rc" "$msg"
    case $rc in 0) result=passed ;; 1) result=failed ;; 3) result="no usable CUDA device" ;; *) result="build or set-up error" ;; esac
    echo "check.sh: $msg"
    echo "check.sh: exit $rc ($result) after $(( $(date +%s) - T_START )) s; log and summary.json in $OUT"
    {
        printf '{\n  "mode": %s,\n  "exit": %d,\n  "result": %s,\n  "message": %s,\n' \
            "$(json_str "$MODE")" "$rc" "$(json_str "$result")" "$(json_str "$msg")"
        printf '  "failed": ['
        s=""; for i in "${FAILED[@]}"; do printf '%s%s' "$s" "$(json_str "$i")"; s=", "; done
        printf '],\n  "started": %s,\n  "finished": %s,\n  "seconds": %d,\n' "$(json_str "$STARTED")" \
            "$(json_str "$(date -u +%Y-%m-%dT%H:%M:%SZ)")" $(( $(date +%s) - T_START ))
        printf '  "build": %s,\n  "deps": %s,\n  "gpu_arch": %s,\n  "device": %s,\n' "$(json_str "$BUILD")" \
            "$(json_str "$INFO_DEPS")" "$(json_str "${INFO_ARCH:-default}")" "$(json_str "$INFO_DEVICE")"
        printf '  "served_model": %s,\n  "served_answer": %s,\n  "log": "check.log",\n  "steps": [' \
            "$(json_str "$INFO_MODEL")" "$(json_str "$INFO_ANSWER")"
        s="\n"; for i in "${STEPS_JSON[@]}"; do printf "$s    %s" "$i"; s=",\n"; done
        printf '\n  ]\n}\n'
    } > "$OUT/summary.json"
    # Let tee write the last lines before the caller reads the log.
    exec >&- 2>&-
    wait "$TEE_PID" 2>/dev/null
    exit "$rc"
}
trap 'finish 2 "interrupted"' INT TERM
trap 'finish 2 "check.sh stopped unexpectedly"' EXIT

echo "check.sh: mode $MODE, build $BUILD, output $OUT, started $STARTED"

# ---- dependencies ----------------------------------------------------------
step deps
if [ -d "$DEPS" ]; then
    # Offline: the carried .deb files, unpacked into a private prefix; the
    # system's own dev packages (if any) are not seen by pkg-config.
    # shellcheck source=tests/gpu/offline_env.sh
    . tests/gpu/offline_env.sh "$DEPS" "$PREFIX" || finish 2 "could not set up the libraries from $DEPS"
    INFO_DEPS="offline: $DEPS unpacked into $DP_DEPS_PREFIX"
    step_done ok 0 "$INFO_DEPS"
elif [ -x scripts/deps.sh ]; then
    # Not fatal: a machine without network access may still have everything.
    INFO_DEPS="system packages"
    scripts/deps.sh
    drc=$?
    if [ $drc -eq 0 ]; then step_done ok 0 "scripts/deps.sh"
    else
        echo "check.sh: scripts/deps.sh failed; trying the build anyway"
        step_done warning "$drc" "scripts/deps.sh failed (no network?); trying the build anyway"
    fi
else
    INFO_DEPS="system packages"
    step_done skipped 0 "no $DEPS and no scripts/deps.sh"
fi

step nvcc
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="$PATH:/usr/local/cuda/bin"
fi
if ! command -v nvcc >/dev/null 2>&1; then
    finish 2 "nvcc not found (install the CUDA toolkit, or put it on PATH)"
fi
step_done ok 0 "$(nvcc --version | grep -m 1 release)"

# ---- configure: the local GPU's architecture only, warnings not fatal -------
step configure
ARCH=${DP_CUDA_ARCH:-}
if [ -z "$ARCH" ] && command -v nvidia-smi >/dev/null 2>&1; then
    ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
           tr -d ' .' | grep -E '^[0-9]+$' | sort -u | paste -sd, -)
fi
INFO_ARCH=$ARCH
OPTS=(-Dcuda=enabled -Dwerror=false "-Dgpu_arch=$ARCH")
# Configured again when the options or the library environment changed (a
# build directory made with the system's packages must not keep their paths).
FP="${OPTS[*]} | ${PKG_CONFIG_LIBDIR:-} | $(command -v nvcc)"
if [ -f "$BUILD/build.ninja" ] && [ "$(cat "$BUILD/.check-config" 2>/dev/null)" = "$FP" ]; then
    echo "check.sh: $BUILD configured already (${OPTS[*]})"
elif [ -f "$BUILD/build.ninja" ]; then
    meson setup --reconfigure "$BUILD" "${OPTS[@]}" || finish 2 "meson setup --reconfigure failed"
else
    meson setup "$BUILD" "${OPTS[@]}" || finish 2 "meson setup failed"
fi
printf '%s' "$FP" > "$BUILD/.check-config"
step_done ok 0 "gpu_arch=${ARCH:-default}"

step build
# What this script runs, not the whole tree (the emulator tests and the rest
# are CI's): faster on the GPU machine.
TARGETS=(daemon/dualpathd tests/gpu/check_kernels tools/dp-synth)
JOBS=()
[ -n "${DP_GPU_JOBS:-}" ] && JOBS=(-j "$DP_GPU_JOBS")
echo "check.sh: building ${TARGETS[*]} in $BUILD"
ninja -C "$BUILD" "${JOBS[@]}" "${TARGETS[@]}" || finish 2 "build failed"
step_done ok 0 "${TARGETS[*]}"

# ---- the device: nvidia-smi first (clear message when the driver is missing),
# then check_kernels itself exits 3 when the runtime finds no usable device.
if [ "$SERVE_ONLY" = 0 ] || [ "$SERVE_DEVICE" != cpu ]; then
    step device
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        finish 3 "no usable CUDA device: nvidia-smi not found (no NVIDIA driver on this machine); built only"
    fi
    if ! smi=$(nvidia-smi -L 2>&1) || [ -z "$smi" ]; then
        finish 3 "no usable CUDA device: nvidia-smi failed: $(printf '%s' "$smi" | head -n 1); built only"
    fi
    INFO_DEVICE=$(printf '%s' "$smi" | head -n 1)
    echo "check.sh: $smi"
    step_done ok 0 "$INFO_DEVICE"
fi

RC=0
if [ "$SERVE_ONLY" = 0 ]; then
    step kernels
    KA=("${KARGS[@]}")
    [ "$QUICK" = 1 ] && KA=(--no-bench "${KA[@]}")
    echo "check.sh: $BUILD/tests/gpu/check_kernels ${KA[*]} (limit ${RUN_LIMIT} s)"
    timeout "$RUN_LIMIT" "$BUILD/tests/gpu/check_kernels" "${KA[@]}"
    krc=$?
    case $krc in
        0) step_done ok 0 "all kernel checks passed" ;;
        3) finish 3 "no usable CUDA device: the CUDA runtime refused it (message above); built only" ;;
        124) step_done failed 124 "check_kernels ran past ${RUN_LIMIT} s"; RC=2 ;;
        2) step_done failed 2 "check_kernels: set-up error"; RC=2 ;;
        *) step_done failed "$krc" "check_kernels: a check FAILED (exit $krc)"; RC=1 ;;
    esac
fi

# ---- one chat completion served by dualpathd on the GPU ---------------------
# A real request through the whole daemon: start it on a free port, wait for
# /health, one greedy chat completion (a non-empty answer), /metrics naming the
# backend, SIGTERM, exit status 0.
# serve_check [NAME DAEMON-ARGS...]: NAME (default none) names its log
# (dualpathd-NAME.log); a named run sends a prompt long enough to migrate to
# the decode path, and checks /metrics for the migration.
serve_check() {
    local bin="$BUILD/daemon/dualpathd" model="${DP_GPU_MODEL:-}" port pid body resp answer i rc
    local name="${1:-}" dlog="$OUT/dualpathd.log" synthetic=0
    [ $# -gt 0 ] && shift
    [ -n "$name" ] && dlog="$OUT/dualpathd-$name.log"
    if [ -z "$model" ]; then
        for model in models/SmolLM2-135M-Instruct.Q4_1.gguf "$DEPS"/model/*.gguf ""; do
            [ -f "$model" ] && break
        done
    elif [ "$model" = synthetic ]; then
        model=""
    elif [ ! -f "$model" ]; then
        SERVE_DETAIL="DP_GPU_MODEL=$model: no such file"
        return 2
    fi
    if [ -z "$model" ]; then
        # The default model did not travel (it exceeds the carry budget):
        # a synthetic one of its shape, random weights, a chat template.
        model="$BUILD/synthetic-smollm.gguf"    # not in OUT: 85 MB would travel back
        synthetic=1
        echo "check.sh: no default model here; serving a synthetic one ($model)"
        "$BUILD/tools/dp-synth" --out "$model" --shape smollm --type q4_1 --seed 1 ||
            { SERVE_DETAIL="dp-synth failed"; return 2; }
        INFO_MODEL="synthetic (dp-synth --shape smollm --type q4_1 --seed 1): default model absent"
    else
        INFO_MODEL=$model
    fi
    if command -v python3 >/dev/null 2>&1; then
        port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    else
        port=$(( 20000 + RANDOM % 20000 ))
    fi
    echo "check.sh: $bin --model $model --device $SERVE_DEVICE --listen 127.0.0.1:$port $* (log: $dlog)"
    "$bin" --config "" --model "$model" --device "$SERVE_DEVICE" --listen "127.0.0.1:$port" "$@" \
        > "$dlog" 2>&1 &
    pid=$!
    SERVE_PID=$pid
    local url="http://127.0.0.1:$port" deadline=$(( $(date +%s) + SERVE_LIMIT ))
    # _http METHOD PATH [BODY]: the response body on stdout; fails on a non-2xx
    # status. Python first (the GPU image has it), curl where there is none
    # (DP_GPU_HTTP=curl: curl anyway).
    _http() {
        if [ "${DP_GPU_HTTP:-}" = curl ] || ! command -v python3 >/dev/null 2>&1; then
            if [ $# -ge 3 ]; then curl -sS -f -m 120 -H 'Content-Type: application/json' -d "$3" "$url$2"
            else curl -sf -m 5 "$url$2"; fi
        else
            python3 - "$1" "$url$2" "${3:-}" <<'EOF'
import sys, urllib.request
m, u, b = sys.argv[1], sys.argv[2], sys.argv[3]
r = urllib.request.Request(u, data=b.encode() if b else None, method=m,
                           headers={"Content-Type": "application/json"})
sys.stdout.write(urllib.request.urlopen(r, timeout=120).read().decode())
EOF
        fi
    }
    while :; do
        if ! kill -0 "$pid" 2>/dev/null; then
            wait "$pid"; rc=$?
            tail -n 20 "$dlog"
            SERVE_DETAIL="dualpathd exited with $rc before /health answered"
            return 1
        fi
        _http GET /health >/dev/null 2>&1 && break
        if [ "$(date +%s)" -ge "$deadline" ]; then
            kill -KILL "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
            tail -n 20 "$dlog"
            SERVE_DETAIL="/health not 200 within ${SERVE_LIMIT} s"
            return 1
        fi
        sleep 0.2
    done
    echo "check.sh: /health answered after $(( SERVE_LIMIT - (deadline - $(date +%s)) )) s"
    local content="What is the capital of France? Answer in one sentence."
    if [ -n "$name" ]; then
        # About 250 tokens: past the compression floor, so the prompt moves
        # to the decode path (and its type) at its end.
        content="$(printf 'The harbour of Marseille is old and busy, and boats come in every morning. %.0s' $(seq 1 15))$content"
    fi
    body='{"messages": [{"role": "user", "content": "'"$content"'"}], "max_tokens": 24, "temperature": 0'
    # Random weights may well pick the end token first: the synthetic model's
    # answer must not stop there.
    [ "$synthetic" = 1 ] && body="$body, \"ignore_eos\": true"
    body="$body}"
    resp=$(_http POST /v1/chat/completions "$body" 2>&1)
    rc=$?
    echo "check.sh: response: $resp"
    answer=""
    if [ $rc -eq 0 ]; then
        if [ "${DP_GPU_HTTP:-}" != curl ] && command -v python3 >/dev/null 2>&1; then
            answer=$(printf '%s' "$resp" | python3 -c 'import json, sys
c = json.load(sys.stdin)["choices"][0]["message"]["content"]
sys.stdout.buffer.write(c.encode("utf-8", "backslashreplace"))' 2>/dev/null)
        else
            answer=$(printf '%s' "$resp" | sed -n 's/.*"content": *"\([^"]*\)".*/\1/p')
        fi
    fi
    INFO_ANSWER=$answer
    local ok=1 why=""
    if [ $rc -ne 0 ]; then ok=0; why="the chat completion failed (curl/urllib status $rc)"
    elif [ -z "${answer//[[:space:]]/}" ]; then ok=0; why="the chat completion's answer is empty"
    fi
    # The request must have run on the device asked for, not on a fallback.
    local want_backend=$SERVE_DEVICE
    case "$want_backend" in cuda*) want_backend=cuda ;; esac
    if [ $ok = 1 ] && ! _http GET /metrics 2>/dev/null | grep -q "backend=\"$want_backend\""; then
        ok=0; why="/metrics does not name the $want_backend backend"
    fi
    if [ $ok = 1 ] && [ -n "$name" ] &&
        ! _http GET /metrics 2>/dev/null | grep -q '^dualpath_migrations_total{.*} [1-9]'; then
        ok=0; why="no migration to the decode path ($*)"
    fi
    kill -TERM "$pid" 2>/dev/null
    for i in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
        kill -KILL "$pid"; wait "$pid" 2>/dev/null
        [ $ok = 1 ] && { ok=0; why="dualpathd still running 60 s after SIGTERM"; }
    else
        wait "$pid"; rc=$?
        [ $ok = 1 ] && [ $rc -ne 0 ] && { ok=0; why="dualpathd exited with $rc after SIGTERM"; }
    fi
    if [ $ok = 0 ]; then
        tail -n 20 "$dlog"
        SERVE_DETAIL=$why
        return 1
    fi
    SERVE_PID=""
    SERVE_DETAIL="answered on $want_backend: $(printf '%s' "$answer" | head -c 200)"
    echo "check.sh: served answer: $answer"
    return 0
}

# serve_step STEP [NAME DAEMON-ARGS...]
serve_step() {
    step "$1"
    shift
    SERVE_DETAIL=""
    serve_check "$@"
    local src=$?
    SERVE_PID=""
    if [ $src -eq 0 ]; then step_done ok 0 "$SERVE_DETAIL"
    else
        step_done failed "$src" "$SERVE_DETAIL"
        [ $src -eq 2 ] && [ $RC -eq 0 ] && RC=2
        [ $src -eq 1 ] && { [ $RC -eq 0 ] || [ $RC -eq 2 ]; } && RC=1
    fi
}

serve_step serve
# The quantized decode path on the device (the CPU's auto; CUDA's is f16 until
# this has run on one): a long prompt migrates into a q8_0 view of the arena.
serve_step serve-q8_0 q8_0 --decode-kv-type q8_0

case $RC in
    0) finish 0 "all GPU checks passed" ;;
    1) finish 1 "GPU checks FAILED: ${FAILED[*]}" ;;
    *) finish "$RC" "GPU checks could not run: ${FAILED[*]}" ;;
esac
