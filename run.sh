#!/usr/bin/env bash
# Runs dualpathd on the default model: installs Debian deps, fetches the model,
# builds, then starts it. Extra arguments go to dualpathd.
set -euo pipefail
cd "$(dirname "$0")"
scripts/deps.sh
scripts/fetch-model.sh
if [ ! -f build/build.ninja ]; then
    echo "run: configuring build/"
    meson setup build --buildtype=release
fi
echo "run: building"
ninja -C build
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ $# -eq 0 ]; then
    set -- --prompt "The capital of France is" --max-tokens 32 --temperature 0
fi
echo "run: build/daemon/dualpathd --model $MODEL $*"
exec build/daemon/dualpathd --model "$MODEL" "$@"
