#!/usr/bin/env bash
# Runs every test: installs deps and the default model, builds, runs the C unit
# tests (release and ASan/UBSan builds), then the model tests against the real
# model and an independent NumPy reference.
set -euo pipefail
cd "$(dirname "$0")"
scripts/deps.sh --python
scripts/fetch-model.sh
PY="${DP_CACHE:-$HOME/.cache/dualpath}/venv/bin/python"
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Haswell}"

if [ ! -f build/build.ninja ]; then
    echo "test: configuring build/ (release)"
    meson setup build --buildtype=release
fi
echo "test: building build/"
ninja -C build
echo "test: unit tests (release)"
meson test -C build --print-errorlogs

if [ ! -f build-asan/build.ninja ]; then
    echo "test: configuring build-asan/ (ASan + UBSan)"
    meson setup build-asan --buildtype=debugoptimized -Db_sanitize=address,undefined -Dcuda=disabled
fi
echo "test: building build-asan/"
ninja -C build-asan
echo "test: unit tests (ASan + UBSan)"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    meson test -C build-asan --print-errorlogs --timeout-multiplier 4

# The AVX2 level (x86-64-v3: AVX2, FMA, F16C; no AVX-512), as most users'
# CPUs have it: it must build warning-free and pass the same unit tests, also
# on a machine that has AVX-512.
if [ ! -f build-avx2/build.ninja ]; then
    echo "test: configuring build-avx2/ (-march=x86-64-v3)"
    meson setup build-avx2 --buildtype=release -Dnative=false -Dc_args=-march=x86-64-v3 -Dcuda=disabled
fi
echo "test: building build-avx2/"
ninja -C build-avx2
echo "test: unit tests (AVX2 level)"
meson test -C build-avx2 --print-errorlogs

echo "test: model tests"
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
"$PY" tests/model/test_logits.py --model "$MODEL" --bin build/tools/dp-logits
tests/model/test_oneshot.sh build/daemon/dualpathd "$MODEL"
echo "test: end-to-end API tests (openai client, raw HTTP, Prometheus)"
tests/e2e/run.sh build/daemon/dualpathd
echo "test: operations (install, systemd-analyze verify, sd_notify/watchdog, access log)"
tests/ops/run.sh build
echo "test: all tests passed"
