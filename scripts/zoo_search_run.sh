#!/usr/bin/env bash
# agentmerge search on the char zoo (docs/search.md "Cost"): one seed, the three agents of one regime, a stated
# budget; the baseline is TSV-M with its alpha tuned on the same validation set first (a sweep), then the search
# (CMA-ES over a weight per agent and layer group of task arithmetic), then both scored once on test.
# Resumable: the zoo build skips its finished stages, the sweep and the search skip their recorded trials, and the
# evaluations are cached under WORK/evals; one process at a time (one trial in flight).
#
#   PYTHONPATH=src:zoo/src nohup nice -n 10 bash scripts/zoo_search_run.sh > logs/zoo-search.log 2>&1 &
#
# Environment: PY (python), ZOO (.zoo-cache), WORK (search-work), SEED (0), REGIME (fp32_bf16), SUITE (core; six:
# the six-domain zoo of the many-agent study, its six agents merged), TASKS (the validation tasks; default
# code,tool,mem_short,mem_long, with SUITE=six also math,sort,search),
# STEPS (the agents' RL steps, e.g. code=20,tool=20,memory=20; empty: the regime's), N (validation prompts per
# task, 100), TEST_N (test prompts per task, 1000), BUDGET (trials, 24), K (layers per group, 2), ALPHAS (TSV-M's
# alphas tried, "1 1.5 2 2.5").
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
ZOO=${ZOO:-.zoo-cache}
WORK=${WORK:-search-work}
SEED=${SEED:-0}
REGIME=${REGIME:-fp32_bf16}
STEPS=${STEPS-}
N=${N:-100}
TEST_N=${TEST_N:-1000}
BUDGET=${BUDGET:-24}
K=${K:-2}
SUITE=${SUITE:-core}
default_tasks=code,tool,mem_short,mem_long
[ "$SUITE" = six ] && default_tasks=$default_tasks,math,sort,search
TASKS=${TASKS:-$default_tasks}
ALPHAS=${ALPHAS:-"1 1.5 2 2.5"}
steps=(); [ -n "$STEPS" ] && steps=(--steps "$STEPS")
# the zoo's base and this regime's agents: the build prints each stage's folder (NAME<TAB>PATH)
built=$("$PY" -m agentmerge zoo build --out "$ZOO" --seed "$SEED" --regime "$REGIME" --suite "$SUITE" "${steps[@]}" --threads 1 --quiet)
BASE=$(realpath "$(echo "$built" | awk -F'\t' '$1 == "base" {print $2}')")
AGENTS=$(echo "$built" | awk -F'\t' '$1 != "base" {print $2}' | xargs realpath | paste -sd, -)
echo "base $BASE; agents $AGENTS"
mkdir -p "$WORK"
common="base: $BASE
models: [${AGENTS}]
evaluate_options: {n: $N, tasks: [$(echo "$TASKS" | sed 's/,/, /g')], cache: $(realpath "$WORK")/evals}
objective: agentic_avg
merge: {dtype: bfloat16}
resources: {cpus: 1}"
alphas=$(echo $ALPHAS | tr ' ' ',')
cat > "$WORK/baseline.yaml" <<EOF
$common
methods: {tsv: {alpha: [$alphas]}}
evaluate: zoo
keep: none
EOF
"$PY" -m agentmerge sweep "$WORK/baseline.yaml" --out "$WORK/baseline" --max-concurrent 1 --quiet
alpha=$("$PY" -c "import json,sys; rs=[json.loads(l) for l in open(sys.argv[1])]; \
print(max((r for r in rs if r['status']=='ok'), key=lambda r: r['metrics']['agentic_avg'])['params']['scale'])" \
  "$WORK/baseline/results.jsonl")
cat > "$WORK/search.yaml" <<EOF
$common
space:
  method: task_arithmetic
  layers_per_group: $K
  per_agent: {weight: [0, 2]}
  params: {lambda: 1.0}
search: {kind: cmaes, n_trials: $BUDGET, seed: $SEED}
evaluate: zoo
test: zoo:test
test_options: {n: $TEST_N}
baseline: {method: tsv, params: {alpha: $alpha}}
keep: best
EOF
"$PY" -m agentmerge search "$WORK/search.yaml" --out "$WORK/search" --max-concurrent 1 --quiet
