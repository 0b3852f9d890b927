#!/usr/bin/env bash
# perplexity-vs-llama.sh: the perplexity of a text at context 512 computed by
# dualpath's forward pass (both matmul paths: int8 activations, the default,
# and exact f32) and by llama.cpp's llama-perplexity on the same GGUF.
#
#   usage: tools/perplexity-vs-llama.sh [--model F] [--text FILE] [--build DIR] [--threads N]
#
# The same rule on both sides (llama-perplexity's): the text is cut into
# chunks of 512 tokens, each chunk runs from an empty cache, and the second
# half of every chunk is scored (each token given the ones before it in its
# chunk). dualpath's side runs `dp-logits --teacher` per chunk and scores in
# NumPy (tools/perplexity.py). Default text: the GPL-3 text Debian ships.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
TEXT=/usr/share/common-licenses/GPL-3
BUILD=build
THREADS=2
while [ $# -gt 0 ]; do
    case "$1" in
        --model) MODEL="$2"; shift 2 ;;
        --text) TEXT="$2"; shift 2 ;;
        --build) BUILD="$2"; shift 2 ;;
        --threads) THREADS="$2"; shift 2 ;;
        *) echo "usage: $0 [--model F] [--text FILE] [--build DIR] [--threads N]" >&2; exit 2 ;;
    esac
done
PY="${DP_CACHE:-$HOME/.cache/dualpath}/venv/bin/python"
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Haswell}"
LBIN=$(tools/llama-cpp.sh)
l_out=$("$LBIN/llama-perplexity" -m "$MODEL" -f "$TEXT" -c 512 -t "$THREADS" 2>&1)
l_ppl=$(printf '%s\n' "$l_out" | sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p')
l_chunks=$(printf '%s\n' "$l_out" | sed -n 's/.*calculating perplexity over \([0-9]*\) chunks.*/\1/p')
[ -n "$l_ppl" ] || { printf '%s\n' "$l_out" | tail -20 >&2; echo "perplexity: llama-perplexity printed no estimate" >&2; exit 1; }
echo "llama.cpp llama-perplexity: PPL $l_ppl over ${l_chunks:-?} chunks of 512"
for mode in int8 exact; do
    d=$("$PY" tools/perplexity.py --bin "$BUILD/tools/dp-logits" --model "$MODEL" --text "$TEXT" \
        --ctx 512 $([ "$mode" = exact ] && echo --exact))
    echo "dualpath ($mode matmul): $d"
    ppl=$(printf '%s\n' "$d" | sed -n 's/^PPL \([0-9.]*\).*/\1/p')
    python3 -c "import sys; a,b=map(float,sys.argv[1:]); print(f'  ratio to llama.cpp: {b/a:.4f} ({100*(b/a-1):+.2f} %)')" "$l_ppl" "$ppl"
done
