#!/usr/bin/env bash
# offline_test.sh: proves here, without a GPU, that tests/gpu/check.sh can build on a
# bare, offline CUDA machine: with the system's dev packages hidden (PKG_CONFIG_LIBDIR
# = the prefix unpacked from .gpu-deps only; a PKG_CONFIG_PATH naming the system's
# folder is given on purpose and must be ignored), check.sh --quick sets up the
# libraries, configures, builds, and stops where the CUDA runtime finds no GPU,
# with exit 3 and "no GPU on this machine". Then checks that meson found libuv, libmicrohttpd, cJSON
# and OpenBLAS in the prefix, that every one of their headers the build read came
# from the prefix, and that the daemon loads the prefix's libraries. On a machine
# with a GPU, check.sh runs its checks instead and must pass.
#
# Usage: tests/gpu/offline_test.sh
# Environment: DP_OFFLINE_BUILD (build-gpu-offline; reused between runs),
#   DP_OFFLINE_PREFIX (BUILD-deps), DP_OFFLINE_JOBS (ninja -j, 1), DP_CUDA_ARCH (90: one
#   architecture, for speed; check.sh's default list is not what is being tested)
# Exit: 0 passed; 1 failed; 77 skipped (no nvcc, or no .gpu-deps and no way to make it).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
T0=$(date +%s)
BUILD=${DP_OFFLINE_BUILD:-build-gpu-offline}
PREFIX=${DP_OFFLINE_PREFIX:-$BUILD-deps}
OUT="$BUILD/offline-test-out"
DEPS=.gpu-deps

say() { echo "offline_test: $*"; }
fail() { say "FAIL: $*"; say "took $(( $(date +%s) - T0 )) s"; exit 1; }

if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
    say "SKIP: no nvcc on this machine (the CUDA toolkit is needed to build the CUDA code)"
    exit 77
fi
if [ ! -f "$DEPS/debs/MANIFEST" ]; then
    say "no $DEPS: running tests/gpu/prepare.sh"
    if ! tests/gpu/prepare.sh; then
        say "SKIP: tests/gpu/prepare.sh failed (no network or no apt?)"
        exit 77
    fi
else
    say "using $DEPS ($(du -sh "$DEPS" | cut -f1))"
fi

expect=3
if ls /proc/driver/nvidia/gpus/* >/dev/null 2>&1 || { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; then
    expect=0
    say "this machine has a GPU: check.sh will run its checks and must pass"
fi

# check.sh in the hidden-packages environment. PKG_CONFIG_PATH points at the
# system's .pc files: offline_env.sh must drop it.
sys_pc=$(pkg-config --variable pc_path pkg-config 2>/dev/null || echo /usr/lib/x86_64-linux-gnu/pkgconfig)
mkdir -p "$OUT"
say "tests/gpu/check.sh --quick (build $BUILD, prefix $PREFIX)"
PKG_CONFIG_PATH=$sys_pc DP_GPU_BUILD=$BUILD DP_GPU_DEPS=$DEPS DP_GPU_DEPS_PREFIX=$PREFIX \
    DP_GPU_JOBS=${DP_OFFLINE_JOBS:-1} DP_CUDA_ARCH=${DP_CUDA_ARCH:-90} \
    nice -n 19 tests/gpu/check.sh --quick --out "$OUT" > "$OUT/offline_test.log" 2>&1
rc=$?
tail -n 15 "$OUT/check.log" | sed 's/^/  | /'
[ "$rc" -eq "$expect" ] || fail "check.sh exited $rc, expected $expect (see $OUT/check.log)"
if [ "$expect" = 3 ]; then
    grep -q "no GPU on this machine" "$OUT/check.log" || fail "no 'no GPU on this machine' message in $OUT/check.log"
fi

# The summary: exit status and the steps that ran.
python3 - "$OUT/summary.json" "$expect" <<'EOF' || fail "summary.json is wrong"
import json, sys
s = json.load(open(sys.argv[1]))
want = int(sys.argv[2])
steps = [x["name"] for x in s["steps"]]
assert s["exit"] == want, s
assert s["deps"].startswith("offline:"), s["deps"]
for n in ("deps", "nvcc", "probe", "configure", "build", "device"):
    assert n in steps, (n, steps)
assert all(x["status"] == "ok" for x in s["steps"] if x["name"] != "device"), s["steps"]
if want == 3:
    assert "no GPU on this machine" in s["message"], s["message"]
    assert s["result"] == "no GPU on this machine", s["result"]
print("offline_test: summary.json: exit %d, steps %s" % (s["exit"], ", ".join(steps)))
EOF

# The same environment as check.sh had (the unpacked tree is reused).
# shellcheck source=tests/gpu/offline_env.sh
. tests/gpu/offline_env.sh "$DEPS" "$PREFIX" > /dev/null || fail "offline_env.sh failed"
P=$DP_DEPS_PREFIX
for d in ${sys_pc//:/ }; do
    case ":$PKG_CONFIG_LIBDIR:" in *":$d:"*) fail "PKG_CONFIG_LIBDIR names the system's $d" ;; esac
done
[ -z "${PKG_CONFIG_PATH:-}" ] || fail "PKG_CONFIG_PATH still set: $PKG_CONFIG_PATH"
for m in libuv libmicrohttpd libcjson openblas; do
    d=$(pkg-config --variable pcfiledir "$m")
    case "$d" in "$P"/*) ;; *) fail "pkg-config finds $m in $d, not in $P" ;; esac
done

# meson: each dependency's flags name the prefix.
meson introspect --dependencies "$BUILD" > "$OUT/dependencies.json" || fail "meson introspect failed"
python3 - "$OUT/dependencies.json" "$P" <<'EOF' || fail "meson did not take every library from the prefix"
import json, sys
deps, p = json.load(open(sys.argv[1])), sys.argv[2]
by = {d["name"]: d for d in deps}
for n in ("libuv", "libmicrohttpd", "libcjson", "openblas"):
    d = by.get(n)
    assert d, "meson found no %s (has %s)" % (n, sorted(by))
    inc = [a for a in d["compile_args"] if a.startswith("-I")]
    lib = [a for a in d["link_args"] if a.startswith(("-L", "/"))]
    assert inc and all(a.startswith("-I" + p) for a in inc), (n, d["compile_args"])
    assert lib and all(a.startswith(("-L" + p, p)) for a in lib), (n, d["link_args"])
    print("offline_test: meson: %s %s: %s %s" % (n, d.get("version", "?"), inc[0], lib[0]))
EOF

# The headers the compiler read (ninja's depfile records): every one of the
# four libraries' headers from the prefix, none from the system.
ninja -C "$BUILD" -t deps > "$OUT/ninja-deps.txt" || fail "ninja -t deps failed"
for h in uv.h microhttpd.h cjson/cJSON.h cblas.h; do
    grep -qE "^ +$P/.*/$h\$" "$OUT/ninja-deps.txt" || fail "no object read $h from $P"
    if bad=$(grep -E "^ +/usr/.*/$h\$" "$OUT/ninja-deps.txt" | sort -u | head -n 3) && [ -n "$bad" ]; then
        fail "the build read the system's $h: $bad"
    fi
done
say "headers: uv.h, microhttpd.h, cJSON.h and cblas.h read from $P only ($(grep -cE "^ +$P/" "$OUT/ninja-deps.txt") header reads from the prefix)"

# The daemon, run with check.sh's LD_LIBRARY_PATH, loads the prefix's libraries.
ldd "$BUILD/daemon/dualpathd" > "$OUT/ldd.txt" 2>&1 || fail "ldd failed: $(cat "$OUT/ldd.txt")"
for l in libuv.so.1 libmicrohttpd.so.12 libcjson.so.1 libopenblas.so.0; do
    grep -qE "^\s*$l => $P/" "$OUT/ldd.txt" || fail "dualpathd does not load $l from $P: $(grep "$l" "$OUT/ldd.txt")"
done
grep -q "not found" "$OUT/ldd.txt" && fail "dualpathd misses libraries: $(grep 'not found' "$OUT/ldd.txt")"
"$BUILD/daemon/dualpathd" --version > /dev/null || fail "dualpathd --version failed"
say "dualpathd loads libuv, libmicrohttpd, cJSON and OpenBLAS from $P and runs"

say "PASS in $(( $(date +%s) - T0 )) s"
