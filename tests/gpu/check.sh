#!/usr/bin/env bash
# check.sh: builds the CUDA configuration (build-gpu) for the local GPU and checks it:
# check_kernels (every CUDA op against the CPU reference on seeded random inputs,
# greedy generation teacher-forced on both backends on a synthetic model, the
# 7B-shaped benchmark sized to the device's free memory), then one chat completion
# served over HTTP by dualpathd on the GPU, and one that migrates to a q8_0 decode path.
# Runs on a bare, offline CUDA machine: the build's libraries come from .gpu-deps/
# (made by tests/gpu/prepare.sh on a networked machine, carried with the tree),
# unpacked into a private prefix (tests/gpu/offline_env.sh); without it the
# system's packages must be installed (nothing is downloaded here).
#
# Usage: tests/gpu/check.sh [--out DIR] [--quick] [--serve-only] [check_kernels options:
#                           --seed N, --no-bench, --bench-only, ...]
#   --out DIR      write check.log (the whole output), summary.json (steps, exit status,
#                  what failed; rewritten after every step) and dualpathd*.log there
#                  (default: $OUT when set, as on the GPU machine, else BUILD/check-out)
#   --quick        kernels without the benchmark + the served requests
#   --serve-only   the build and the served requests only (DP_GPU_SERVE_DEVICE=cpu
#                  serves on the CPU: the step itself, checked without a GPU)
# One deadline bounds the whole run: 480 s (180 s with --quick; DP_GPU_CHECK_DEADLINE
# sets it). Every step runs under `timeout` with what is left; a step that reaches it
# is marked "timed out" in summary.json and the run ends there (exit 2).
# Environment: DP_GPU_BUILD (build-gpu), DP_GPU_DEPS (.gpu-deps), DP_GPU_DEPS_PREFIX
#   (build-gpu-deps), DP_CUDA_ARCH (e.g. 90; default: the local GPU's, from the CUDA
#   runtime (a probe built here), __nvcc_device_query or nvidia-smi, else the build's
#   list), DP_GPU_JOBS (ninja -j), DP_GPU_CHECK_LIMIT (seconds for check_kernels, within
#   the deadline), DP_GPU_MODEL (the served model; default models/SmolLM2-135M-Instruct.Q4_1.gguf
#   or .gpu-deps/model/*.gguf, else a synthetic one; "synthetic" forces that one),
#   DP_GPU_SERVE_DEVICE (cuda), DP_GPU_SERVE_LIMIT (seconds to /health and the answer),
#   DP_GPU_CHECK_SLEEP (a first step that sleeps that long: the deadline's own test).
# Exit: 0 passed; 1 a check failed (a GPU that is present but unusable included);
# 2 build or set-up error, or the deadline reached; 3 no GPU on this machine (the
# build still ran: a machine without one checks that the CUDA code compiles).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2

QUICK=0
SERVE_ONLY=0
OUT_DIR=""
KARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --out) [ $# -ge 2 ] || { echo "check.sh: --out needs a folder"; exit 2; }; OUT_DIR=$2; shift 2 ;;
        --out=*) OUT_DIR=${1#--out=}; shift ;;
        --quick) QUICK=1; shift ;;
        --serve-only) SERVE_ONLY=1; shift ;;
        -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) KARGS+=("$1"); shift ;;
    esac
done

BUILD=${DP_GPU_BUILD:-build-gpu}
DEPS=${DP_GPU_DEPS:-.gpu-deps}
PREFIX=${DP_GPU_DEPS_PREFIX:-build-gpu-deps}
if [ "$QUICK" = 1 ]; then DEADLINE_S=${DP_GPU_CHECK_DEADLINE:-180}; else DEADLINE_S=${DP_GPU_CHECK_DEADLINE:-480}; fi
RUN_LIMIT=${DP_GPU_CHECK_LIMIT:-}
SERVE_LIMIT=${DP_GPU_SERVE_LIMIT:-120}
SERVE_DEVICE=${DP_GPU_SERVE_DEVICE:-cuda}
MODE=full
[ "$QUICK" = 1 ] && MODE=quick
[ "$SERVE_ONLY" = 1 ] && MODE=serve-only

# The GPU machine returns what is written under $OUT: that is the default.
[ -n "$OUT_DIR" ] || OUT_DIR=${OUT:-$BUILD/check-out}
mkdir -p "$OUT_DIR" || { echo "check.sh: cannot create $OUT_DIR"; exit 2; }
OUT_DIR=$(cd "$OUT_DIR" && pwd)
LOG="$OUT_DIR/check.log"
: > "$LOG"
rm -f "$OUT_DIR/summary.json"
exec > >(tee -a "$LOG") 2>&1
TEE_PID=$!

# ---- the deadline and the summary ------------------------------------------
T_START=$(date +%s)
T_END=$(( T_START + DEADLINE_S ))
# Seconds kept back from every step for the summary and the daemon's stop
# (1 for a deadline under a minute: the deadline's own test runs 5 s).
MARGIN=5
[ "$DEADLINE_S" -lt 60 ] && MARGIN=1
STARTED=$(date -u +%Y-%m-%dT%H:%M:%SZ)
STEPS_JSON=()
FAILED=()
INFO_ARCH="" INFO_DEPS="" INFO_DEVICE="" INFO_PROBE="" INFO_MODEL="" INFO_ANSWER=""
STEP_NAME="" STEP_T0=0 SERVE_PID=""
GPU_SEEN="" PROBE_RC=""

# Seconds a step may still run (0 when the deadline has come).
left() {
    local l=$(( T_END - $(date +%s) - MARGIN ))
    [ $l -gt 0 ] && echo $l || echo 0
}
# limited [CAP] -- CMD...: CMD under timeout with what is left (at most CAP
# seconds when given); 124 when it ran out of time (or none was left).
limited() {
    local cap="" l
    if [ "$1" != -- ]; then cap=$1; shift; fi
    shift
    l=$(left)
    [ -n "$cap" ] && [ "$cap" -lt "$l" ] && l=$cap
    [ "$l" -gt 0 ] || return 124
    timeout -k 5 "$l" "$@"
}

json_str() {
    local s
    s=$(printf '%s' "$1" | tr -d '\000-\010\013\014\016-\037')
    s=${s//\\/\\\\}; s=${s//\"/\\\"}; s=${s//$'\n'/\\n}; s=${s//$'\t'/\\t}; s=${s//$'\r'/\\r}
    printf '"%s"' "$s"
}
step() {
    STEP_NAME=$1
    STEP_T0=$(date +%s)
    echo "check.sh: == $1 ($(left) s left)"
    write_summary -1 running "in step $1"
}
# write_summary RC RESULT MESSAGE: summary.json as things stand (after every
# step, so that a run killed from outside still leaves what it did).
write_summary() {
    local rc=$1 result=$2 msg=$3 s i
    {
        printf '{\n  "mode": %s,\n  "exit": %d,\n  "result": %s,\n  "message": %s,\n' \
            "$(json_str "$MODE")" "$rc" "$(json_str "$result")" "$(json_str "$msg")"
        printf '  "failed": ['
        s=""; for i in "${FAILED[@]}"; do printf '%s%s' "$s" "$(json_str "$i")"; s=", "; done
        printf '],\n  "started": %s,\n  "updated": %s,\n  "seconds": %d,\n  "deadline_s": %d,\n' \
            "$(json_str "$STARTED")" "$(json_str "$(date -u +%Y-%m-%dT%H:%M:%SZ)")" \
            $(( $(date +%s) - T_START )) "$DEADLINE_S"
        printf '  "build": %s,\n  "deps": %s,\n  "gpu_arch": %s,\n  "device": %s,\n  "probe": %s,\n' \
            "$(json_str "$BUILD")" "$(json_str "$INFO_DEPS")" "$(json_str "${INFO_ARCH:-default}")" \
            "$(json_str "$INFO_DEVICE")" "$(json_str "$INFO_PROBE")"
        printf '  "served_model": %s,\n  "served_answer": %s,\n  "log": "check.log",\n  "steps": [' \
            "$(json_str "$INFO_MODEL")" "$(json_str "$INFO_ANSWER")"
        s="\n"; for i in "${STEPS_JSON[@]}"; do printf "$s    %s" "$i"; s=",\n"; done
        printf '\n  ]\n}\n'
    } > "$OUT_DIR/summary.json.tmp" && mv -f "$OUT_DIR/summary.json.tmp" "$OUT_DIR/summary.json"
}
# step_done STATUS RC DETAIL: STATUS ok, failed, warning, skipped or "timed out".
step_done() {
    local name=$STEP_NAME
    STEPS_JSON+=("{\"name\": $(json_str "$STEP_NAME"), \"status\": $(json_str "$1"), \"rc\": $2, \"seconds\": $(( $(date +%s) - STEP_T0 )), \"detail\": $(json_str "${3:-}")}")
    [ "$1" = failed ] && FAILED+=("$STEP_NAME")
    [ "$1" = "timed out" ] && FAILED+=("$STEP_NAME (timed out)")
    STEP_NAME=""
    write_summary -1 running "after step $name"
}
# timed_out: the current step reached the deadline; the run ends.
timed_out() {
    local what=$STEP_NAME
    step_done "timed out" 124 "reached the deadline (${DEADLINE_S} s for the whole run)"
    finish 2 "deadline of ${DEADLINE_S} s reached in step $what"
}
# finish RC MESSAGE: the summary, the log flushed, exit RC.
finish() {
    local rc=$1 msg=$2 result
    trap - EXIT
    # A daemon of the serve step left by an interruption.
    [ -n "$SERVE_PID" ] && kill -KILL "$SERVE_PID" 2>/dev/null
    [ -n "$STEP_NAME" ] && step_done failed "$rc" "$msg"
    case $rc in
        0) result=passed ;;
        1) result=failed ;;
        3) result="no GPU on this machine" ;;
        *) case $msg in deadline*) result="timed out" ;; *) result="build or set-up error" ;; esac ;;
    esac
    echo "check.sh: $msg"
    echo "check.sh: exit $rc ($result) after $(( $(date +%s) - T_START )) s; log and summary.json in $OUT_DIR"
    write_summary "$rc" "$result" "$msg"
    # Let tee write the last lines before the caller reads the log.
    exec >&- 2>&-
    wait "$TEE_PID" 2>/dev/null
    exit "$rc"
}
trap 'finish 2 "interrupted"' INT TERM
trap 'finish 2 "check.sh stopped unexpectedly"' EXIT

echo "check.sh: mode $MODE, build $BUILD, output $OUT_DIR, deadline ${DEADLINE_S} s, started $STARTED"
write_summary -1 running "started"

if [ -n "${DP_GPU_CHECK_SLEEP:-}" ]; then
    step sleep
    limited -- sleep "$DP_GPU_CHECK_SLEEP"
    [ $? -eq 124 ] && timed_out
    step_done ok 0 "slept ${DP_GPU_CHECK_SLEEP} s"
fi

# ---- dependencies ----------------------------------------------------------
step deps
if [ -d "$DEPS" ]; then
    # Offline: the carried .deb files, unpacked into a private prefix (bounded
    # by the deadline in a child first; the source below reuses the tree);
    # the system's own dev packages (if any) are not seen by pkg-config.
    limited -- bash -c '. tests/gpu/offline_env.sh "$1" "$2"' _ "$DEPS" "$PREFIX"
    drc=$?
    [ $drc -eq 124 ] && timed_out
    [ $drc -eq 0 ] || finish 2 "could not set up the libraries from $DEPS"
    # shellcheck source=tests/gpu/offline_env.sh
    . tests/gpu/offline_env.sh "$DEPS" "$PREFIX" > /dev/null || finish 2 "could not set up the libraries from $DEPS"
    INFO_DEPS="offline: $DEPS unpacked into $DP_DEPS_PREFIX"
    step_done ok 0 "$INFO_DEPS"
else
    # Nothing is installed from here (the GPU machine is offline: apt-get
    # would only wait): the system's packages must already be there.
    missing=()
    for m in libuv libmicrohttpd libcjson openblas; do
        command -v pkg-config >/dev/null 2>&1 && pkg-config --exists "$m" 2>/dev/null || missing+=("$m")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        finish 2 "no $DEPS and the system lacks ${missing[*]}: carry .gpu-deps (tests/gpu/prepare.sh makes it on a networked machine; pass carry [\".gpu-deps\"] with the tree), or install them (scripts/deps.sh)"
    fi
    INFO_DEPS="system packages"
    step_done ok 0 "system packages (libuv, libmicrohttpd, libcjson, openblas found by pkg-config)"
fi

step nvcc
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="$PATH:/usr/local/cuda/bin"
fi
if ! command -v nvcc >/dev/null 2>&1; then
    finish 2 "nvcc not found (install the CUDA toolkit, or put it on PATH)"
fi
nv=$(limited -- nvcc --version)
[ $? -eq 124 ] && timed_out
step_done ok 0 "$(printf '%s' "$nv" | grep -m 1 release)"

# ---- the GPU, as the CUDA runtime sees it ----------------------------------
# Nothing here stops the run: each way of asking may be missing (no
# nvidia-smi on the image, a toolkit without __nvcc_device_query); the
# architecture then falls back to the build's list, and check_kernels asks
# the runtime itself.
step probe
# A GPU is present when the kernel driver lists one, whatever the runtime
# makes of it (a driver older than the runtime is a failure, not "no GPU").
gpus=""
for g in /proc/driver/nvidia/gpus/*; do [ -e "$g" ] && gpus="$gpus ${g##*/}"; done
[ -n "$gpus" ] && GPU_SEEN="kernel driver lists$gpus"
if [ -z "$GPU_SEEN" ] && ls /dev/nvidia[0-9]* >/dev/null 2>&1; then GPU_SEEN="$(ls /dev/nvidia[0-9]* | head -n 1) exists"; fi
mkdir -p "$BUILD"
ARCH=${DP_CUDA_ARCH:-}
probe_out=""
if limited 60 -- nvcc -o "$BUILD/cuda-probe" tests/gpu/probe.cu > "$OUT_DIR/probe-build.log" 2>&1; then
    probe_out=$(limited 30 -- "$BUILD/cuda-probe" 2>&1)
    PROBE_RC=$?
    echo "$probe_out" | sed 's/^/check.sh: probe: /'
    INFO_PROBE=$(printf '%s' "$probe_out" | paste -sd ';' -)
    if [ $PROBE_RC -eq 0 ]; then
        [ -n "$GPU_SEEN" ] || GPU_SEEN="the CUDA runtime lists one"
        INFO_DEVICE=$(printf '%s' "$probe_out" | grep -m 1 '^device 0:' | sed 's/^device 0: //')
        [ -n "$ARCH" ] || ARCH=$(printf '%s' "$probe_out" | sed -n 's/.*, cc \([0-9]*\)\.\([0-9]*\),.*/\1\2/p' | sort -u | paste -sd, -)
    fi
else
    echo "check.sh: the probe did not build (see probe-build.log); asking other ways"
    INFO_PROBE="did not build"
fi
dq="$(dirname "$(command -v nvcc)")/__nvcc_device_query"
if [ -z "$ARCH" ] && [ -x "$dq" ]; then
    a=$(limited 30 -- "$dq" 2>/dev/null | tr -d ' ' | grep -E '^[0-9]+(,[0-9]+)*$')
    [ -n "$a" ] && ARCH=$a && echo "check.sh: __nvcc_device_query: $a"
fi
if command -v nvidia-smi >/dev/null 2>&1; then
    smi=$(limited 30 -- nvidia-smi -L 2>&1) && [ -n "$smi" ] && {
        [ -n "$GPU_SEEN" ] || GPU_SEEN="nvidia-smi lists one"
        [ -n "$INFO_DEVICE" ] || INFO_DEVICE=$(printf '%s' "$smi" | head -n 1)
        echo "check.sh: nvidia-smi: $smi"
    }
    if [ -z "$ARCH" ]; then
        ARCH=$(limited 30 -- nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
               tr -d ' .' | grep -E '^[0-9]+$' | sort -u | paste -sd, -)
    fi
fi
[ "$(left)" -gt 0 ] || timed_out
INFO_ARCH=$ARCH
step_done ok 0 "GPU ${GPU_SEEN:-not seen}; architecture ${ARCH:-default (the build list)}; probe: ${INFO_PROBE:-none}"

# ---- configure: the local GPU's architecture only, warnings not fatal -------
step configure
OPTS=(-Dcuda=enabled -Dwerror=false "-Dgpu_arch=$ARCH")
# Configured again when the options or the library environment changed (a
# build directory made with the system's packages must not keep their paths).
FP="${OPTS[*]} | ${PKG_CONFIG_LIBDIR:-} | $(command -v nvcc)"
if [ -f "$BUILD/build.ninja" ] && [ "$(cat "$BUILD/.check-config" 2>/dev/null)" = "$FP" ]; then
    echo "check.sh: $BUILD configured already (${OPTS[*]})"
else
    if [ -f "$BUILD/build.ninja" ]; then
        limited -- meson setup --reconfigure "$BUILD" "${OPTS[@]}"
    else
        limited -- meson setup "$BUILD" "${OPTS[@]}"
    fi
    mrc=$?
    [ $mrc -eq 124 ] && timed_out
    [ $mrc -eq 0 ] || finish 2 "meson setup failed"
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
limited -- ninja -C "$BUILD" "${JOBS[@]}" "${TARGETS[@]}"
brc=$?
[ $brc -eq 124 ] && timed_out
[ $brc -eq 0 ] || finish 2 "build failed"
step_done ok 0 "${TARGETS[*]}"

# ---- the device: no GPU here (exit 3, built only), or one the runtime refuses
# (a failure: a driver older than the runtime, a device in a bad state).
if [ "$SERVE_ONLY" = 0 ] || [ "$SERVE_DEVICE" != cpu ]; then
    step device
    if [ -z "$GPU_SEEN" ] && [ "$PROBE_RC" = 1 ]; then
        finish 3 "no GPU on this machine (no kernel driver lists one; the CUDA runtime: $(printf '%s' "$INFO_PROBE" | sed 's/.*error: //')); built only"
    fi
    if [ -n "$GPU_SEEN" ] && [ "$PROBE_RC" = 1 ]; then
        finish 1 "a GPU is present ($GPU_SEEN) but the CUDA runtime refuses it: $(printf '%s' "$INFO_PROBE" | sed 's/.*error: //')"
    fi
    step_done ok 0 "${INFO_DEVICE:-${GPU_SEEN:-not seen by any probe; check_kernels asks the runtime}}"
fi

RC=0
if [ "$SERVE_ONLY" = 0 ]; then
    step kernels
    KA=("${KARGS[@]}")
    [ "$QUICK" = 1 ] && KA=(--no-bench "${KA[@]}")
    echo "check.sh: $BUILD/tests/gpu/check_kernels ${KA[*]} ($(left) s left${RUN_LIMIT:+, at most $RUN_LIMIT s})"
    limited ${RUN_LIMIT:-} -- "$BUILD/tests/gpu/check_kernels" "${KA[@]}"
    krc=$?
    case $krc in
        0) step_done ok 0 "all kernel checks passed" ;;
        3) if [ -n "$GPU_SEEN" ]; then
               finish 1 "a GPU is present ($GPU_SEEN) but the CUDA backend could not be created on it (message above)"
           fi
           finish 3 "no GPU on this machine: the CUDA runtime found no usable device (message above); built only" ;;
        124|137)
           if [ -n "$RUN_LIMIT" ] && [ "$(left)" -gt 0 ]; then
               step_done failed "$krc" "check_kernels ran past DP_GPU_CHECK_LIMIT=${RUN_LIMIT} s"; RC=2
           else
               timed_out
           fi ;;
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
    local name="${1:-}" dlog="$OUT_DIR/dualpathd.log" synthetic=0
    [ $# -gt 0 ] && shift
    [ -n "$name" ] && dlog="$OUT_DIR/dualpathd-$name.log"
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
    # Within the run's deadline too.
    [ "$deadline" -gt $(( T_END - MARGIN )) ] && deadline=$(( T_END - MARGIN ))
    # _http METHOD PATH [BODY]: the response body on stdout; fails on a non-2xx
    # status. Python first (the GPU image has it), curl where there is none
    # (DP_GPU_HTTP=curl: curl anyway).
    _http() {
        if [ "${DP_GPU_HTTP:-}" = curl ] || ! command -v python3 >/dev/null 2>&1; then
            if [ $# -ge 3 ]; then curl -sS -f -m "$(( $(left) > 0 ? $(left) : 1 ))" -H 'Content-Type: application/json' -d "$3" "$url$2"
            else curl -sf -m 5 "$url$2"; fi
        else
            python3 - "$1" "$url$2" "${3:-}" "$(( $(left) > 0 ? $(left) : 1 ))" <<'EOF'
import sys, urllib.request
m, u, b, t = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
r = urllib.request.Request(u, data=b.encode() if b else None, method=m,
                           headers={"Content-Type": "application/json"})
sys.stdout.write(urllib.request.urlopen(r, timeout=min(t, 120)).read().decode())
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
            [ "$(left)" -gt 0 ] || return 124
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
    [ "$(left)" -gt 0 ] || return 124
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
    # Up to 60 s to drain and exit, the margin kept for the summary included.
    local stop_s=$(( $(left) + MARGIN - 1 ))
    [ "$stop_s" -gt 60 ] && stop_s=60
    [ "$stop_s" -lt 1 ] && stop_s=1
    for i in $(seq 1 $(( stop_s * 5 ))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
        kill -KILL "$pid"; wait "$pid" 2>/dev/null
        [ $ok = 1 ] && { ok=0; why="dualpathd still running ${stop_s} s after SIGTERM"; }
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
    [ $src -eq 124 ] && timed_out
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
    0) finish 0 "all GPU checks passed in $(( $(date +%s) - T_START )) s of ${DEADLINE_S}" ;;
    1) finish 1 "GPU checks FAILED: ${FAILED[*]}" ;;
    *) finish "$RC" "GPU checks could not run: ${FAILED[*]}" ;;
esac
