#!/usr/bin/env bash
# lm-eval-check.sh: runs lm-evaluation-harness (local-completions, the
# server's tokenizer) against dualpathd and compares every loglikelihood it
# logged with the NumPy reference (tools/lm_eval_check.py says how). The
# harness lives in its own venv in the cache, outside the checkout: it pulls
# datasets, evaluate and scikit-learn, which nothing else here needs.
#   usage: tools/lm-eval-check.sh [DUALPATHD] [MODEL] [-- lm_eval_check.py args]
# Environment: DP_CACHE (default ~/.cache/dualpath), LM_EVAL_VERSION (0.4.13).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${DP_CACHE:-$HOME/.cache/dualpath}"
VENV="$CACHE/lm-eval-venv"
VER="${LM_EVAL_VERSION:-0.4.13}"
POS=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do POS+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
BIN="${POS[0]:-build/daemon/dualpathd}"
MODEL="${POS[1]:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
[ -x "$BIN" ] || { echo "lm-eval-check: no daemon at $BIN (build first)" >&2; exit 2; }
[ -f "$MODEL" ] || { echo "lm-eval-check: no model at $MODEL (scripts/fetch-model.sh)" >&2; exit 2; }
if ! "$VENV/bin/python" -c "import lm_eval, numpy, gguf, tokenizers" 2>/dev/null ||
   [ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("lm_eval"))')" != "$VER" ]; then
    echo "lm-eval-check: installing lm-eval[api]==$VER into $VENV" >&2
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q "lm-eval[api]==$VER" numpy gguf tokenizers >&2
fi
exec "$VENV/bin/python" tools/lm_eval_check.py --dualpathd "$BIN" --model "$MODEL" "$@"
