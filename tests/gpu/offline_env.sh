# shellcheck shell=bash
# offline_env.sh: the build's libraries from carried .deb files, on a machine
# without those packages, without a network and without root (sourced, not run).
#
#   . tests/gpu/offline_env.sh DEBDIR [PREFIX]
#
# Unpacks every DEBDIR/**.deb (tests/gpu/prepare.sh downloads them) into PREFIX
# (default: build-gpu-deps in the repository; never /), with dpkg-deb -x where
# there is one, else ar + tar, else Python. Then, as dpkg, ldconfig and
# update-alternatives would have: the .pc files' paths (prefix=, libdir=,
# includedir=, ... and -I/-L) point into PREFIX, absolute symlinks point into
# PREFIX, and each shared library is reachable by its SONAME (Debian's
# libopenblas.so.0 is an alternatives link). It exports:
#
#   PKG_CONFIG_LIBDIR  PREFIX's pkgconfig folders only (PKG_CONFIG_PATH unset):
#                      the system's .pc files cannot be picked up
#   LD_LIBRARY_PATH    PREFIX/lib-run first: links to PREFIX's libraries (those
#                      the build links always; their support libraries such as
#                      GnuTLS only where the system lacks that SONAME, or
#                      always with DP_OFFLINE_ALL_LIBS=1: another architecture's)
#   PATH, PKG_CONFIG   PREFIX/bin first, and its pkg-config (the carried pkgconf),
#                      when the system has none
#   DP_DEPS_PREFIX     PREFIX
#
# A second call with the same .deb files and PREFIX reuses the unpacked tree.
# Returns non-zero (with a message) on failure; the caller decides.

# Libraries our binaries link, or that only they load: always PREFIX's, even
# where the system has one of the same SONAME (it may be older than the
# headers the build used). Everything else carried is a fallback.
DP_OFFLINE_OWN_LIBS="libuv.so.* libmicrohttpd.so.* libcjson.so.* libcjson_utils.so.* libopenblas*.so*
libgfortran.so.* libquadmath.so.* libpkgconf.so.*"

_dp_oe_say() { echo "offline_env: $*"; }

# _dp_oe_unpack DEB DEST. DP_OFFLINE_UNPACK=ar or python skips the earlier
# ways (a test of the fallbacks on a machine that has dpkg-deb).
_dp_oe_unpack() {
    local deb=$1 dest=$2 how=${DP_OFFLINE_UNPACK:-} t m
    if [ -z "$how" ] && command -v dpkg-deb >/dev/null 2>&1; then
        dpkg-deb -x "$deb" "$dest"
        return
    fi
    t=$(mktemp -d) || return 1
    if [ "$how" != python ] && command -v ar >/dev/null 2>&1 && (cd "$t" && ar x "$deb") 2>/dev/null; then
        for m in "$t"/data.tar*; do
            [ -f "$m" ] || continue
            if tar -xf "$m" -C "$dest" 2>/dev/null; then rm -rf "$t"; return 0; fi
        done
    fi
    rm -rf "$t"
    # No dpkg-deb and no usable ar/tar (or tar without xz): Python's ar is a
    # few lines and tarfile reads gz, xz and bz2.
    command -v python3 >/dev/null 2>&1 || { _dp_oe_say "cannot unpack $deb: no dpkg-deb, ar+tar or python3"; return 1; }
    python3 - "$deb" "$dest" <<'EOF'
import io, sys, tarfile
deb, dest = sys.argv[1], sys.argv[2]
with open(deb, 'rb') as f:
    data = f.read()
if data[:8] != b'!<arch>\n':
    sys.exit(f'{deb}: not an ar archive')
off = 8
while off + 60 <= len(data):
    name = data[off:off + 16].decode().strip().rstrip('/')
    size = int(data[off + 48:off + 58].decode().strip())
    body = data[off + 60:off + 60 + size]
    off += 60 + size + (size & 1)
    if name.startswith('data.tar'):
        if name.endswith('.zst'):
            sys.exit(f'{deb}: data.tar.zst needs zstd (tar --zstd) or dpkg-deb')
        with tarfile.open(fileobj=io.BytesIO(body), mode='r:*') as t:
            t.extractall(dest, filter='tar') if hasattr(tarfile, 'data_filter') else t.extractall(dest)
        sys.exit(0)
sys.exit(f'{deb}: no data.tar member')
EOF
}

# _dp_oe_soname FILE: the SONAME of a shared library (empty when unknown).
_dp_oe_soname() {
    if command -v readelf >/dev/null 2>&1; then
        readelf -d "$1" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p' | head -n 1
    elif command -v objdump >/dev/null 2>&1; then
        objdump -p "$1" 2>/dev/null | awk '$1 == "SONAME" { print $2; exit }'
    fi
}

_dp_oe_own() {
    local pat
    for pat in $DP_OFFLINE_OWN_LIBS; do
        # shellcheck disable=SC2254
        case "$1" in $pat) return 0 ;; esac
    done
    return 1
}

# _dp_oe_fix PREFIX: .pc paths, absolute symlinks, SONAME links, lib-run, bin.
_dp_oe_fix() {
    local P=$1 f t d so sys_sonames=""
    # .pc files: every absolute /usr path into PREFIX; Requires.private dropped
    # (the modules it names are for static linking: libmicrohttpd names gnutls,
    # whose -dev package is not carried, and pkg-config refuses a missing one).
    while IFS= read -r f; do
        sed -i -E -e "s#^([A-Za-z_][A-Za-z0-9_.]*)=/usr([/[:space:]]|\$)#\1=$P/usr\2#" \
                  -e "s#(-[IL])/usr/#\1$P/usr/#g" -e '/^Requires\.private:/d' "$f"
    done < <(find "$P" -name '*.pc' \( -type f -o -type l \))
    # Absolute symlinks (to /usr/..., or alternatives under /etc) into PREFIX.
    while IFS= read -r f; do
        t=$(readlink "$f")
        case "$t" in /*) ;; *) continue ;; esac
        if [ -e "$P$t" ] || [ -L "$P$t" ]; then ln -sfn "$P$t" "$f"
        else _dp_oe_say "warning: $f points to $t, absent from the prefix"
        fi
    done < <(find "$P" -type l)
    # SONAME links next to each real library, where the package does not
    # ship one (ldconfig or update-alternatives makes them on Debian).
    while IFS= read -r f; do
        so=$(_dp_oe_soname "$f")
        [ -n "$so" ] || continue
        d=${f%/*}
        [ -e "$d/$so" ] || ln -s "${f##*/}" "$d/$so"
    done < <(find "$P/usr/lib" "$P/lib" -type f -name '*.so*' 2>/dev/null)
    # lib-run: one link per SONAME, the folder LD_LIBRARY_PATH names.
    if command -v ldconfig >/dev/null 2>&1; then sys_sonames=$(ldconfig -p 2>/dev/null)
    elif [ -x /sbin/ldconfig ]; then sys_sonames=$(/sbin/ldconfig -p 2>/dev/null)
    fi
    rm -rf "$P/lib-run"
    mkdir -p "$P/lib-run"
    while IFS= read -r f; do
        so=${f##*/}
        [ -e "$P/lib-run/$so" ] && continue
        if [ -z "${DP_OFFLINE_ALL_LIBS:-}" ] && ! _dp_oe_own "$so" && printf '%s\n' "$sys_sonames" | grep -q "^[[:space:]]*$so "; then
            continue    # the system's own (GnuTLS and its kind)
        fi
        ln -s "$f" "$P/lib-run/$so"
    done < <(find "$P/usr/lib" "$P/lib" \( -type f -o -type l \) -name '*.so.[0-9]*' 2>/dev/null |
             awk -F/ '{ n = $NF; if (n ~ /\.so\.[0-9]+$/) print }' | sort)
    # pkg-config for a machine without one (pkgconf-bin).
    mkdir -p "$P/bin"
    if [ -x "$P/usr/bin/pkgconf" ]; then ln -sfn "$P/usr/bin/pkgconf" "$P/bin/pkg-config"; fi
}

dp_offline_env() {
    local debdir=${1:-} P=${2:-} stamp f old_umask need have
    if [ -z "$debdir" ] || [ ! -d "$debdir" ]; then
        _dp_oe_say "usage: . tests/gpu/offline_env.sh DEBDIR [PREFIX] (no folder '$debdir')"
        return 2
    fi
    [ -n "$P" ] || P="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/build-gpu-deps"
    mkdir -p "$P" || return 2
    P=$(cd "$P" && pwd -P) || return 2
    debdir=$(cd "$debdir" && pwd -P) || return 2
    case "$P" in /|/usr|/usr/*|/etc|/etc/*|/bin|/lib|/lib64|/sbin|"")
        _dp_oe_say "refusing to unpack into '$P'"; return 2 ;;
    esac
    local debs=()
    while IFS= read -r f; do debs+=("$f"); done < <(find "$debdir" -maxdepth 2 -name '*.deb' -type f | sort)
    if [ ${#debs[@]} -eq 0 ]; then _dp_oe_say "no .deb files in $debdir"; return 2; fi

    # The stamp: which .deb files (name and size) made this tree, and where.
    stamp=$(printf '%s\n' "$P" && for f in "${debs[@]}"; do printf '%s %s\n' "${f##*/}" "$(wc -c < "$f")"; done)
    if [ -f "$P/.offline-env-stamp" ] && [ "$(cat "$P/.offline-env-stamp")" = "$stamp" ]; then
        _dp_oe_say "reusing $P (${#debs[@]} packages)"
    else
        _dp_oe_say "unpacking ${#debs[@]} packages from $debdir into $P"
        # Only what an earlier unpack made: the prefix may be given by a user.
        rm -rf "${P:?}/usr" "${P:?}/lib" "${P:?}/lib64" "${P:?}/etc" "${P:?}/bin" "${P:?}/lib-run" \
               "${P:?}/.offline-env-stamp"
        old_umask=$(umask); umask 022
        for f in "${debs[@]}"; do
            _dp_oe_unpack "$f" "$P" || { umask "$old_umask"; _dp_oe_say "failed to unpack $f"; return 2; }
        done
        umask "$old_umask"
        _dp_oe_fix "$P" || return 2
        printf '%s\n' "$stamp" > "$P/.offline-env-stamp"
    fi

    # Exports.
    local pcdirs
    pcdirs=$( { find "$P/usr" "$P/lib" -type d -name pkgconfig 2>/dev/null || true; } | sort | paste -sd: -)
    export PKG_CONFIG_LIBDIR="$pcdirs"
    unset PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR
    export LD_LIBRARY_PATH="$P/lib-run${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export DP_DEPS_PREFIX="$P"
    # DP_OFFLINE_PKGCONF=1: the carried one even where the system has one.
    if { [ -n "${DP_OFFLINE_PKGCONF:-}" ] || ! command -v pkg-config >/dev/null 2>&1; } &&
       [ -e "$P/bin/pkg-config" ]; then
        export PATH="$P/bin:$PATH" PKG_CONFIG="$P/bin/pkg-config"
        _dp_oe_say "using the carried pkgconf ($PKG_CONFIG)"
    fi
    # glibc: the carried libraries were built for the one in the MANIFEST.
    need=$( { sed -n "s/^need_glibc=//p" "$debdir"/MANIFEST "$debdir"/debs/MANIFEST 2>/dev/null || true; } | head -n 1)
    have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')
    if [ -n "$need" ] && [ "$need" != unknown ] && [ -n "$have" ] &&
       [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -n 1)" != "$need" ]; then
        _dp_oe_say "warning: the carried libraries need glibc >= $need, this machine has $have"
    fi
    for f in libuv libmicrohttpd libcjson openblas; do
        pkg-config --exists "$f" || { _dp_oe_say "pkg-config does not find $f in $P"; return 2; }
    done
    _dp_oe_say "PKG_CONFIG_LIBDIR=$PKG_CONFIG_LIBDIR"
    _dp_oe_say "libuv $(pkg-config --modversion libuv), libmicrohttpd $(pkg-config --modversion libmicrohttpd)," \
               "cJSON $(pkg-config --modversion libcjson), OpenBLAS $(pkg-config --modversion openblas)" \
               "from $P; lib-run: $(find "$P/lib-run" -mindepth 1 -printf '%f\n' | sort | paste -sd' ' -)"
    return 0
}

if [ $# -gt 0 ]; then
    dp_offline_env "$@"
fi
