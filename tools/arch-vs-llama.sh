#!/usr/bin/env bash
# arch-vs-llama.sh: each architecture the forward pass runs (model/arch.h),
# on a small synthetic GGUF that dp-synth writes, through dualpath's
# forward pass and through llama.cpp's own (a small program over the
# libllama that tools/llama-cpp.sh builds: tools/llama_logits.cpp), same
# tokens, both with f32 weights and an f32 KV cache on the exact path.
# Prints per architecture the largest |logit difference| over every
# position, the mean KL(llama.cpp || dualpath) in nats per position, and
# how many of 64 greedy tokens after the list agree. With --real FILE
# --text TEXT (arch_vs_llama.py's options pass through), a real GGUF instead:
# its tokenizer on the golden texts, then its logits over the text.
#   usage: tools/arch-vs-llama.sh [--build DIR] [--real FILE --text TEXT]   (default build)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=build
if [ "${1:-}" = --build ]; then BUILD="$2"; shift 2; fi
PY="${DP_CACHE:-$HOME/.cache/dualpath}/venv/bin/python"
LBIN=$(tools/llama-cpp.sh)
LB="$(dirname "$LBIN")"
TREE=$(ls -d "${DP_CACHE:-$HOME/.cache/dualpath}"/llama-cpp-src/llama_cpp_python-*/vendor/llama.cpp | head -1)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
g++ -O2 -I"$TREE/include" -I"$TREE/ggml/include" tools/llama_logits.cpp -o "$TMP/llama-logits" \
    "$LB/src/libllama.a" "$LB/ggml/src/libggml.a" "$LB/ggml/src/libggml-cpu.a" \
    "$LB/ggml/src/libggml-base.a" -lm -lpthread -fopenmp
exec "$PY" tools/arch_vs_llama.py --synth "$BUILD/tools/dp-synth" --bin "$BUILD/tools/dp-logits" \
    --llama "$TMP/llama-logits" --tmp "$TMP" "$@"
