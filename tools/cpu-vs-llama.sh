#!/usr/bin/env bash
# cpu-vs-llama.sh: dualpath's CPU kernels against llama.cpp's, side by side on
# the same GGUF and thread count, for every CPU level this machine has.
#
#   usage: tools/cpu-vs-llama.sh [--model F] [--build DIR] [--threads "1 2"] [--reps N]
#                                [--levels "avx512 avx2"] [--types "Q4_K_M Q8_0 ..."]
#
# --types: the model requantized to each type by llama.cpp's llama-quantize
# (--allow-requantize, from the default Q4_1 file: what each type's kernels
# cost, not the quality of a file quantized from f16), cached beside the
# llama.cpp build; a table per type.
#
# llama.cpp is built from the PyPI sdist of llama-cpp-python (it vendors the
# whole llama.cpp tree) into a cache outside the checkout (tools/llama-cpp.sh):
# a native build for the AVX-512 level, an AVX2-only build for the AVX2 level.
# dualpath runs the same binary at each level (DP_CPU_LEVEL forces it). The
# two programs run alternately (A B A B, --reps times) and each figure is the
# best of its runs, so a noisy neighbour slows both sides alike.
#
# Rows: prefill 512 tokens (llama-bench pp512 / dp-bench prefill), decode at
# batch 1 (llama-bench tg128 / dp-bench batch 1), decode at batch 8 and 32
# (llama-batched-bench S_TG with 64-token prompts and 64 new tokens / dp-bench
# with 64-token prompts and 64 new tokens: the same contexts). Not a test:
# timings vary.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
BUILD=build
THREADS="1 2"
REPS=2
LEVELS=""
TYPES=""
while [ $# -gt 0 ]; do
    case "$1" in
        --model) MODEL="$2"; shift 2 ;;
        --build) BUILD="$2"; shift 2 ;;
        --threads) THREADS="$2"; shift 2 ;;
        --reps) REPS="$2"; shift 2 ;;
        --levels) LEVELS="$2"; shift 2 ;;
        --types) TYPES="$2"; shift 2 ;;
        *) echo "usage: $0 [--model F] [--build DIR] [--threads \"1 2\"] [--reps N]" >&2; exit 2 ;;
    esac
done
DPB="$BUILD/tools/dp-bench"
[ -x "$DPB" ] || { echo "cpu-vs-llama: $DPB missing (build first: ninja -C $BUILD)" >&2; exit 2; }
[ -f "$MODEL" ] || { echo "cpu-vs-llama: model $MODEL missing (scripts/fetch-model.sh)" >&2; exit 2; }
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Haswell}"

levels=()
if [ -n "$LEVELS" ]; then
    read -r -a levels <<< "$LEVELS"
else
    # cpuinfo spells VNNI avx512_vnni; the AVX-512 level needs it (cpu_dispatch.c).
    grep -qw avx512_vnni /proc/cpuinfo && grep -qw avx512bw /proc/cpuinfo && levels+=(avx512)
    grep -qw avx2 /proc/cpuinfo && levels+=(avx2)
fi
[ ${#levels[@]} -gt 0 ] || { echo "cpu-vs-llama: no AVX2 on this CPU: nothing to compare" >&2; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
best() { # best FILE: the largest number in FILE (one per line), or "-"
    sort -g "$1" 2>/dev/null | tail -1 | grep . || echo "-"
}

# The files of --types, requantized once into the cache (tools/requant.sh).
models=("$MODEL")
if [ -n "$TYPES" ]; then
    # shellcheck disable=SC2086
    mapfile -t models < <(tools/requant.sh --model "$MODEL" $TYPES)
    [ ${#models[@]} -gt 0 ] || exit 1
fi

for MODEL in "${models[@]}"; do
[ ${#models[@]} -gt 1 ] && echo "== $(basename "$MODEL")"
printf '%-8s %-3s %-22s %12s %12s %8s\n' level thr row "llama.cpp" dualpath ratio
for level in "${levels[@]}"; do
    # (Without AVX-512 the native build is the AVX2 level's.)
    if [ "$level" = avx512 ] || ! grep -qw avx512f /proc/cpuinfo; then
        LBIN=$(tools/llama-cpp.sh)
    else
        LBIN=$(LLAMA_CPP_LEVEL=avx2 tools/llama-cpp.sh)
    fi
    for t in $THREADS; do
        d="$tmp/$(basename "$MODEL")-$level-$t"
        mkdir -p "$d"
        for rep in $(seq "$REPS"); do
            "$LBIN/llama-bench" -m "$MODEL" -t "$t" -p 512 -n 128 -r 1 -o json 2>/dev/null > "$d/lb.json"
            python3 - "$d" <<'EOF'
import json, sys
d = sys.argv[1]
for r in json.load(open(f"{d}/lb.json")):
    key = "pp512" if r["n_prompt"] == 512 and r["n_gen"] == 0 else "b1" if r["n_gen"] == 128 else None
    if key:
        open(f"{d}/l.{key}", "a").write(f"{r['avg_ts']}\n")
EOF
            DP_CPU_LEVEL=$level "$DPB" --model "$MODEL" --threads "$t" --steps 64 2>/dev/null > "$d/dp.txt"
            awk '/^prefill \(512/ {print $4 >> "'"$d"'/d.pp512"}
                 /^decode batch 1 / {print $4 >> "'"$d"'/d.b1"}
                 /^decode batch 8 / {print $4 >> "'"$d"'/d.b8"}
                 /^decode batch 32 / {print $4 >> "'"$d"'/d.b32"}' "$d/dp.txt"
            "$LBIN/llama-batched-bench" -m "$MODEL" -t "$t" -c 4096 -b 2048 -ub 512 -npp 64 -ntg 64 \
                -npl 8,32 2>/dev/null > "$d/bb.txt" || true
            # | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |
            awk -F'|' '$4 ~ /^ *(8|32) *$/ {gsub(/ /, "", $4); gsub(/ /, "", $9); print $9 >> "'"$d"'/l.b" $4}' "$d/bb.txt"
        done
        for row in pp512 b1 b8 b32; do
            case $row in
                pp512) name="prefill 512" ;; b1) name="decode batch 1" ;;
                b8) name="decode batch 8" ;; b32) name="decode batch 32" ;;
            esac
            l=$(best "$d/l.$row"); p=$(best "$d/d.$row")
            ratio=$(python3 -c "import sys; a,b=sys.argv[1:]; print(f'{float(b)/float(a):.2f}x' if a!='-' and b!='-' and float(a)>0 else '-')" "$l" "$p")
            printf '%-8s %-3s %-22s %12s %12s %8s\n' "$level" "$t" "$name" "$l" "$p" "$ratio"
        done
    done
done
done
