#!/usr/bin/env bash
# Create .venv (if missing) and install agentmerge with its test and plot extras, and the agent zoo (zoo/, a
# distribution of its own that plugs into agentmerge), both editable, in one pip call.
# torch is pinned first: the CPU wheel of 2.13.0 is what this project is tested with.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e '.[dev,sweep]' -e ./zoo
