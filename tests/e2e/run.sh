#!/usr/bin/env bash
# End-to-end tests: starts dualpathd on the default model on a free port,
# waits for /health, runs the pytest suite (official openai client + raw HTTP),
# then stops the daemon with SIGTERM and checks that it exits 0.
#   usage: tests/e2e/run.sh [BINARY] [-- pytest args]
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN="${1:-build/daemon/dualpathd}"
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
MODEL="${DUALPATHD_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
CACHE="${DP_CACHE:-$HOME/.cache/dualpath}"
PY="$CACHE/venv/bin/python"
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Haswell}"

if ! "$PY" -c 'import openai, pytest' 2>/dev/null; then
    echo "e2e: installing openai + pytest into $CACHE/venv"
    "$CACHE/venv/bin/pip" install --quiet -r tests/requirements.txt
fi
[ -x "$BIN" ] || { echo "e2e: $BIN is not built" >&2; exit 1; }
[ -f "$MODEL" ] || { echo "e2e: model $MODEL is missing (scripts/fetch-model.sh)" >&2; exit 1; }

LOGDIR=$(mktemp -d /tmp/dualpath-e2e.XXXXXX)
LOG="$LOGDIR/dualpathd.log"
PID=
cleanup() {
    if [ -n "$PID" ] && kill -0 "$PID" 2>/dev/null; then kill -KILL "$PID" 2>/dev/null || true; fi
}
trap cleanup EXIT

# Port 0: the kernel picks a free port and the daemon logs it (no other
# process, such as the other suite test.sh runs at once, can take it first).
"$BIN" --config "" --model "$MODEL" --listen "127.0.0.1:0" >"$LOG" 2>&1 &
PID=$!
URL=
for _ in $(seq 1 600); do
    if ! kill -0 "$PID" 2>/dev/null; then
        echo "e2e: dualpathd exited during start-up:" >&2
        cat "$LOG" >&2
        exit 1
    fi
    if [ -z "$URL" ]; then
        URL=$(sed -n 's|.*serve: listening on \(http://127\.0\.0\.1:[0-9]*\).*|\1|p' "$LOG" | head -1)
    fi
    if [ -n "$URL" ] && "$PY" -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('$URL/health', timeout=2).status == 200 else 1)" 2>/dev/null; then
        break
    fi
    sleep 0.2
done
[ -n "$URL" ] || { echo "e2e: dualpathd never said where it listens:" >&2; cat "$LOG" >&2; exit 1; }
echo "e2e: dualpathd (pid $PID) healthy at $URL; log $LOG"

set +e
DUALPATHD_URL="$URL" DUALPATHD_BIN="$BIN" DUALPATHD_MODEL="$MODEL" DUALPATHD_LOGDIR="$LOGDIR" \
    "$PY" -m pytest -q -p no:cacheprovider --durations=12 tests/e2e "$@"
RC=$?
set -e

kill -TERM "$PID"
set +e
for _ in $(seq 1 300); do
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.1
done
wait "$PID"
EXIT=$?
set -e
if [ "$EXIT" -ne 0 ]; then
    echo "e2e: dualpathd exited with $EXIT after SIGTERM (expected 0); log:" >&2
    tail -50 "$LOG" >&2
    exit 1
fi
if grep -E "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:" "$LOGDIR"/*.log >/dev/null 2>&1; then
    echo "e2e: sanitizer reports in $LOGDIR:" >&2
    grep -E -A20 "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:" "$LOGDIR"/*.log | head -80 >&2
    exit 1
fi
[ "$RC" -eq 0 ] || { echo "e2e: tests failed; daemon log $LOG" >&2; exit "$RC"; }
echo "e2e: all tests passed; dualpathd exited 0 on SIGTERM"
rm -rf "$LOGDIR"
