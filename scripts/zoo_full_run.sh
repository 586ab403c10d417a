#!/usr/bin/env bash
# The full zoo run over precision regimes (docs/results.md). Resumable: every zoo stage is cached under
# .zoo-cache/, every merge is a sweep trial recorded in bench-work/{regime}/seed{S}/sweep-*/results.jsonl and
# every evaluation is cached under bench-work/evals, so rerunning this script only does what is missing.
#
#   PYTHONPATH=src:zoo/src nohup nice -n 10 bash scripts/zoo_full_run.sh > full-run.log 2>&1 &
#
# Seeds run as separate processes (two at a time on a 2-core machine): phase 1 is each regime's 3-agent
# table, probe, dilution and (paper_like) RAM+ ablation; phase 2 adds the three 2-agent pairs. The last
# command aggregates every seed from the caches into docs/ (every trial recorded: it never starts Ray). Each
# process runs one merge trial at a time (--max-concurrent 1), so PARALLEL is the number of busy cores.
# SEEDS, PARALLEL and PAIRS=0 override the defaults.
set -euo pipefail
PY=${PY:-python}
SEEDS=${SEEDS:-"0 1 2"}
PARALLEL=${PARALLEL:-2}
PAIRS=${PAIRS:-1}
REGIMES=${REGIMES:-bf16,paper_like,fp32_bf16,fp32_fp32}
bench() { "$PY" -m agentmerge zoo bench --regimes "$REGIMES" --threads 1 --max-concurrent 1 --quiet "$@"; }

run_seed() {
    local seed=$1
    bench --seeds "$seed" --no-pairs --docs "bench-work/docs-s$seed"
    if [ "$PAIRS" = 1 ]; then
        bench --seeds "$seed" --docs "bench-work/docs-s$seed"
    fi
}

# one base per seed serves every regime: build the bases one after another so no two processes race on one
for seed in $SEEDS; do "$PY" -m agentmerge zoo build --seed "$seed" --threads 1 --quiet > /dev/null; done

running=0
for seed in $SEEDS; do
    run_seed "$seed" > "bench-work/seed$seed.log" 2>&1 &
    running=$((running + 1))
    if [ "$running" -ge "$PARALLEL" ]; then wait -n; running=$((running - 1)); fi
done
wait

all=$(echo $SEEDS | tr ' ' ',')
if [ "$PAIRS" = 1 ]; then bench --seeds "$all" --docs docs; else bench --seeds "$all" --no-pairs --docs docs; fi
