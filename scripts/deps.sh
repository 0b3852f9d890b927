#!/usr/bin/env bash
# Installs the Debian packages the build and tests need (only those missing),
# and the Python test tools into a virtual environment under the cache.
set -euo pipefail
cd "$(dirname "$0")/.."
# The packages of a list that are not installed, and their installation.
not_installed() {
    local out="" p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || out="$out $p"
    done
    echo "$out"
}
apt_install() {
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -q
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "$@"
}
PKGS="build-essential meson ninja-build pkg-config libopenblas-dev libuv1-dev libmicrohttpd-dev libcjson-dev clang libclang-rt-dev gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user python3 python3-venv python3-pip"
# shellcheck disable=SC2086
missing=$(not_installed $PKGS)
# python3/pip may come from elsewhere (pyenv); accept them when they work.
if [ -n "$missing" ]; then
    filtered=""
    for p in $missing; do
        case "$p" in
            python3) command -v python3 >/dev/null || filtered="$filtered $p" ;;
            python3-venv) python3 -c 'import venv, ensurepip' 2>/dev/null || filtered="$filtered $p" ;;
            python3-pip) python3 -m pip --version >/dev/null 2>&1 || filtered="$filtered $p" ;;
            *) filtered="$filtered $p" ;;
        esac
    done
    missing="$filtered"
fi
if [ -n "${missing// /}" ]; then
    echo "deps: installing Debian packages:$missing"
    # shellcheck disable=SC2086
    apt_install $missing
else
    echo "deps: Debian packages present"
fi
if [ "${1:-}" = "--python" ]; then
    # The chat page's browser test (tests/e2e/test_chat_page.py) drives Chromium.
    tmissing=$(not_installed chromium chromium-driver)
    if [ -n "${tmissing// /}" ]; then
        echo "deps: installing Debian packages for the tests:$tmissing"
        # shellcheck disable=SC2086
        apt_install $tmissing
    fi
    CACHE="${DP_CACHE:-$HOME/.cache/dualpath}"
    VENV="$CACHE/venv"
    if [ ! -x "$VENV/bin/python" ]; then
        echo "deps: creating Python venv $VENV"
        python3 -m venv "$VENV"
    fi
    if ! "$VENV/bin/python" -c 'import numpy, gguf, tokenizers, openai, pytest, jsonschema, langchain_openai, litellm, selenium' 2>/dev/null; then
        echo "deps: installing Python test packages into $VENV"
        "$VENV/bin/pip" install --quiet -r tests/requirements.txt
    else
        echo "deps: Python test packages present in $VENV"
    fi
fi
