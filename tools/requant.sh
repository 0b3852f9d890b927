#!/usr/bin/env bash
# requant.sh: a model requantized by llama.cpp's own llama-quantize
# (--allow-requantize) to each TYPE, once, into the cache beside the
# llama.cpp build; prints each file's path, one per line, in TYPE order.
#
#   usage: tools/requant.sh [--model F] TYPE...    (TYPE: Q4_K_M, Q8_0, IQ4_XS, ...)
#
# From the default Q4_1 file the results say what each type's kernels cost,
# not the quality of a file quantized from f16. Used by tools/cpu-vs-llama.sh
# and loadtest/cpu_vs_llama_server.sh (--types).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ "${1:-}" = --model ]; then
    MODEL=$2
    shift 2
fi
[ $# -gt 0 ] || { echo "usage: $0 [--model F] TYPE..." >&2; exit 2; }
[ -f "$MODEL" ] || { echo "requant: model $MODEL missing (scripts/fetch-model.sh)" >&2; exit 2; }
QDIR="${DP_CACHE:-$HOME/.cache/dualpath}/requant"
mkdir -p "$QDIR"
QBIN=$(tools/llama-cpp.sh)
for ty in "$@"; do
    f="$QDIR/$(basename "$MODEL" .gguf).$ty.gguf"
    if [ ! -f "$f" ] && "$QBIN/llama-quantize" --allow-requantize "$MODEL" "$f.tmp" "$ty" \
        >/dev/null 2>&1; then
        mv "$f.tmp" "$f"
    fi
    [ -f "$f" ] || { echo "requant: llama-quantize to $ty failed" >&2; exit 1; }
    echo "$f"
done
