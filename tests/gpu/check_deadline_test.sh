#!/usr/bin/env bash
# check_deadline_test.sh: tests/gpu/check.sh's one deadline. With a 5-second
# deadline and a first step that sleeps 60 s (DP_GPU_CHECK_SLEEP), the step
# is cut at the deadline, marked "timed out" in summary.json, and the run
# ends there with exit 2; $OUT is where the files go when no --out is given
# (as on the GPU machine). The verdict reads the summary, not the clock.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
OUT="$T/out" DP_GPU_BUILD="$T/build" DP_GPU_CHECK_DEADLINE=5 DP_GPU_CHECK_SLEEP=60 \
    tests/gpu/check.sh --quick > "$T/stdout" 2>&1
rc=$?
cat "$T/stdout"
[ "$rc" -eq 2 ] || { echo "check_deadline_test: FAIL: check.sh exited $rc, expected 2"; exit 1; }
python3 - "$T/out/summary.json" <<'PY' || { echo "check_deadline_test: FAIL: summary.json"; exit 1; }
import json, sys
s = json.load(open(sys.argv[1]))
steps = {x["name"]: x for x in s["steps"]}
assert s["exit"] == 2 and s["result"] == "timed out", s
assert s["deadline_s"] == 5, s
assert list(steps) == ["sleep"], steps          # nothing ran after it
st = steps["sleep"]
assert st["status"] == "timed out" and st["rc"] == 124, st
assert "deadline" in s["message"] and "sleep" in s["message"], s["message"]
assert "sleep (timed out)" in s["failed"], s["failed"]
print("check_deadline_test: summary.json: step sleep %s after %d s, exit %d (%s)"
      % (st["status"], st["seconds"], s["exit"], s["message"]))
PY
grep -q "check.sh: == sleep" "$T/out/check.log" || { echo "check_deadline_test: FAIL: no check.log in \$OUT"; exit 1; }
echo "check_deadline_test: PASS"
