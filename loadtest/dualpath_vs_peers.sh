#!/usr/bin/env bash
# dualpath_vs_peers.sh: the served comparison, over HTTP with dp-loadgen, at
# the same KV bytes: dualpathd with dualpath off, dualpathd with its defaults
# (dualpath on), and llama.cpp's llama-server (tools/llama-cpp.sh builds it),
# run one after the other in the same invocation on the same GGUF and threads.
#
# Workloads (realistic chat): "chat": /v1/chat/completions without max_tokens
# (replies end where the model stops, or at the context), a shared system
# prompt of PREFIX words plus a user turn of 20-120 words; "multiturn":
# sessions of TURNS turns, each resending the conversation, replies of at
# most 64 tokens; "multiturn-64": the same with every reply 64 tokens long.
# Multi-turn load is sustained: SESSIONS sessions are open for the whole time
# limit, a new one starting where one ends (a fixed number of sessions let a
# faster server finish early, and the tail where its last sessions ran alone
# weighed on its mean concurrency as if it had lacked memory). Each row says
# how deep the conversations it served were (mean prompt tokens per request).
#
# Reported per server and workload: peak and mean concurrent sequences (the
# server's running gauge, polled every 0.2 s while the load runs), for
# multi-turn also over the first cycle (until the first session has sent
# all its turns: every session is then in its first conversation, so every
# server is measured at the same conversation depths whatever its speed,
# where the whole run's mean lets a faster server go deeper and hold more
# history per sequence; with the depth served in it), the turns a session
# reaches before a request of it fails (its memory ran out: llama-server's
# "context size exceeded"), output
# tok/s streamed (every token received in the time limit, requests still
# running included) and of completed requests only, TTFT p50/p99,
# preemptions.
#
# Servers (SERVERS, default all, in this order): off (dualpathd
# --no-dualpath), off-q8_0 (the same with the whole cache in q8_0:
# --kv-cache-type q8_0, quantization alone), on (dualpathd's defaults), on-turns and on-whole-turns
# (later chat turns always compressed / never: --compress-turns always |
# never; the default, auto, compresses them when memory binds), on-q8_0,
# on-q4_0 and on-kivi4 (dualpath
# with a quantized decode path; kivi4: 4-bit groups), on-evict (--keep-ratio 0.9: SnapKV evicts a
# tenth of each prompt), on-no-park (--no-resume-turns: a finished
# turn's compact cache is not kept for the next turn), on-no-swap
# (--swap-space 0: a preempted decode-path sequence is recomputed),
# on-q8_0-full (the same at keep_ratio 1:
# quantized, nothing evicted), on-budget (dualpath with decode_budget =
# BUDGET, default 256: replies are recompressed too), llama (llama-server,
# f16 KV) and llama-q8_0
# (-ctk q8_0 -ctv q8_0 with flash attention, its context raised to the same
# bytes), llama-slots (llama-server with LLAMA_NP slots, default SESSIONS, each with
# its share of the same context: llama-server does not preempt, so with one
# unified context a chat without max_tokens fails once the sequences outgrow
# it, while slots of their own stop each reply at its slot's end),
# llama-slots-q8_0 (the slots with a q8_0 KV and flash attention, its
# context raised to the same bytes: size LLAMA_NP to the sessions).
#
# llama-np (llama-server with LLAMA_NP slots, default SESSIONS, in one
# unified context: every slot may take what the others leave) and
# llama-np-q8_0 (the same with a q8_0 KV and flash attention): the peer's
# best configuration for SESSIONS multi-turn sessions.
#
# Equal total memory: dualpathd's swap space (SWAP_MIB, --swap-space,
# default 0) is host memory beside its KV; llama-server has none, so its
# context gets KV_MIB + SWAP_MIB. Each row also says the server's peak
# resident memory (VmHWM, over all its workloads, weights included) and the
# most host memory its swapped and parked caches held at once
# (dualpath_swap_bytes + dualpath_parked_host_bytes, polled).
#
# Usage: loadtest/dualpath_vs_peers.sh [--kv-mib N] [--out FILE]
# Environment: KV_MIB (default 64), CONC (default 32), REQS (default 64),
#   TURNS (default 10), SESSIONS (multi-turn sessions at once, default 8),
#   PREFIX (default 200), THREADS (default nproc),
#   CELL_S (time limit per run, default 120), MT_CELL_S (the multi-turn runs', default
#   CELL_S: long enough for a session to end on the slowest server), WORKLOADS (default
#   "chat multiturn multiturn-64"), SERVERS, BUDGET, LLAMA_NP, DP_MODEL_PATH,
#   DP_DAEMON, LLAMA_BIN (directory of llama-server; default:
#   tools/llama-cpp.sh's).
set -u -o pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
KV_MIB=${KV_MIB:-64}
OUT=""
while [ $# -gt 0 ]; do
    case "$1" in
        --kv-mib) KV_MIB=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        *) echo "usage: $0 [--kv-mib N] [--out FILE]" >&2; exit 2 ;;
    esac
done
CONC=${CONC:-32}; REQS=${REQS:-64}; TURNS=${TURNS:-10}; PREFIX=${PREFIX:-200}; SESSIONS=${SESSIONS:-8}
THREADS=${THREADS:-$(nproc)}; CELL_S=${CELL_S:-120}; MT_CELL_S=${MT_CELL_S:-$CELL_S}
WORKLOADS=${WORKLOADS:-chat multiturn multiturn-64}
DOC_FILE=${DOC_FILE:-/usr/share/common-licenses/GPL-3}
DOC_WORDS=${DOC_WORDS:-800:1600}
DOC_QUESTION=${DOC_QUESTION:-"Question: what does the passage above say about the recipient's rights? Answer in two sentences."}
MODEL=${DP_MODEL_PATH:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
DAEMON=${DP_DAEMON:-$root/build/daemon/dualpathd}
LOADGEN=${DP_LOADGEN:-$root/build/loadtest/dp-loadgen}
LLAMA_BIN=${LLAMA_BIN:-$("$root/tools/llama-cpp.sh")} || { echo "no llama.cpp build" >&2; exit 1; }
PORT=${DP_PORT:-8097}
URL=http://127.0.0.1:$PORT
work=$(mktemp -d /tmp/dp-vs-peers.XXXXXX)

LLAMA_NP=${LLAMA_NP:-$SESSIONS}
SWAP_MIB=${SWAP_MIB:-0}
# llama-server's KV is f16 by default: bytes per token from the model's shape
# (2 x layers x kv_heads x head_dim x 2 bytes); its context gets the same bytes.
PY=${DP_CACHE:-$HOME/.cache/dualpath}/venv/bin/python
kv_tok_f16=$("$PY" - "$MODEL" <<'PYEOF'
import sys
from gguf import GGUFReader
r = GGUFReader(sys.argv[1])
def v(k):
    f = r.fields[k]
    x = f.parts[f.data[0]]
    return bytes(x).decode() if f.types[0].name == "STRING" else int(x[0])
a = v("general.architecture")
L, E, H = v(a + ".block_count"), v(a + ".embedding_length"), v(a + ".attention.head_count")
KH = v(a + ".attention.head_count_kv") if a + ".attention.head_count_kv" in r.fields else H
print(2 * L * KH * (E // H) * 2)
PYEOF
)
LLAMA_CTX=$(( (KV_MIB + SWAP_MIB) * 1024 * 1024 / kv_tok_f16 ))
# q8_0: 34 bytes per 32 values where f16 takes 64.
LLAMA_CTX_Q8=$(( (KV_MIB + SWAP_MIB) * 1024 * 1024 * 64 / (kv_tok_f16 * 34) ))
SERVERS=${SERVERS:-off on on-q8_0 on-q4_0 llama llama-q8_0}

running_gauge() { # url -> the running-sequences gauge of either server
    curl -s "$1/metrics" | awk '/^dualpath_requests_running /{print $2} /^llamacpp:requests_processing /{print $2}' | head -1
}
gauges() { # url -> "running host_bytes" (host_bytes: swapped + parked caches; 0 for llama-server)
    curl -s "$1/metrics" | awk '/^dualpath_requests_running /{r=$2} /^llamacpp:requests_processing /{r=$2}
        /^dualpath_swap_bytes /{h+=$2} /^dualpath_parked_host_bytes /{h+=$2}
        END {if (r != "") printf "%d %d\n", r, h}'
}
poll_peak() { # url file: "max mean max_host_bytes" of the gauges so far, until
    # killed; every running sample with its time in file.samples
    local peak=0 sum=0 n=0 hmax=0 v h
    : > "$2.samples"
    while :; do
        read -r v h < <(gauges "$1")
        if [ -n "${v:-}" ]; then
            echo "$(date +%s.%N) $v" >> "$2.samples"
            [ "$v" -gt "$peak" ] && peak=$v
            [ "$h" -gt "$hmax" ] && hmax=$h
            sum=$(( sum + v )); n=$(( n + 1 ))
            # Written aside and renamed: the poller is killed at any moment,
            # and a truncated file lost the cell's row.
            echo "$peak $(( sum * 10 / n )) $hmax" > "$2.tmp" && mv -f "$2.tmp" "$2"
        fi
        sleep 0.2
    done
}
wait_idle() { # url: until the previous cell's requests are gone (a client
    # that stopped at its time limit leaves them to be cancelled; counted in
    # the next cell's gauge they read as a peak of its own); 120 s at most
    local i v
    for i in $(seq 600); do
        v=$(running_gauge "$1"); v=${v%.*}
        [ "${v:-0}" -eq 0 ] && return 0
        sleep 0.2
    done
    echo "warning: $v requests still running after 120 s" >&2
}
. "$here/serve_lib.sh"
run_cell() { # label workload-args...
    local label=$1; shift
    wait_idle "$URL"
    echo "0 0 0" > "$work/peak"
    poll_peak "$URL" "$work/peak" & local poller=$!
    local pre0; pre0=$(curl -s "$URL/metrics" | awk '/^dualpath_preemptions_total /{print $2}')
    local t0; t0=$(date +%s.%N)
    "$LOADGEN" --base-url "$URL" --api chat --no-progress -q -t "$CELL_T" --seed 7 \
        --json "$work/$label.json" "$@" >/dev/null 2>"$work/$label.err"
    kill "$poller" 2>/dev/null; wait "$poller" 2>/dev/null
    local pre1; pre1=$(curl -s "$URL/metrics" | awk '/^dualpath_preemptions_total /{print $2}')
    local pre="n/a"
    [ -n "$pre0" ] && pre=$(( ${pre1%.*} - ${pre0%.*} ))
    "$PY" - "$work/$label.json" "$label" "$(cat "$work/peak")" "$pre" "$work/peak.samples" "$t0" \
        "$TURNS" >> "$work/rows" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
peak, mean10, host = sys.argv[3].split()
# Multi-turn: the first cycle, until the first session has sent all its
# turns (every session is then in its first conversation, at the same
# turns on every server, whatever its speed): the mean of the gauge then,
# and the mean prompt tokens of the requests answered in it. "-" when no
# session finished in the time limit.
win, wtok = "-", "-"
reqs = [q for q in r.get("requests", []) if q.get("session") is not None]
if reqs:
    last = int(sys.argv[7]) - 1  # turns are counted from 0
    ends = {}
    for q in reqs:
        if q["ok"] and q["turn"] == last and q["session"] not in ends:
            ends[q["session"]] = q["start_s"] + q["e2el_ms"] / 1e3
    if ends:
        end = min(ends.values())
        t0 = float(sys.argv[6])
        samples = [float(l.split()[1]) for l in open(sys.argv[5])
                   if l.strip() and float(l.split()[0]) - t0 <= end]
        done = [q for q in reqs if q["ok"] and q["start_s"] + q["e2el_ms"] / 1e3 <= end]
        if samples:
            win = "%.1f" % (sum(samples) / len(samples))
        if done:
            wtok = "%.0f" % (sum(q["prompt_tokens"] for q in done) / len(done))
# Turns a session reaches before its memory runs out: of the sessions that
# ended in the time limit (answered their last turn, or had a request
# fail), the mean count of turns answered before the first failure; of
# those still going at the limit, how many and the turns they had answered.
reach = "-"
if reqs:
    by = {}
    for q in reqs:
        by.setdefault(q["session"], []).append(q)
    got, running = [], []
    for qs in by.values():
        bad = [q["turn"] for q in qs if not q["ok"]]
        if bad:
            got.append(min(bad))
        elif any(q["turn"] == last for q in qs):
            got.append(last + 1)
        else:  # still going at the time limit: the turns it had answered
            running.append(sum(1 for q in qs if q["ok"]))
    parts = []
    if got:
        parts.append("%.1f of %d (%d ended)" % (sum(got) / len(got), last + 1, len(got)))
    if running:
        parts.append("%d running at turn %.1f" % (len(running), sum(running) / len(running)))
    reach = "; ".join(parts) or "-"
print("| %s | %s | %.1f | %s | %s | %s | %.1f | %.1f | %.0f | %.0f | %s | %d | %d | %.0f | %d | %.0f | %.1f |" % (
      sys.argv[2], peak, int(mean10) / 10, win, wtok, reach, r["streamed_output_throughput"],
      r["output_throughput"], r["median_ttft_ms"], r["p99_ttft_ms"], sys.argv[4], r["completed"],
      r["total_output_tokens"], r["total_input_tokens"] / max(1, r["completed"]), r["failed"],
      r["duration"], int(host) / 2**20))
PY
}
serve_and_run() { # name command...
    local name=$1; shift
    "$@" >"$work/$name.log" 2>&1 & local pid=$!
    wait_health || { echo "$name did not start; see $work/$name.log" >&2; kill $pid; return 1; }
    CELL_T=$CELL_S
    case " $WORKLOADS " in *" chat "*)
        run_cell "$name chat" --workload prefix --prefix-len "$PREFIX" --input-len 20:120 \
            --no-max-tokens -n "$REQS" -c "$CONC" ;; esac
    CELL_T=$MT_CELL_S
    case " $WORKLOADS " in *" multiturn "*)
        run_cell "$name multiturn" --workload chat --turns "$TURNS" --input-len 20:60 \
            --output-len 64 -n 0 -c "$SESSIONS" ;; esac
    # The same sessions with every reply 64 tokens long (ignore_eos): the
    # servers' replies differ (eviction changes the text), and where one
    # stops earlier its tok/s counts more prompt work per token.
    case " $WORKLOADS " in *" multiturn-64 "*)
        run_cell "$name multiturn-64" --workload chat --turns "$TURNS" --input-len 20:60 \
            --output-len 64 --ignore-eos -n 0 -c "$SESSIONS" ;; esac
    # Long documents: a passage of DOC_WORDS words of a real text (DOC_FILE)
    # as the user message, then a question about it; the reply without
    # max_tokens. The shared system prompt of the chat workload is not sent.
    case " $WORKLOADS " in *" document "*)
        run_cell "$name document" --workload corpus --prompt-file "$DOC_FILE" \
            --input-len "$DOC_WORDS" --no-max-tokens -n "$REQS" -c "$SESSIONS" \
            --question "$DOC_QUESTION" ;; esac
    # Peak resident memory over its workloads (weights, KV, swap, everything).
    echo "| $name | $(awk '/^VmHWM/{printf "%.0f", $2 / 1024}' /proc/$pid/status 2>/dev/null) |" >> "$work/rss"
    kill -TERM $pid; wait $pid 2>/dev/null
}
: > "$work/rows"
: > "$work/rss"
DP="$DAEMON --config= --model $MODEL --listen 127.0.0.1:$PORT --kv-memory ${KV_MIB}MiB --swap-space ${SWAP_MIB}MiB --threads $THREADS"
LS="$LLAMA_BIN/llama-server -m $MODEL --host 127.0.0.1 --port $PORT -t $THREADS -np $CONC --kv-unified --metrics"
LS_NP="$LLAMA_BIN/llama-server -m $MODEL --host 127.0.0.1 --port $PORT -t $THREADS -np $LLAMA_NP --kv-unified --metrics"
for s in $SERVERS; do
    case "$s" in
        off) serve_and_run "dualpathd-off" $DP --no-dualpath ;;
        off-q8_0) serve_and_run "dualpathd-off-q8_0" $DP --no-dualpath --kv-cache-type q8_0 ;;
        on) serve_and_run "dualpathd-on" $DP ;;
        on-q8_0) serve_and_run "dualpathd-on-q8_0" $DP --decode-kv-type q8_0 ;;
        on-q4_0) serve_and_run "dualpathd-on-q4_0" $DP --decode-kv-type q4_0 ;;
        on-kivi4) serve_and_run "dualpathd-on-kivi4" $DP --decode-kv-type kivi4 ;;
        on-turns) serve_and_run "dualpathd-on-turns-always" $DP --compress-turns always ;;
        on-whole-turns) serve_and_run "dualpathd-on-turns-never" $DP --compress-turns never ;;
        on-budget) serve_and_run "dualpathd-on-budget${BUDGET:-256}" $DP --decode-budget "${BUDGET:-256}" ;;
        on-evict) serve_and_run "dualpathd-on-keep0.9" $DP --keep-ratio 0.9 ;;
        on-no-park) serve_and_run "dualpathd-on-no-resume-turns" $DP --no-resume-turns ;;
        on-no-swap) serve_and_run "dualpathd-on-no-swap" ${DP/--swap-space ${SWAP_MIB}MiB/--swap-space 0} ;;
        on-q8_0-full) serve_and_run "dualpathd-on-q8_0-keep1" $DP --decode-kv-type q8_0 --keep-ratio 1 ;;
        llama) serve_and_run "llama-server" $LS -c "$LLAMA_CTX" ;;
        llama-q8_0) serve_and_run "llama-server-q8_0" $LS -c "$LLAMA_CTX_Q8" -ctk q8_0 -ctv q8_0 -fa on ;;
        llama-np) serve_and_run "llama-server-np$LLAMA_NP-unified" $LS_NP -c "$LLAMA_CTX" ;;
        llama-np-q8_0) serve_and_run "llama-server-np$LLAMA_NP-unified-q8_0" $LS_NP -c "$LLAMA_CTX_Q8" \
            -ctk q8_0 -ctv q8_0 -fa on ;;
        llama-slots) serve_and_run "llama-server-np$LLAMA_NP" "$LLAMA_BIN/llama-server" -m "$MODEL" \
            --host 127.0.0.1 --port "$PORT" -t "$THREADS" -np "$LLAMA_NP" --metrics -c "$LLAMA_CTX" ;;
        llama-slots-q8_0) serve_and_run "llama-server-np$LLAMA_NP-q8_0" "$LLAMA_BIN/llama-server" \
            -m "$MODEL" --host 127.0.0.1 --port "$PORT" -t "$THREADS" -np "$LLAMA_NP" --metrics \
            -c "$LLAMA_CTX_Q8" -ctk q8_0 -ctv q8_0 -fa on ;;
        *) echo "unknown server $s" >&2; exit 2 ;;
    esac
done
{
    echo "Total memory for each server: ${KV_MIB} MiB of KV + ${SWAP_MIB} MiB of swap space for dualpathd; $(( KV_MIB + SWAP_MIB )) MiB of KV for llama-server (llama-server: f16 KV, -c $LLAMA_CTX tokens; q8_0 KV, -c $LLAMA_CTX_Q8; -np $CONC --kv-unified; llama-server-np$LLAMA_NP: -np $LLAMA_NP, $(( LLAMA_CTX / LLAMA_NP )) tokens per slot, $(( LLAMA_CTX_Q8 / LLAMA_NP )) in q8_0);"
    echo "threads $THREADS; chat: $REQS requests at concurrency $CONC, no max_tokens, shared ${PREFIX}-word system prompt;"
    echo "multiturn: $SESSIONS sessions of $TURNS turns open at once for the whole run (a new one starts where one ends), replies of at most 64 tokens (multiturn-64: exactly 64, ignore_eos). Time limit ${CELL_S} s per chat run, ${MT_CELL_S} s per multi-turn run."
    echo
    echo "| server / workload | peak concurrent seqs | mean concurrent seqs | mean concurrent seqs, first cycle | mean prompt tokens, first cycle | turns a session reached (ended sessions) | streamed tok/s | completed tok/s | TTFT p50 ms | TTFT p99 ms | preemptions | completed | output tokens (completed) | mean prompt tokens (completed) | failed | run s | peak swapped + parked host MiB |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    cat "$work/rows"
    echo
    echo "| server | peak resident MiB (VmHWM, all its workloads) |"
    echo "|---|---|"
    cat "$work/rss"
} | tee ${OUT:+"$OUT"}
echo "logs and JSON in $work" >&2
