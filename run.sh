#!/usr/bin/env bash
# Runs dualpathd on the default model: installs Debian deps, fetches the model,
# builds, then serves the OpenAI API on 127.0.0.1:8080 (Ctrl-C drains and
# stops). Extra arguments go to dualpathd (e.g. --prompt TEXT for one shot).
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
echo "run: build/daemon/dualpathd --model $MODEL --listen 127.0.0.1:8080 $*"
exec build/daemon/dualpathd --model "$MODEL" --listen 127.0.0.1:8080 "$@"
