#!/usr/bin/env bash
# The fair zoo run (issue 25; docs/zoo.md "The fair bench"): per precision regime, converge the agents, then bench
# every method at its defaults and tuned alike, with the convergence check per agent, pairs, dilution and (in
# paper_like) the RAM+ ablation. Regime by regime, and resumable: every zoo stage is cached under ZOO (trainings
# continue from their saved state when an agent gets more steps), every merge is a sweep trial recorded under
# WORK/{regime}/seed{S}, every evaluation is cached under WORK/evals, so rerunning the same command after a kill
# only does what is missing.
#
#   PYTHONPATH=src:zoo/src nohup nice -n 10 bash scripts/zoo_fair_run.sh > fair-run.log 2>&1 &
#
# Per regime: (1) `zoo check --rounds ROUNDS`: check every seed's agents, give the agents that fail in some seed
# GROWTH x more steps (all seeds alike), check again; its rounds go to DOCS/convergence/{regime}.{json,md};
# (2) one `zoo bench` process per seed (PARALLEL at a time, one merge trial each) at the steps the loop settled
# on; (3) the seeds aggregated into DOCS/results.{json,md} and DOCS/regime-map.png from the caches; (4) with
# COMMIT=1, a commit of those docs (a machine may not survive to the next regime).
# Environment: PY (default python), ZOO (.zoo-cache), WORK (bench-work), SEEDS ("0 1 2"), PARALLEL (2),
# REGIMES ("bf16 fp32_bf16 fp32_fp32 paper_like"; REGIMES="" runs none), ROUNDS (3),
# GROWTH (1: doubles the steps), PAIRS (1),
# CHECK_THREADS (torch threads of the convergence loop, which runs one process: 1),
# MANY (1: last, the many-agent study on the six-domain zoo, regime MANY_REGIME, default fp32_bf16: its own
# convergence loop, then `zoo many` at the steps it settled on, into DOCS/many and DOCS/convergence/six-*),
# DOCS (docs), COMMIT (0); SMOKE=1 runs it all at the smoke sizes (checks the script, not who wins).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
ZOO=${ZOO:-.zoo-cache}
WORK=${WORK:-bench-work}
SEEDS=${SEEDS:-"0 1 2"}
PARALLEL=${PARALLEL:-2}
REGIMES=${REGIMES-"bf16 fp32_bf16 fp32_fp32 paper_like"}  # set but empty: no regime (e.g. only MANY=1)
ROUNDS=${ROUNDS:-3}
GROWTH=${GROWTH:-1}
PAIRS=${PAIRS:-1}
CHECK_THREADS=${CHECK_THREADS:-1}
MANY=${MANY:-1}
MANY_REGIME=${MANY_REGIME:-fp32_bf16}
DOCS=${DOCS:-docs}
smoke=(); [ "${SMOKE:-0}" = 1 ] && smoke=(--smoke)
all=$(echo $SEEDS | tr ' ' ',')
pairs=(); [ "$PAIRS" = 1 ] || pairs=(--no-pairs)
zoo() { "$PY" -m agentmerge zoo "$@" "${smoke[@]}"; }
mkdir -p "$WORK" "$DOCS/convergence"

# one base per seed serves every regime: built one after another so no two processes race on one
for seed in $SEEDS; do zoo build --out "$ZOO" --seed "$seed" --threads 1 --quiet > /dev/null; done

for regime in $REGIMES; do
    echo "== $regime: convergence loop ($(date -u +%H:%M:%S))" >&2
    zoo check --zoo "$ZOO" --work "$WORK" --regime "$regime" --seeds "$all" --rounds "$ROUNDS" --growth "$GROWTH" \
        --out "$DOCS/convergence/$regime.json" --threads "$CHECK_THREADS" --quiet > "$WORK/check-$regime.log"
    if grep -q "^still failing" "$WORK/check-$regime.log"; then
        echo "== $regime: some agent still fails the check after $ROUNDS rounds (see $DOCS/convergence/$regime.md)" >&2
    fi
    steps=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["steps"])' "$DOCS/convergence/$regime.json")
    echo "== $regime: bench at --steps $steps ($(date -u +%H:%M:%S))" >&2
    bench() { zoo bench --zoo "$ZOO" --work "$WORK" --regimes "$regime" --steps "$steps" "${pairs[@]}" \
        --threads 1 --max-concurrent 1 --quiet "$@"; }
    running=0
    for seed in $SEEDS; do
        bench --seeds "$seed" --docs "$WORK/fair-docs-s$seed" > "$WORK/fair-$regime-seed$seed.log" 2>&1 &
        running=$((running + 1))
        if [ "$running" -ge "$PARALLEL" ]; then wait -n; running=$((running - 1)); fi
    done
    wait
    bench --seeds "$all" --docs "$DOCS"
    if [ "${COMMIT:-0}" = 1 ]; then
        git add "$DOCS/results.json" "$DOCS/results.md" "$DOCS/convergence/$regime".*
        if [ -f "$DOCS/regime-map.png" ]; then git add "$DOCS/regime-map.png"; fi
        git commit -m "Zoo fair run: regime $regime (converged agents, defaults and tuned)" || true
    fi
done

[ "$MANY" = 1 ] || exit 0
echo "== many agents ($MANY_REGIME): convergence loop ($(date -u +%H:%M:%S))" >&2
conv="$DOCS/convergence/six-$MANY_REGIME"
zoo check --zoo "$ZOO" --work "$WORK" --regime "$MANY_REGIME" --suite six --seeds "$all" --rounds "$ROUNDS" \
    --growth "$GROWTH" --out "$conv.json" --threads "$CHECK_THREADS" --quiet > "$WORK/check-six-$MANY_REGIME.log"
steps=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["steps"])' "$conv.json")
echo "== many agents: study at --steps $steps ($(date -u +%H:%M:%S))" >&2
zoo many --zoo "$ZOO" --work "$WORK" --docs "$DOCS/many" --seeds "$all" --regime "$MANY_REGIME" --steps "$steps" \
    --threads 1 --max-concurrent "$PARALLEL" --quiet > "$WORK/many.log" 2>&1
if [ "${COMMIT:-0}" = 1 ]; then
    git add "$DOCS/many" "$conv".*
    git commit -m "Zoo fair run: the many-agent study (converged six-domain agents, defaults and tuned)" || true
fi
