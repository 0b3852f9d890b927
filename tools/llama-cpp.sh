#!/usr/bin/env bash
# llama-cpp.sh: builds llama.cpp (the peer the benchmarks compare with) from
# the PyPI sdist of llama-cpp-python, which vendors the whole llama.cpp tree,
# into a cache outside the checkout, and prints the directory of its binaries
# (llama-bench, llama-batched-bench, llama-server, llama-perplexity,
# llama-quantize).
#   usage: tools/llama-cpp.sh [VERSION]     (default: the newest sdist)
# Environment: DP_CACHE (default ~/.cache/dualpath), LLAMA_CPP_AMX=1 to keep
#   AMX in a native build (left out by default, see below), LLAMA_CPP_NATIVE=0 for a
# portable build (GGML_NATIVE off: what a distribution package would ship),
# LLAMA_CPP_LEVEL=avx2 for a build limited to AVX2+FMA+F16C (no AVX-512: what
# most users' CPUs run), to compare with dualpath's AVX2 kernels on a machine
# that has AVX-512.
set -euo pipefail
CACHE="${DP_CACHE:-$HOME/.cache/dualpath}"
VER="${1:-}"
SRC="$CACHE/llama-cpp-src"
mkdir -p "$CACHE" "$SRC"
command -v cmake >/dev/null || { echo "llama-cpp: installing cmake" >&2; apt-get install -y -q cmake >&2; }
PY="$CACHE/venv/bin/python"
[ -x "$PY" ] || PY=python3
if [ -z "$(ls "$SRC"/*.tar.gz 2>/dev/null)" ]; then
    echo "llama-cpp: downloading the llama-cpp-python sdist ${VER:-(newest)}" >&2
    "$PY" -m pip download --quiet --no-deps --no-binary :all: -d "$SRC" \
        "llama-cpp-python${VER:+==$VER}" >&2
fi
TAR=$(ls -t "$SRC"/llama_cpp_python-*.tar.gz | head -1)
NAME=$(basename "$TAR" .tar.gz)
TREE="$SRC/$NAME/vendor/llama.cpp"
# The tree may be there in part: tests/model/test_templates.py extracts only
# its chat templates into the same place.
if [ ! -f "$TREE/CMakeLists.txt" ]; then
    tar -xzf "$TAR" -C "$SRC"
fi
[ -f "$TREE/CMakeLists.txt" ] || { echo "llama-cpp: $TREE has no CMakeLists.txt" >&2; exit 1; }
NATIVE="${LLAMA_CPP_NATIVE:-1}"
LEVEL="${LLAMA_CPP_LEVEL:-}"
ISA=()
if [ "$LEVEL" = avx2 ]; then
    NATIVE=0
    ISA=(-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF)
elif [ -n "$LEVEL" ]; then
    echo "llama-cpp: LLAMA_CPP_LEVEL=$LEVEL: only avx2 is known" >&2; exit 2
fi
# A native build on a CPU that lists AMX compiles ggml's AMX matmuls, and
# some virtual machines list AMX without enabling its tiles: llama-server
# then dies with SIGILL at its first tile instruction (tinygemm_kernel_amx,
# seen on 2026-12-06). Left out unless LLAMA_CPP_AMX=1 (explicit -mno-amx-*
# win over -march=native whatever their order).
FLAGS=()
NOAMX=""
if [ "$NATIVE" = 1 ] && [ "${LLAMA_CPP_AMX:-0}" != 1 ] && grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
    FLAGS=("-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
           "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
    NOAMX="-noamx"
fi
OUT="$CACHE/llama-cpp-build-$NAME-native$NATIVE${LEVEL:+-$LEVEL}$NOAMX"
TARGETS=(llama-bench llama-batched-bench llama-server llama-perplexity llama-quantize)
missing=0
for t in "${TARGETS[@]}"; do [ -x "$OUT/bin/$t" ] || missing=1; done
if [ "$missing" = 1 ]; then
    echo "llama-cpp: building $NAME into $OUT (several minutes on 2 cores)" >&2
    cmake -S "$TREE" -B "$OUT" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=$([ "$NATIVE" = 1 ] && echo ON || echo OFF) \
        "${ISA[@]}" "${FLAGS[@]}" -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON \
        -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF >&2
    cmake --build "$OUT" -j "$(nproc)" --target "${TARGETS[@]}" >&2
fi
echo "$OUT/bin"
