#!/usr/bin/env bash
# agentmerge search on the real zoo (docs/search.md "The real zoo"): the SmolLM2-135M base and its agents, the
# `real` evaluator (the zoo's skills, cached by the weights' digest); the baseline is TSV-M with its alpha tuned on
# the same validation prompts first (a sweep), then the search (CMA-ES over a task-arithmetic weight per agent and
# layer group), then both scored once on test.
#
#   PYTHONPATH=src:zoo/src BASE=real-work/base AGENTS=a/agent_tool,a/agent_code,a/agent_memory WORK=real-search \
#     nohup bash scripts/real_search_run.sh > logs/real-search.log 2>&1 &
#
# Environment: PY (python), BASE, AGENTS (comma-separated agent folders, in TRAINED's order), TRAINED (their skills,
# tool,code,memory), WORK (real-search), SEED (0), N (validation prompts per skill, 32), TEST_N (test prompts per
# skill, 64), BUDGET (trials, 24), K (layers per group, 10), ALPHAS (TSV-M's alphas tried, "0.5 1 1.5 2"),
# CONCURRENT (trials at once, one thread each, 2), DTYPE (the compute dtype: auto, the checkpoints' own, or float32
# for a CPU without native bfloat16, docs/real/README.md). Validation scores the trained skills; test adds capitals (held
# out: forgetting). Resumable: the sweep and the search skip recorded trials.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
: "${BASE:?BASE: the real zoo's base folder}" "${AGENTS:?AGENTS: the agents' folders, comma-separated}"
TRAINED=${TRAINED:-tool,code,memory}
WORK=${WORK:-real-search}
SEED=${SEED:-0}
N=${N:-32}
TEST_N=${TEST_N:-64}
BUDGET=${BUDGET:-24}
K=${K:-10}
ALPHAS=${ALPHAS:-"0.5 1 1.5 2"}
CONCURRENT=${CONCURRENT:-2}
DTYPE=${DTYPE:-auto}
mkdir -p "$WORK"
models=$(echo "$AGENTS" | tr ',' '\n' | xargs realpath | paste -sd, -)
trained="[$(echo "$TRAINED" | sed 's/,/, /g')]"
scored="[$(echo "$TRAINED,capitals" | sed 's/,/, /g')]"  # test: the held-out skill too (forgetting)
common="base: $(realpath "$BASE")
models: [$models]
evaluate_options: {n: $N, skills: $trained, trained: $trained, dtype: $DTYPE, cache: $(realpath "$WORK")/evals}
objective: trained_avg
merge: {dtype: bfloat16}
resources: {cpus: 1}"
cat > "$WORK/baseline.yaml" <<EOF
$common
methods: {tsv: {alpha: [$(echo $ALPHAS | tr ' ' ',')]}}
evaluate: real
keep: none
EOF
"$PY" -m agentmerge sweep "$WORK/baseline.yaml" --out "$WORK/baseline" --max-concurrent "$CONCURRENT" --quiet
alpha=$("$PY" -c "import json,sys; rs=[json.loads(l) for l in open(sys.argv[1])]; \
p=max((r for r in rs if r['status']=='ok'), key=lambda r: r['metrics']['trained_avg'])['params']; print(p.get('alpha', p.get('scale')))" \
  "$WORK/baseline/results.jsonl")
echo "TSV-M alpha chosen on validation: $alpha"
cat > "$WORK/search.yaml" <<EOF
$common
space:
  method: task_arithmetic
  layers_per_group: $K
  per_agent: {weight: [0, 2]}
  params: {lambda: 1.0}
search: {kind: cmaes, n_trials: $BUDGET, seed: $SEED}
evaluate: real
test: real:test
test_options: {n: $TEST_N, skills: $scored, trained: $trained, cache: $(realpath "$WORK")/evals}
baseline: {method: tsv, params: {alpha: $alpha}}
keep: best
EOF
"$PY" -m agentmerge search "$WORK/search.yaml" --out "$WORK/search" --max-concurrent "$CONCURRENT" --quiet
