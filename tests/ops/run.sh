#!/usr/bin/env bash
# Operations tests: meson install + systemd-analyze verify, the sd_notify
# protocol (READY/WATCHDOG/STOPPING, a stalled engine stops the watchdog), and
# the per-request log line. No systemd needed as PID 1.
#   usage: tests/ops/run.sh [BUILD_DIR]     (default build; already built)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD="${1:-build}"
BIN="$BUILD/daemon/dualpathd"
MODEL="${DUALPATHD_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
PY="${PY:-python3}"
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Haswell}"
# A sanitized build fails its exit status (and so the tests) on any report.
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
[ -x "$BIN" ] || { echo "ops: $BIN is not built" >&2; exit 1; }
[ -f "$MODEL" ] || { echo "ops: model $MODEL is missing (scripts/fetch-model.sh)" >&2; exit 1; }

echo "ops: meson install --destdir, systemd-analyze verify"
tests/ops/test_install.sh "$BUILD"
echo "ops: sd_notify: READY=1, WATCHDOG=1, STOPPING=1, stalled engine"
"$PY" tests/ops/test_notify.py "$BIN" "$MODEL"
echo "ops: per-request log line"
"$PY" tests/ops/test_access_log.py "$BIN" "$MODEL"
echo "ops: all tests passed"
