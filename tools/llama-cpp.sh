#!/usr/bin/env bash
# llama-cpp.sh: builds llama.cpp (the peer the benchmarks compare with) from
# the PyPI sdist of llama-cpp-python, which vendors the whole llama.cpp tree,
# into a cache outside the checkout, and prints the directory of its binaries
# (llama-bench, llama-server, llama-perplexity).
#   usage: tools/llama-cpp.sh [VERSION]     (default: the newest sdist)
# Environment: DP_CACHE (default ~/.cache/dualpath), LLAMA_CPP_NATIVE=0 for a
# portable build (GGML_NATIVE off: what a distribution package would ship).
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
if [ ! -d "$SRC/$NAME" ]; then
    tar -xzf "$TAR" -C "$SRC"
fi
TREE="$SRC/$NAME/vendor/llama.cpp"
[ -f "$TREE/CMakeLists.txt" ] || { echo "llama-cpp: $TREE has no CMakeLists.txt" >&2; exit 1; }
NATIVE="${LLAMA_CPP_NATIVE:-1}"
OUT="$CACHE/llama-cpp-build-$NAME-native$NATIVE"
if [ ! -x "$OUT/bin/llama-server" ] || [ ! -x "$OUT/bin/llama-bench" ] || [ ! -x "$OUT/bin/llama-perplexity" ]; then
    echo "llama-cpp: building $NAME into $OUT (several minutes on 2 cores)" >&2
    cmake -S "$TREE" -B "$OUT" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=$([ "$NATIVE" = 1 ] && echo ON || echo OFF) \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON \
        -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF >&2
    cmake --build "$OUT" -j "$(nproc)" --target llama-bench llama-server llama-perplexity >&2
fi
echo "$OUT/bin"
