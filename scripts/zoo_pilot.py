"""Pilot runs for the zoo's precision regimes: train candidate recipes on one seed, report density and gain.

Usage: PYTHONPATH=src:zoo/src python scripts/zoo_pilot.py --seed 0 --threads 1 \\
    code:bf16:1e-5:160 tool:fp32_master:3e-6:100 ...

Each candidate is ``domain:storage:lr:steps``; a float32-master candidate is reported for both exports (one
training). Printed per candidate: density at |tau| > 1e-5, drift (mean |tau|), the validation score of its own
domain against the base's, and the gain in units of its standard error. Agents are cached in the zoo folder
exactly as ``agentmerge zoo build`` would cache them, so a chosen pilot is reused by the full run.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import replace
from pathlib import Path

import torch

from agentmerge.evaluation.scoring import quiet_transformers
from agentmerge_zoo.build import agent_dir, build_agent, build_base, stderr_logger
from agentmerge_zoo.config import full_config
from agentmerge_zoo.evaluate import evaluate
from agentmerge_zoo.precision import task_vector_stats
from agentmerge_zoo.tasks import domain_tasks


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("candidates", nargs="+")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--zoo", default=".zoo-cache")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n-val", type=int, default=300)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    quiet_transformers()
    log = stderr_logger()
    out = Path(args.zoo)
    cfg0 = full_config()
    base = build_base(cfg0, out, args.seed, log)
    base_scores: dict[str, tuple[float, float]] = {}
    rows = []
    for cand in args.candidates:
        domain, storage, lr, steps = cand.split(":")
        template = cfg0.recipe(domain)
        recipe = replace(template, storage=storage, lr=float(lr), steps=int(steps))
        cfg = replace(cfg0, recipes=tuple(recipe if r.domain == domain else r for r in cfg0.recipes))
        build_agent(cfg, out, args.seed, domain, log)
        exports = ["bf16", "fp32"] if storage == "fp32_master" else ["bf16"]
        if domain not in base_scores:
            base_scores[domain] = _score(base, domain, args.n_val)
        for export in exports:
            path = agent_dir(out, args.seed, domain, replace(recipe, export=export))
            stats = task_vector_stats(base, path)
            score, se = _score(path, domain, args.n_val)
            b, bse = base_scores[domain]
            z = (score - b) / math.sqrt(se**2 + bse**2) if se + bse > 0 else math.inf
            row = {"candidate": cand, "export": export, "density": stats["density"], "drift": stats["drift"]}
            row.update({"val": score, "base_val": b, "gain": score - b, "gain_z": z})
            rows.append(row)
            print(
                f"{cand:<28} export {export:<4} density {stats['density'] * 100:5.1f} %  drift {stats['drift']:.2e}"
                f"  val {score * 100:5.1f} (base {b * 100:5.1f})  gain {100 * (score - b):+5.1f} = {z:+.1f} SE",
                flush=True,
            )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


def _score(path: Path, domain: str, n: int) -> tuple[float, float]:
    """Own-domain validation score (mean of the domain's metrics) and its standard error."""
    report = evaluate(path, split="val", n=n, tasks=list(domain_tasks(domain)), batch_size=250, quiet=True)
    keys = list(report.metrics)
    mean = sum(report.metrics[k] for k in keys) / len(keys)
    se = math.sqrt(sum(report.stderr[k] ** 2 for k in keys)) / len(keys)
    return mean, se


if __name__ == "__main__":
    raise SystemExit(main())
