#!/usr/bin/env bash
# `meson install --destdir`: the daemon, the load generator, the unit, the
# sysusers/tmpfiles snippets, the example config and the docs land in their
# FHS places under the build's prefix; then the installed unit passes
# `systemd-analyze verify`, the snippets pass systemd-sysusers/-tmpfiles, and
# the unit's hardening is reported (`systemd-analyze security`).
#   usage: tests/ops/test_install.sh [BUILD_DIR]   (already built)
#
# Why --root: `systemd-analyze verify` checks that ExecStart's binary exists;
# with --root=DESTDIR it looks for PREFIX/bin/dualpathd inside DESTDIR. The
# root has no systemd of its own (no sysinit.target), so dependency loading
# fails there; --recursive-errors=no limits the verdict to our unit (unknown
# keys, bad values and a missing binary still fail it).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD="${1:-build}"
[ -f "$BUILD/build.ninja" ] || { echo "install: $BUILD is not a meson build dir" >&2; exit 1; }

if ! command -v systemd-analyze >/dev/null; then
    echo "install: installing systemd (for systemd-analyze)"
    SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get install -y systemd >/dev/null ||
        { $SUDO apt-get update -qq && $SUDO apt-get install -y systemd >/dev/null; }
fi

D=$(mktemp -d /tmp/dualpath-install.XXXXXX)
trap 'rm -rf "$D"' EXIT
meson install -C "$BUILD" --no-rebuild --quiet --destdir "$D"

opt() {  # a meson option of the build, as meson resolved it
    meson introspect "$BUILD" --buildoptions |
        python3 -c "import json,sys; print(next(o['value'] for o in json.load(sys.stdin) if o['name']=='$1'))"
}
PREFIX=$(opt prefix)
abs() { case "$1" in /*) echo "$1" ;; *) echo "$PREFIX/$1" ;; esac; }
BINDIR=$(abs "$(opt bindir)")
SYSCONFDIR=$(abs "$(opt sysconfdir)")
DATADIR=$(abs "$(opt datadir)")

fail=0
expect() {  # expect MODE PATH: the file exists under DESTDIR (x: executable)
    local f="$D$2"
    if [ ! -f "$f" ] || { [ "$1" = x ] && [ ! -x "$f" ]; }; then
        echo "install: FAIL: missing $2" >&2
        fail=1
    else
        echo "install: $2"
    fi
}
expect x "$BINDIR/dualpathd"
expect x "$BINDIR/dp-loadgen"
expect f "$PREFIX/lib/systemd/system/dualpathd.service"
expect f "$PREFIX/lib/sysusers.d/dualpath.conf"
expect f "$PREFIX/lib/tmpfiles.d/dualpath.conf"
expect f "$SYSCONFDIR/dualpath/dualpathd.conf"
expect f "$DATADIR/doc/dualpath/README.md"
expect f "$DATADIR/doc/dualpath/dualpath.md"
[ "$fail" -eq 0 ] || { echo "install: installed files:" >&2; (cd "$D" && find . -type f) >&2; exit 1; }

UNIT="$D$PREFIX/lib/systemd/system/dualpathd.service"
grep -qx "ExecStart=$BINDIR/dualpathd --config $SYSCONFDIR/dualpath/dualpathd.conf" "$UNIT" ||
    { echo "install: FAIL: ExecStart does not name the installed binary and config" >&2; exit 1; }
if grep -q '@[A-Z]*@' "$UNIT"; then
    echo "install: FAIL: unsubstituted @VARS@ in the unit" >&2; exit 1
fi
# The installed example config is what the binary itself validates.
"$D$BINDIR/dualpathd" --config "$D$SYSCONFDIR/dualpath/dualpathd.conf" --check-config

echo "install: systemd-analyze verify"
OUT=$(systemd-analyze verify --man=no --root="$D" --recursive-errors=no "$UNIT" 2>&1) || {
    echo "$OUT" >&2; echo "install: FAIL: systemd-analyze verify" >&2; exit 1; }
# verify exits 0 on some warnings (unknown keys are "ignoring"): treat any output as failure.
[ -z "$OUT" ] || { echo "$OUT" >&2; echo "install: FAIL: systemd-analyze verify warned" >&2; exit 1; }

echo "install: systemd-sysusers and systemd-tmpfiles on the snippets (into DESTDIR)"
mkdir -p "$D/etc"
systemd-sysusers --root="$D" "$D$PREFIX/lib/sysusers.d/dualpath.conf"
grep -q '^dualpath:' "$D/etc/passwd" || { echo "install: FAIL: no dualpath user" >&2; exit 1; }
if [ "$(id -u)" -eq 0 ]; then  # it chowns to dualpath
    systemd-tmpfiles --root="$D" --create "$D$PREFIX/lib/tmpfiles.d/dualpath.conf"
    [ -d "$D/var/lib/dualpath/models" ] || { echo "install: FAIL: no /var/lib/dualpath/models" >&2; exit 1; }
else
    echo "install: not root: systemd-tmpfiles --create skipped"
fi

SCORE=$(systemd-analyze security --offline=yes --root="$D" "$UNIT" 2>/dev/null |
        sed -n 's/.*Overall exposure level for dualpathd.service: \([0-9.]*\).*/\1/p')
echo "install: systemd-analyze security: exposure $SCORE (0 = locked down, 10 = exposed)"
python3 -c "import sys; sys.exit(0 if float('${SCORE:-10}') <= 3.0 else 1)" ||
    { echo "install: FAIL: exposure above 3.0" >&2; exit 1; }
echo "install: all tests passed"
