#!/usr/bin/env bash
# The real-zoo search's agents (docs/search.md, "The real zoo"): the zoo's recipes at 40 steps each (what fits a
# session here), seed 0, computed in float32 (--float32: this AVX2-only CPU runs bfloat16 8-16x slower), one thread
# each, three at once.
cd /work/wt/run10
export PYTHONPATH=/work/wt/run10/src:/work/wt/run10/zoo/src
W=/work/real-work/mini
pilot() { .venv/bin/agentmerge zoo real pilot --base /work/real-work/base --work $W --skill $1 --seed 0 --steps $2 \
  --n-test 64 --float32 --threads 1 --json $W/pilot-$1.json --quiet; }
pilot tool 40 > $W/tool.log 2>&1 &
pilot code 40 > $W/code.log 2>&1 &
pilot memory 40 > $W/memory.log 2>&1 &
wait
echo done
