#!/usr/bin/env bash
# Fuzzes each target with clang's libFuzzer under ASan + UBSan for a given
# time, starting from the committed corpus (tests/fuzz/corpus/NAME, plus the
# example config and a dp-synth model) in a working copy under the cache, and
# prints executions, corpus size and coverage per target. Exits non-zero on
# the first crash, leak or failed check, naming the input that caused it.
#   usage: tests/fuzz/run.sh [SECONDS_PER_TARGET (default 60)] [TARGET ...]
#   targets: request tokenizer config loadgen gguf jinja (default: all)
set -euo pipefail
cd "$(dirname "$0")/../.."
SECS="${1:-60}"
[ $# -gt 0 ] && shift
TARGETS="${*:-request tokenizer config loadgen gguf jinja}"
CACHE="${DP_CACHE:-$HOME/.cache/dualpath}"
WORK="$CACHE/fuzz"
BUILD="${DP_FUZZ_BUILD:-build-fuzz}"

if ! echo 'int LLVMFuzzerTestOneInput(const char *d, long n) { return 0; }' |
        clang -fsanitize=fuzzer -x c - -o /dev/null 2>/dev/null; then
    echo "fuzz: clang with libFuzzer is missing (Debian: clang libclang-rt-dev)" >&2
    exit 1
fi
if [ ! -f "$BUILD/build.ninja" ]; then
    echo "fuzz: configuring $BUILD (clang, libFuzzer, ASan + UBSan)"
    CC=clang meson setup "$BUILD" -Dfuzz=true -Db_sanitize=address,undefined -Db_lundef=false \
        -Dcuda=disabled --buildtype=debugoptimized >/dev/null
fi
bins=""
for t in $TARGETS; do bins="$bins tests/fuzz/fuzz_$t"; done
# shellcheck disable=SC2086
ninja -C "$BUILD" $bins tools/dp-synth >/dev/null

OUT=$(mktemp -d /tmp/dualpath-fuzz.XXXXXX)
# Each libFuzzer run is one thread: as many run at once as there are CPUs
# (each still gets SECS seconds), and the table is printed in target order.
JOBS="${DP_FUZZ_JOBS:-$(nproc)}"
prepare() { # target -> its corpus dir ready; prints its -max_len
    local t=$1 dir="$WORK/$1" maxlen=8192
    mkdir -p "$dir"
    cp -n tests/fuzz/corpus/"$t"/* "$dir"/ 2>/dev/null || true
    case "$t" in
        config) cp -n conf/dualpathd.conf "$dir/example.conf" ;;
        gguf)
            maxlen=65536
            [ -f "$dir/synth-tiny.gguf" ] ||
                "$BUILD/tools/dp-synth" --out "$dir/synth-tiny.gguf" --vocab 300 --dim 32 --ffn 64 \
                    >/dev/null 2>&1
            ;;
    esac
    echo "$maxlen"
}
fuzz_one() { # target: runs it, its exit status in $OUT/$t.rc
    local t=$1 maxlen rc
    maxlen=$(prepare "$t")
    set +e
    ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
        "$BUILD/tests/fuzz/fuzz_$t" -max_total_time="$SECS" -max_len="$maxlen" \
        -print_final_stats=1 -artifact_prefix="$OUT/$t-" "$WORK/$t" >"$OUT/$t.log" 2>&1
    rc=$?
    set -e
    echo "$rc" >"$OUT/$t.rc"
}
running=0
for t in $TARGETS; do
    fuzz_one "$t" &
    running=$((running + 1))
    if [ "$running" -ge "$JOBS" ]; then
        wait -n || true
        running=$((running - 1))
    fi
done
wait
printf '%-10s %8s %12s %8s %8s %8s\n' target seconds executions corpus cov ft
for t in $TARGETS; do
    dir="$WORK/$t"
    log="$OUT/$t.log"
    rc=$(cat "$OUT/$t.rc" 2>/dev/null || echo 1)
    if [ "$rc" -ne 0 ]; then
        echo "fuzz: $t failed (exit $rc); input and log in $OUT:" >&2
        grep -E "ERROR|SUMMARY|not one line|runtime error|check" "$log" | head -20 >&2
        ls "$OUT" >&2
        exit 1
    fi
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    last=$(grep -E "^#[0-9]+.*(DONE|cov:)" "$log" | tail -1)
    cov=$(echo "$last" | sed -n 's/.*cov: \([0-9]*\).*/\1/p')
    ft=$(echo "$last" | sed -n 's/.* ft: \([0-9]*\).*/\1/p')
    printf '%-10s %8s %12s %8s %8s %8s\n' "$t" "$SECS" "$execs" "$(ls "$dir" | wc -l)" "$cov" "$ft"
done
rm -rf "$OUT"
echo "fuzz: no crash, leak or failed check"
