#!/usr/bin/env bash
# The many-agent study (docs/many/results.md): the six-domain zoo (.zoo-cache/six/seed{S}), merges of 2, 3, 4 and 6
# agents with every method of agentmerge_zoo.many.MANY_RUNS, seeds $SEEDS, regime $REGIME.
# Resumable: zoo stages, merges (sweep records under bench-work/many/) and evaluations (bench-work/evals/six/) are
# cached, so a rerun only does what is missing; the last command finds every trial recorded and writes the docs.
#
#   PY=.venv/bin/python nohup nice -n 10 bash scripts/zoo_many_run.sh > many-run.log 2>&1 &
set -euo pipefail
PY=${PY:-python}
SEEDS=${SEEDS:-"0 1 2"}
REGIME=${REGIME:-fp32_bf16}
export PYTHONPATH=${PYTHONPATH:-src:zoo/src}
M=(--regime "$REGIME" --threads 1 --max-concurrent 1)
for seed in $SEEDS; do
    "$PY" -m agentmerge zoo many "${M[@]}" --seeds "$seed" --docs "bench-work/docs-many-s$seed" > "bench-work/many-s$seed.log" 2>&1 &
done
wait
all=$(echo $SEEDS | tr ' ' ',')
"$PY" -m agentmerge zoo many "${M[@]}" --seeds "$all" --docs docs/many
