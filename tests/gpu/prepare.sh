#!/usr/bin/env bash
# prepare.sh: run on a networked Debian/Ubuntu machine before a GPU check. Downloads
# (apt-get download: no root needed, nothing is installed) the .deb files the CUDA
# build needs on a bare, offline GPU machine into .gpu-deps/debs/, with a
# MANIFEST; tests/gpu/check.sh unpacks them there into a private prefix
# (tests/gpu/offline_env.sh). The default model is copied into .gpu-deps/model/
# too when the folder stays under the carry budget (it travels with the working
# tree, 64 MiB at most in all); otherwise check.sh serves models/ when the GPU
# machine has it, else a synthetic model.
#
# Usage: tests/gpu/prepare.sh [DIR]      (DIR defaults to .gpu-deps)
# Environment: DP_GPU_DEPS_BUDGET_MIB    most the folder may hold with the model (60)
#              DP_DEBS_ARCH              another Debian architecture (arm64: the
#                                        cross build of tests/cross/aarch64.sh);
#                                        apt's lists for it are kept in DIR/apt,
#                                        the system's apt is not changed
# (tests/cross/aarch64.sh uses it for the libraries of a cross build.)
# Exit: 0 ready; 2 a package could not be resolved or downloaded.
set -euo pipefail
cd "$(dirname "$0")/../.."

DIR=${1:-.gpu-deps}
BUDGET_MIB=${DP_GPU_DEPS_BUDGET_MIB:-60}
ARCH=${DP_DEBS_ARCH:-}
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf

# What the build links (the -dev packages with their runtime libraries), and
# pkg-config itself for an image that has none. Their dependencies are added
# below from apt-cache depends.
PKGS="libuv1-dev libuv1 libmicrohttpd-dev libmicrohttpd12 libcjson-dev libcjson1
      libopenblas-dev libopenblas0 libopenblas-pthread-dev libopenblas0-pthread libgfortran5
      pkgconf-bin libpkgconf3"
# Never carried: every system that can run a compiler has these, and a second
# libc would be harmful. -dev packages pulled in only as dependencies of the
# ones above (libgnutls28-dev for libmicrohttpd-dev, ...) are there for static
# linking and are skipped as well.
SKIP=" libc6 libgcc-s1 libstdc++6 gcc-12-base gcc-13-base gcc-14-base zlib1g debconf dpkg
       perl-base tar libcrypt1 "

if ! command -v apt-get >/dev/null || ! command -v apt-cache >/dev/null; then
    echo "prepare.sh: apt-get/apt-cache not found: run this on a Debian or Ubuntu machine" >&2
    exit 2
fi

# Another architecture: apt's own state (lists, cache, an empty dpkg status)
# in DIR/apt, from the system's sources, so that nothing system-wide changes
# (no dpkg --add-architecture). Its C library, libgcc and libstdc++ come with
# the cross compiler; zlib and libcrypt do not, so they are carried.
APT=()
if [ -n "$ARCH" ] && [ "$ARCH" != "$(dpkg --print-architecture 2>/dev/null)" ]; then
    A="$DIR/apt"
    mkdir -p "$A/state/lists/partial" "$A/cache/archives/partial"
    : > "$A/state/status"
    APT=(-o "Dir::State=$A/state" -o "Dir::State::status=$A/state/status" -o "Dir::Cache=$A/cache"
         -o "APT::Architecture=$ARCH" -o "APT::Architectures::=$ARCH" -o Debug::NoLocking=1)
    [ "$(id -u)" -eq 0 ] && APT+=(-o APT::Sandbox::User=root)
    SKIP=" libc6 libgcc-s1 libstdc++6 gcc-12-base gcc-13-base gcc-14-base debconf dpkg perl-base tar "
    PKGS=${PKGS/pkgconf-bin libpkgconf3/}
    MODEL=""                      # a cross build's tests use synthetic models
    BUDGET_MIB=${DP_GPU_DEPS_BUDGET_MIB:-256}
    if [ -z "$(find "$A/state/lists" -maxdepth 1 -name '*Packages*' -print -quit)" ] ||
       [ -n "$(find "$A/state/lists" -maxdepth 1 -name '*Packages*' -mtime +1 -print -quit)" ]; then
        echo "prepare.sh: apt-get update for $ARCH into $A"
        apt-get -q "${APT[@]}" update >/dev/null ||
            { echo "prepare.sh: apt-get update for $ARCH failed" >&2; exit 2; }
    fi
fi

# deps PKG...: the direct dependencies apt would choose for each (the first of
# each alternative group; the first provider of a virtual package), one call.
deps() {
    apt-cache "${APT[@]}" depends --no-recommends --no-suggests --no-conflicts --no-breaks \
        --no-replaces --no-enhances "$@" 2>/dev/null | awk '
        /^[^ ]/ { ingroup = 0; want = 0; next }
        /^ *\|?(Pre)?Depends: / {
            alt = ($0 ~ /^ *\|/); l = $0
            sub(/^ *\|?(Pre)?Depends: /, "", l)
            if (!ingroup) { if (l ~ /^</) want = 1; else print l }
            ingroup = alt; next
        }
        want && /^    [^ ]/ { l = $0; sub(/^ +/, "", l); print l; want = 0 }'
}

# shellcheck disable=SC2086
if ! apt-cache "${APT[@]}" show --no-all-versions $PKGS >/dev/null 2>&1; then
    echo "prepare.sh: apt does not know all of the packages; running apt-get update"
    if [ ${#APT[@]} -gt 0 ]; then apt-get -q "${APT[@]}" update >/dev/null || true
    elif [ "$(id -u)" -eq 0 ]; then apt-get update -q || true
    elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo apt-get update -q || true
    fi
    for p in $PKGS; do
        apt-cache "${APT[@]}" show --no-all-versions "$p" >/dev/null 2>&1 ||
            { echo "prepare.sh: package $p not found (apt-get update needed?)" >&2; exit 2; }
    done
fi

# The closure of PKGS under deps, level by level, less SKIP and the -dev
# packages not asked for (an unknown one makes apt-get download fail below).
declare -A seen=()
level=()
for p in $PKGS; do seen[$p]=1; level+=("$p"); done
all=()
while [ ${#level[@]} -gt 0 ]; do
    all+=("${level[@]}")
    next=()
    for d in $(deps "${level[@]}"); do
        d=${d%%:*}
        [ -n "${seen[$d]:-}" ] && continue
        seen[$d]=1
        case "$SKIP" in *" $d "*) continue ;; esac
        case "$d" in *-dev) continue ;; esac
        next+=("$d")
    done
    level=("${next[@]}")
done
mapfile -t all < <(printf '%s\n' "${all[@]}" | sort -u)
echo "prepare.sh: ${#all[@]} packages: ${all[*]}"

mkdir -p "$DIR/debs"
# apt-get download --print-uris: 'URI' FILE SIZE SHA256:HASH, one a package;
# files already there with the right hash are kept (a second run is quick).
uris=$(apt-get "${APT[@]}" download --print-uris "${all[@]}") || { echo "prepare.sh: apt-get download --print-uris failed" >&2; exit 2; }
want=()
fetch=()
while read -r _uri file _size hash; do
    [ -n "${file:-}" ] || continue
    want+=("$file")
    sum=${hash#*:}
    if [ -f "$DIR/debs/$file" ] && [ "$(sha256sum "$DIR/debs/$file" | cut -d' ' -f1)" = "$sum" ]; then
        continue
    fi
    fetch+=("$file")
done <<< "$uris"
# Files of other versions or packages left from an earlier run.
for f in "$DIR"/debs/*.deb; do
    [ -e "$f" ] || continue
    case " ${want[*]} " in *" ${f##*/} "*) ;; *) echo "prepare.sh: removing stale ${f##*/}"; rm -f "$f" ;; esac
done
if [ ${#fetch[@]} -gt 0 ]; then
    # Package names from the file names (NAME_VERSION_ARCH.deb); downloading as
    # root needs the sandbox user switched off (it could not write here).
    names=()
    for f in "${fetch[@]}"; do names+=("${f%%_*}"); done
    sandbox=()
    [ "$(id -u)" -eq 0 ] && sandbox=(-o APT::Sandbox::User=root)
    (cd "$DIR/debs" && apt-get "${APT[@]}" download -q "${sandbox[@]}" "${names[@]}") ||
        { echo "prepare.sh: apt-get download failed" >&2; exit 2; }
else
    echo "prepare.sh: all ${#want[@]} .deb files already present"
fi
for f in "${want[@]}"; do
    [ -f "$DIR/debs/$f" ] || { echo "prepare.sh: $f missing after the download" >&2; exit 2; }
done

# The newest glibc symbol version the carried libraries need: offline_env.sh
# warns when the GPU machine's glibc is older.
need_glibc=""
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if command -v dpkg-deb >/dev/null && command -v objdump >/dev/null; then
    for f in "${want[@]}"; do dpkg-deb -x "$DIR/debs/$f" "$tmp/x"; done
    need_glibc=$(find "$tmp/x" -type f -name '*.so*' -exec objdump -T {} + 2>/dev/null |
                 grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n 1)
fi

{
    echo "# .deb files for tests/gpu/offline_env.sh, from tests/gpu/prepare.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "# $(sed -n 's/^PRETTY_NAME=//p' /etc/os-release 2>/dev/null | tr -d '"'), $(dpkg --print-architecture 2>/dev/null)"
    echo "need_glibc=${need_glibc:-unknown}"
    for f in "${want[@]}"; do echo "$(sha256sum "$DIR/debs/$f" | cut -d' ' -f1)  $f"; done
} > "$DIR/debs/MANIFEST"

# The default model, when it fits the budget.
debs_b=$(du -sb "$DIR/debs" | cut -f1)
if [ -z "$MODEL" ]; then
    :
elif [ -f "$MODEL" ]; then
    model_b=$(stat -c %s "$MODEL")
    if [ $((debs_b + model_b)) -le $((BUDGET_MIB * 1024 * 1024)) ]; then
        mkdir -p "$DIR/model"
        cmp -s "$MODEL" "$DIR/model/${MODEL##*/}" 2>/dev/null || cp "$MODEL" "$DIR/model/"
        echo "prepare.sh: copied $MODEL ($((model_b / 1048576)) MiB)"
    else
        rm -rf "$DIR/model"
        echo "prepare.sh: $MODEL is $((model_b / 1048576)) MiB: with the .deb files it exceeds ${BUDGET_MIB} MiB, not copied" \
             "(check.sh serves models/ when the GPU machine has it, else a synthetic model)"
    fi
else
    echo "prepare.sh: $MODEL absent: check.sh will serve a synthetic model"
fi

total_b=$(du -sb "$DIR" | cut -f1)
echo "prepare.sh: $DIR holds ${#want[@]} .deb files, $(awk -v b="$total_b" 'BEGIN { printf "%.1f MiB", b / 1048576 }') in all" \
     "(needs glibc >= ${need_glibc:-?})"
if [ "$total_b" -gt $((BUDGET_MIB * 1024 * 1024)) ]; then
    echo "prepare.sh: $DIR exceeds ${BUDGET_MIB} MiB" >&2
    exit 2
fi
