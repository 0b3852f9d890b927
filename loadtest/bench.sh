#!/usr/bin/env bash
# bench.sh: the standard dp-loadgen matrix against a running OpenAI-compatible server,
# then dualpathd started twice (dualpath off / on, same KV memory); writes docs/bench-matrix.md.
#
# Usage: loadtest/bench.sh [--quick] [--url URL] [--model NAME] [--out FILE]
#                          [--no-server] [--no-daemon]
#   --quick       shorter cells (time limit, requests, output length) for a smoke run
#   --url URL     the running server to measure (default $BENCH_URL or http://127.0.0.1:8080)
#   --model NAME  model field to send (default: whatever /v1/models lists first)
#   --out FILE    the report (default docs/bench-matrix.md; the plot goes next to it)
#   --no-server   skip the running-server matrix; --no-daemon skips the off/on comparison
#
# Environment (all optional):
#   DP_LOADGEN        dp-loadgen binary (default: build*/loadtest/dp-loadgen, newest, or PATH)
#   BENCH_CONCURRENCY concurrency levels (default "1 8 32 64")
#   BENCH_PROMPTS     prompt lengths in tokens (default "256 2048")
#   BENCH_OUTPUT      output tokens per request (default 64; --quick 32)
#   BENCH_TURNS       turns per chat session (default 5)
#   BENCH_CELL_S      time limit per cell in seconds (default 60; --quick 20)
#   BENCH_EXTRA       extra dp-loadgen options for every cell (e.g. "--api-key KEY")
#   DP_DAEMON         the daemon binary (default build/daemon/dualpathd)
#   DP_MODEL_PATH     GGUF model for the daemon (default models/SmolLM2-135M-Instruct.Q4_1.gguf)
#   DP_PORT           port the daemon listens on for the comparison (default 8091)
#   DP_KV_MEM         KV memory both runs get (default 1GiB)
#   DP_OFF_ARGS       daemon arguments with dualpath OFF; default:
#                       --config= --model $DP_MODEL_PATH --listen 127.0.0.1:$DP_PORT
#                       --kv-memory $DP_KV_MEM --dualpath=false
#   DP_ON_ARGS        the same with dualpath ON (default: ... --dualpath=true)
#   DP_START_TIMEOUT  seconds to wait for /health (default 180)
#
# Cells never run past their time limit: requests still in flight are reported as
# incomplete. On a 2-core CPU with a ~135M model the default matrix takes ~10-15 min.
set -u -o pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)

quick=0
url=${BENCH_URL:-http://127.0.0.1:8080}
model=""
out="$root/docs/bench-matrix.md"
do_server=1
do_daemon=1
while [ $# -gt 0 ]; do
    case "$1" in
    --quick) quick=1 ;;
    --url) url=$2; shift ;;
    --model) model=$2; shift ;;
    --out) out=$2; shift ;;
    --no-server) do_server=0 ;;
    --no-daemon) do_daemon=0 ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

conc=${BENCH_CONCURRENCY:-1 8 32 64}
prompts=${BENCH_PROMPTS:-256 2048}
turns=${BENCH_TURNS:-5}
if [ $quick = 1 ]; then
    output=${BENCH_OUTPUT:-32}; cell_s=${BENCH_CELL_S:-20}
else
    output=${BENCH_OUTPUT:-64}; cell_s=${BENCH_CELL_S:-60}
fi
extra=${BENCH_EXTRA:-}

loadgen=${DP_LOADGEN:-}
if [ -z "$loadgen" ]; then
    loadgen=$(ls -t "$root"/build*/loadtest/dp-loadgen 2>/dev/null | head -n 1)
    [ -n "$loadgen" ] || loadgen=$(command -v dp-loadgen || true)
fi
if [ -z "$loadgen" ] || [ ! -x "$loadgen" ]; then
    echo "bench.sh: dp-loadgen not found; build it (meson setup build && ninja -C build) or set DP_LOADGEN" >&2
    exit 1
fi

DP_DAEMON=${DP_DAEMON:-$root/build/daemon/dualpathd}
DP_MODEL_PATH=${DP_MODEL_PATH:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
DP_PORT=${DP_PORT:-8091}
DP_KV_MEM=${DP_KV_MEM:-1GiB}
DP_OFF_ARGS=${DP_OFF_ARGS:---config= --model $DP_MODEL_PATH --listen 127.0.0.1:$DP_PORT --kv-memory $DP_KV_MEM --dualpath=false}
DP_ON_ARGS=${DP_ON_ARGS:---config= --model $DP_MODEL_PATH --listen 127.0.0.1:$DP_PORT --kv-memory $DP_KV_MEM --dualpath=true}
DP_START_TIMEOUT=${DP_START_TIMEOUT:-180}

work=$(mktemp -d "${TMPDIR:-/tmp}/dp-bench.XXXXXX")
daemon_pid=""
cleanup() {
    if [ -n "$daemon_pid" ]; then kill "$daemon_pid" 2>/dev/null; wait "$daemon_pid" 2>/dev/null; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { echo "bench.sh: $*" >&2; }

# health URL: reachable when /health (or /v1/models) answers 200.
healthy() {
    local base=$1 hostport line
    if command -v curl >/dev/null 2>&1; then
        curl -fsS -m 3 "$base/health" >/dev/null 2>&1 || curl -fsS -m 3 "$base/v1/models" >/dev/null 2>&1
        return
    fi
    hostport=${base#http://}; hostport=${hostport%%/*}
    exec 3<>"/dev/tcp/${hostport%:*}/${hostport##*:}" 2>/dev/null || return 1
    printf 'GET /health HTTP/1.0\r\nHost: %s\r\n\r\n' "$hostport" >&3
    read -r -t 3 line <&3
    exec 3<&- 3>&-
    case "$line" in *" 200 "*) return 0 ;; *) return 1 ;; esac
}

# cell BASE LABEL TSV ARGS...: one dp-loadgen run; its JSON is kept in $work.
cell() {
    local base=$1 label=$2 tsv=$3; shift 3
    local margs=()
    [ -n "$model" ] && margs=(--model "$model")
    log "$label ..."
    # shellcheck disable=SC2086
    "$loadgen" --base-url "$base" "${margs[@]}" -t "$cell_s" --timeout "$cell_s" --ignore-eos \
        --output-len "$output" --label "$label" --tsv "$tsv" --json "$work/$label.json" \
        --no-progress -q $extra "$@" || log "$label: dp-loadgen failed (exit $?)"
}

# matrix BASE PREFIX TSV [prompts] : the standard cells.
matrix() {
    local base=$1 prefix=$2 tsv=$3 plist=${4:-$prompts} with_chat=${5:-1} p c n
    for p in $plist; do
        for c in $conc; do
            if [ $quick = 1 ]; then n=$((c * 2)); else n=$((c * 4)); fi
            [ $n -lt 8 ] && n=8
            cell "$base" "$prefix-p$p-c$c" "$tsv" -n "$n" -c "$c" --input-len "$p" --warmup 1
        done
    done
    if [ "$with_chat" = 1 ]; then
        for c in 1 8; do
            n=$((c * turns)); [ $quick = 0 ] && n=$((n * 2))
            cell "$base" "$prefix-chat$turns-c$c" "$tsv" --api chat --workload chat --turns "$turns" \
                -n "$n" -c "$c" --input-len 128
        done
    fi
}

# md_table TSV PATTERN: a markdown table of the TSV rows whose label matches PATTERN.
md_table() {
    awk -F'\t' -v pat="$2" '
    NR == 1 { next }
    $1 ~ pat {
        if (!hdr) {
            print "| run | conc. | ok | failed | incompl. | req/s | in tok/s | out tok/s | TTFT p50 ms | TTFT p99 ms | TPOT mean ms | ITL p99 ms | E2E p99 ms | tokens |"
            print "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
            hdr = 1
        }
        printf "| %s | %s | %s | %s | %s | %.2f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %s |\n",
            $1, $2, $6, $7, $8, $10, $11, $12, $14, $15, $16, $18, $20, $22
    }
    END { if (!hdr) print "(no runs)" }' "$1"
}

# plot TSV PNG TITLE PREFIX...: throughput and p99 TTFT against concurrency, one line per prefix.
plot() {
    local tsv=$1 png=$2 title=$3; shift 3
    if ! command -v gnuplot >/dev/null 2>&1; then
        log "gnuplot missing; installing it (apt-get install gnuplot-nox)"
        if [ "$(id -u)" = 0 ]; then
            (apt-get install -y -q gnuplot-nox >/dev/null 2>&1 ||
                { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q gnuplot-nox >/dev/null 2>&1; }) || true
        elif command -v sudo >/dev/null 2>&1; then
            sudo -n apt-get install -y -q gnuplot-nox >/dev/null 2>&1 || true
        fi
    fi
    if ! command -v gnuplot >/dev/null 2>&1; then
        log "no gnuplot: skipping $png"
        return 1
    fi
    local cmds="" first=1 pre dat
    for pre in "$@"; do
        dat="$work/plot-$(echo "$pre" | tr -c 'A-Za-z0-9\n' '_').dat"
        # concurrency, output tok/s, p99 TTFT (ms) for cells named PREFIX-c<N>
        awk -F'\t' -v pat="^$pre-c[0-9]+\$" 'NR > 1 && $1 ~ pat { print $2, $12, $15 }' "$tsv" |
            sort -n > "$dat"
        [ -s "$dat" ] || continue
        [ $first = 0 ] && cmds="$cmds, "
        cmds="$cmds'$dat' using 1:COL with linespoints title '$pre'"
        first=0
    done
    [ -n "$cmds" ] || { log "nothing to plot for $png"; return 1; }
    local term=png
    gnuplot -e 'set terminal pngcairo' >/dev/null 2>&1 && term=pngcairo
    gnuplot <<EOP
set terminal $term size 1100,450 noenhanced
set output '$png'
set multiplot layout 1,2 title '$title'
set logscale x 2
set grid
set key left top
set xlabel 'concurrency'
set ylabel 'output tokens/s'
set title 'throughput'
plot ${cmds//COL/2}
set ylabel 'p99 TTFT (ms)'
set title 'p99 time to first token'
plot ${cmds//COL/3}
unset multiplot
EOP
}

tsv_server="$work/server.tsv"
tsv_daemon="$work/daemon.tsv"
server_note=""
daemon_note=""

if [ $do_server = 1 ]; then
    if healthy "$url"; then
        matrix "$url" server "$tsv_server"
    else
        server_note="No server answered at $url; the running-server matrix was skipped."
        log "$server_note"
    fi
fi

if [ $do_daemon = 1 ]; then
    if [ ! -x "$DP_DAEMON" ]; then
        daemon_note="Daemon binary $DP_DAEMON not found; the dualpath off/on comparison was skipped."
    elif ! { daemon_help=$("$DP_DAEMON" --help 2>&1); grep -qE -- '--(listen|port|http)' <<<"$daemon_help"; }; then
        # (the help text is captured first: grep -q closing the pipe early
        # would make the daemon die of SIGPIPE and, with pipefail, fail here)
        daemon_note="The daemon ($DP_DAEMON) has no HTTP mode yet (no --listen/--port/--http in its --help); the dualpath off/on comparison was skipped."
    else
        for mode in off on; do
            if [ $mode = off ]; then args=$DP_OFF_ARGS; else args=$DP_ON_ARGS; fi
            log "starting: $DP_DAEMON $args"
            # shellcheck disable=SC2086
            "$DP_DAEMON" $args >"$work/daemon-$mode.log" 2>&1 &
            daemon_pid=$!
            base="http://127.0.0.1:$DP_PORT"
            waited=0
            until healthy "$base"; do
                if ! kill -0 "$daemon_pid" 2>/dev/null || [ $waited -ge "$DP_START_TIMEOUT" ]; then
                    break
                fi
                sleep 1; waited=$((waited + 1))
            done
            if healthy "$base"; then
                matrix "$base" "dualpath-$mode" "$tsv_daemon" 256 0
            else
                daemon_note="${daemon_note}The daemon with dualpath $mode did not become healthy (see its log: tail below). "
                daemon_note="$daemon_note$(tail -n 5 "$work/daemon-$mode.log" | tr '\n' ' ')"
            fi
            kill "$daemon_pid" 2>/dev/null; wait "$daemon_pid" 2>/dev/null; daemon_pid=""
        done
    fi
    [ -n "$daemon_note" ] && log "$daemon_note"
fi

mkdir -p "$(dirname "$out")"
png_server="${out%.md}-server.png"
png_daemon="${out%.md}-dualpath.png"
{
    echo "# Benchmarks"
    echo
    echo "Generated by \`loadtest/bench.sh$([ $quick = 1 ] && echo ' --quick')\` on $(date -u '+%Y-%m-%d %H:%M UTC');"
    echo "do not edit by hand. Machine: $(uname -srm), $(nproc 2>/dev/null || echo '?') CPUs."
    echo
    echo "Each cell: dp-loadgen, closed loop at the given concurrency, \`--ignore-eos\`, $output output"
    echo "tokens, a time limit of ${cell_s} s per cell (requests in flight at the limit are"
    echo "*incomplete*, not failed). Token counts are the server's \`usage\` where it sends one."
    echo "Chat cells: sessions of $turns turns, 128 new words per turn, each turn resending the conversation."
    echo
    echo "## Running server ($url)"
    echo
    if [ -s "$tsv_server" ]; then
        md_table "$tsv_server" '^server-'
        echo
        pres=""
        for p in $prompts; do pres="$pres server-p$p"; done
        # shellcheck disable=SC2086
        if plot "$tsv_server" "$png_server" "running server" $pres; then
            echo "![throughput and p99 TTFT against concurrency]($(basename "$png_server"))"
            echo
        fi
    else
        echo "${server_note:-Skipped (--no-server).}"
        echo
    fi
    echo "## dualpathd: dualpath off vs on (same KV memory)"
    echo
    if [ -s "$tsv_daemon" ]; then
        echo "Off: \`$DP_DAEMON $DP_OFF_ARGS\`  "
        echo "On: \`$DP_DAEMON $DP_ON_ARGS\`"
        echo
        md_table "$tsv_daemon" '^dualpath-'
        echo
        if plot "$tsv_daemon" "$png_daemon" "dualpath off vs on" dualpath-off-p256 dualpath-on-p256; then
            echo "![dualpath off vs on]($(basename "$png_daemon"))"
            echo
        fi
    else
        echo "${daemon_note:-Skipped (--no-daemon).}"
        echo
    fi
    echo "Raw per-cell JSON was in \`$work\` (temporary)."
} >"$out.tmp" && mv "$out.tmp" "$out"
log "wrote $out"
trap - EXIT
cleanup
