#!/usr/bin/env bash
# Waits for the three 40-step agents, then the real-zoo search (scripts/real_search_run.sh) in float32.
until grep -q done /work/real-work/mini/train.log; do sleep 20; done
cd /work/wt/run11
export PYTHONPATH=/work/wt/run11/src:/work/wt/run11/zoo/src
A=/work/real-work/mini/seed0
PY=.venv/bin/python BASE=/work/real-work/base AGENTS=$A/agent_tool,$A/agent_code,$A/agent_memory TRAINED=tool,code,memory \
  WORK=/work/real-work/mini/search-work N=16 TEST_N=64 BUDGET=20 K=10 ALPHAS="0.5 1 1.5 2" CONCURRENT=2 DTYPE=float32 \
  exec bash scripts/real_search_run.sh
