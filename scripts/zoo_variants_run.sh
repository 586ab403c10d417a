#!/usr/bin/env bash
# The RAM variants on the zoo (docs/variants/results.md): core methods plus every variant of docs/methods.md
# ("RAM variants"), seeds 0-2, in the precision regimes of $REGIMES (the committed file was made in two runs,
# REGIMES=paper_like,fp32_bf16 and REGIMES=bf16,fp32_fp32; each regime's section records its command).
# Resumable: zoo stages, merges and evaluations are cached under .zoo-cache/ and bench-work/, so a rerun only does what is missing.
#
#   PY=.venv/bin/python nohup nice -n 10 bash scripts/zoo_variants_run.sh > variants-run.log 2>&1 &
set -euo pipefail
PY=${PY:-python}
SEEDS=${SEEDS:-"0 1 2"}
REGIMES=${REGIMES:-bf16,paper_like,fp32_bf16,fp32_fp32}
export PYTHONPATH=${PYTHONPATH:-src:zoo/src}
V=(--regimes "$REGIMES" --threads 1 --max-concurrent 1 --quiet --no-pairs --no-ablation --methods core --variants)
# one base per seed serves both regimes: build each seed's zoo before its seed process starts
for seed in $SEEDS; do "$PY" -m agentmerge zoo build --seed "$seed" --regime paper_like --threads 1 --quiet > /dev/null; done
for seed in $SEEDS; do
    "$PY" -m agentmerge zoo bench "${V[@]}" --seeds "$seed" --docs "bench-work/docs-v-s$seed" > "bench-work/variants-s$seed.log" 2>&1 &
done
wait
all=$(echo $SEEDS | tr ' ' ',')
"$PY" -m agentmerge zoo bench "${V[@]}" --seeds "$all" --docs docs/variants
