"""What a search's ``early_stop`` saves on a small synthetic search (docs/search.md, "Early stopping").

A base that always answers "1" and two agents that answer "7" and "3" (the tests' ``tinylm.constant_lm``, a
one-layer Llama); task arithmetic with a weight per agent on the head, searched at random in [0.01, 0.6] per
weight (about half the points leave the base's answer, scoring 0; the others score 0.5); a task file of
``--per-task`` sevens and as many threes. The same search (seed, budget) runs twice, without and with
``early_stop``; each prints its trials, stopped trials, wall seconds, trial seconds and best score.

    PYTHONPATH=src:tests python scripts/search_early_bench.py --work /tmp/early-bench --trials 40
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import yaml

from agentmerge.sweep.run import run_sweep
from agentmerge.sweep.sweepfile import sweep_from_dict
from tinylm import constant_lm


def family(root: Path, per_task: int) -> dict[str, str]:
    root.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = [{"task": t, "defaults": {"max_new_tokens": 8, "match": "contains"}} for t in "73"]
    rows += [{"task": t, "prompt": f"Say {t}, item {i}", "reference": t} for t in "73" for i in range(per_task)]
    (root / "val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    names = {"base": "1", "seven": "7", "three": "3"}
    return {n: str(constant_lm(root / n, a)) for n, a in names.items()} | {"tasks": str(root / "val.jsonl")}


def search(paths: dict[str, str], trials: int, early: dict[str, Any] | None) -> dict[str, Any]:
    block: dict[str, Any] = {"kind": "random", "n_trials": trials, "seed": 0}
    return {
        "base": paths["base"],
        "models": [paths["seven"], paths["three"]],
        "space": {"method": "task_arithmetic", "groups": ["head"], "per_agent": {"weight": [0.01, 0.6]}},
        "search": block | ({"early_stop": early} if early else {}),
        "evaluate": f"tasks:{paths['tasks']}",
        "merge": {"dtype": "float32"},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--per-task", type=int, default=200)
    ap.add_argument("--first", type=int, default=40)
    ap.add_argument("--margin", type=float, default=0.1)
    args = ap.parse_args()
    paths = family(args.work / "family", args.per_task)
    for name, early in (("full", None), ("early", {"first": args.first, "margin": args.margin})):
        data = search(paths, args.trials, early)
        (args.work / f"{name}.yaml").write_text(yaml.safe_dump(data))
        t0 = time.perf_counter()
        out = run_sweep(sweep_from_dict(data, f"{name}.yaml"), args.work / name, quiet=True, max_concurrent=1)
        wall = time.perf_counter() - t0
        stopped = sum(bool(r.get("stopped_early")) for r in out.records)
        trial_s = sum(float(r.get("seconds", 0.0)) for r in out.records)
        best = out.best["metrics"]["tasks_avg"] if out.best else None
        print(f"{name}: {len(out.records)} trials, {stopped} stopped early, {wall:.1f} s wall, "
              f"{trial_s:.1f} s of trials, best tasks_avg {best}")  # fmt: skip


if __name__ == "__main__":
    main()
