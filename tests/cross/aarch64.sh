#!/usr/bin/env bash
# aarch64.sh: the portable C path on aarch64. Cross-builds the whole project
# (daemon, tools, tests; CUDA off) with Debian's gcc-aarch64-linux-gnu against
# arm64 libraries unpacked into a private prefix, and runs the unit tests under
# qemu-user. Nothing system-wide changes: the arm64 .deb files come from
# tests/gpu/prepare.sh with apt's state kept in the cache (no dpkg
# --add-architecture), and tests/gpu/offline_env.sh unpacks them.
#
# Usage: tests/cross/aarch64.sh [BUILD_DIR] [TEST...]   (default build-aarch64; all unit tests)
# Exit: 0 built and passed; 77 no cross compiler or qemu-aarch64
#       (scripts/deps.sh installs gcc-aarch64-linux-gnu and qemu-user);
#       other: a step failed.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build-aarch64}
shift || true
CACHE=${DP_CACHE:-$HOME/.cache/dualpath}
DEBS=$CACHE/debs-arm64
P=$CACHE/prefix-arm64
SYSROOT=/usr/aarch64-linux-gnu

for t in aarch64-linux-gnu-gcc qemu-aarch64; do
    if ! command -v "$t" >/dev/null; then
        echo "aarch64: $t not found (scripts/deps.sh installs gcc-aarch64-linux-gnu and qemu-user)" >&2
        exit 77
    fi
done

DP_DEBS_ARCH=arm64 tests/gpu/prepare.sh "$DEBS"
# Every carried library goes to lib-run, also where this (x86-64) system has
# one of the same SONAME: those are the other architecture's. A subshell, so
# that its LD_LIBRARY_PATH never reaches this machine's own programs.
(DP_OFFLINE_ALL_LIBS=1 . tests/gpu/offline_env.sh "$DEBS/debs" "$P")

pcdirs=$(find "$P/usr" -type d -name pkgconfig | sort | paste -sd: -)
ini="$P/cross-aarch64.ini"
cat > "$ini" <<INI
[binaries]
c = 'aarch64-linux-gnu-gcc'
ar = 'aarch64-linux-gnu-ar'
strip = 'aarch64-linux-gnu-strip'
pkgconfig = 'pkg-config'
exe_wrapper = ['qemu-aarch64', '-L', '$SYSROOT', '-E', 'LD_LIBRARY_PATH=$P/lib-run']

[built-in options]
c_link_args = ['-Wl,-rpath-link,$P/lib-run']

[properties]
pkg_config_libdir = '$pcdirs'

[host_machine]
system = 'linux'
cpu_family = 'aarch64'
cpu = 'aarch64'
endian = 'little'
INI

if [ ! -f "$B/build.ninja" ]; then
    meson setup "$B" --cross-file "$ini" --buildtype=release -Dcuda=disabled
fi
ninja -C "$B"
file "$B/daemon/dualpathd" | grep -q 'ARM aarch64' ||
    { echo "aarch64: $B/daemon/dualpathd is not an aarch64 binary" >&2; exit 1; }
echo "aarch64: built $(file -b "$B/daemon/dualpathd" | cut -d, -f1-2)"

# The real model's checks (test_forward, test_engine) are skipped: under the
# emulator they take most of an hour, and they run the portable C kernels
# that the x86-64 build tests natively at its baseline level.
DP_TEST_SYNTHETIC_ONLY=1 meson test -C "$B" --print-errorlogs --no-rebuild --timeout-multiplier 4 "$@"
