#!/usr/bin/env bash
# check.sh: builds the CUDA configuration (build-gpu) and runs check_kernels:
# every CUDA op against the CPU reference, greedy generation on both, the 7B benchmark.
#
# Usage: tests/gpu/check.sh [check_kernels options: --seed N, --no-bench, --bench-only]
# Exit: 0 passed; 1 a check failed; 2 build or set-up error; 3 no usable CUDA device
# (the build still ran: a machine without a GPU checks that the CUDA code compiles).
set -uo pipefail
cd "$(dirname "$0")/../.."

BUILD=build-gpu
# Time for check_kernels itself; the build takes 1-2 minutes on 16 cores, and
# the whole script must stay under 8 minutes.
RUN_LIMIT=${DP_GPU_CHECK_LIMIT:-360}

if [ -x scripts/deps.sh ]; then
    # Not fatal: a machine without network access may still have everything.
    scripts/deps.sh || echo "check.sh: scripts/deps.sh failed; trying the build anyway"
fi
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="$PATH:/usr/local/cuda/bin"
fi
if ! command -v nvcc >/dev/null 2>&1; then
    echo "check.sh: nvcc not found (install the CUDA toolkit, or put it on PATH)"
    exit 2
fi

if [ -f "$BUILD/build.ninja" ]; then
    meson configure "$BUILD" -Dcuda=enabled >/dev/null || exit 2
else
    meson setup "$BUILD" -Dcuda=enabled || exit 2
fi
echo "check.sh: building $BUILD"
ninja -C "$BUILD" || { echo "check.sh: build failed"; exit 2; }

# The device: nvidia-smi first (clear message when the driver is missing),
# then check_kernels itself exits 3 when the runtime finds no usable device.
if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "no usable CUDA device: nvidia-smi not found (no NVIDIA driver on this machine); built only"
    exit 3
fi
if ! smi=$(nvidia-smi -L 2>&1) || [ -z "$smi" ]; then
    echo "no usable CUDA device: nvidia-smi failed: $(printf '%s' "$smi" | head -n 1); built only"
    exit 3
fi
echo "check.sh: $smi"

timeout "$RUN_LIMIT" "$BUILD/tests/gpu/check_kernels" "$@"
rc=$?
case $rc in
    0) echo "check.sh: all GPU checks passed" ;;
    3) echo "no usable CUDA device: the CUDA runtime refused it (message above); built only" ;;
    124) echo "check.sh: check_kernels ran past ${RUN_LIMIT} s"; rc=2 ;;
    *) echo "check.sh: GPU checks FAILED (exit $rc)" ;;
esac
exit $rc
