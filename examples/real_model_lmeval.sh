#!/usr/bin/env bash
# lm-eval on a real_model.py run: the reverse (the LoRA agent's task) and upper tasks as local lm-eval tasks,
# with and without the chat template, for the base, the upper-case specialist and the RAM merge.
# Needs the eval extra (pip install 'agentmerge[eval]'); WORK is real_model.py's --work folder.
set -euo pipefail
WORK=${1:?usage: real_model_lmeval.sh WORK}
for m in base agent_upper merges/ram; do
  for ct in plain chat; do
    flag=(); [ "$ct" = chat ] && flag=(--chat-template)
    out="$WORK/lmeval/$(echo "$m" | tr / _)-$ct"
    mkdir -p "$out"
    agentmerge lm-eval "$WORK/$m" --tasks reverse_exact,upper_exact --include-path "$WORK/lm_eval_tasks" "${flag[@]}" \
      --log-samples "$out/samples" --json "$out/results.json" --batch-size 16 > "$out/log.txt" 2>&1
    echo "$m $ct: $(grep -h exact_match "$out/log.txt" | tr -s ' ' | tr '\n' ' ')"
  done
done
