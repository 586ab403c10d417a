"""The real zoo's convergence check again, on more validation prompts than the bench's (``n_check`` 32).

At 32 prompts two SE of a difference is about 24 points, so the bench's check passes any agent that gains less
than that at s = 1.5. This reruns it for finished seeds' agents at ``--n`` prompts (the first 32 are the bench's),
scales 1 and 1.5 by default (what the verdict compares), with the bench's evaluation and cache:

    PYTHONPATH=src:zoo/src python scripts/real_zoo_check.py --work real-work --seeds 0,1 --n 128 \\
        --json docs/real/check-128.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from agentmerge_zoo.real.convergence import check_agent
from agentmerge_zoo.real.run import agent_paths
from agentmerge_zoo.real.suite import TRAINED


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--scales", default="1,1.5")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    scales = [float(x) for x in args.scales.split(",")]
    out: dict[str, dict[str, object]] = {}
    for seed in (int(s) for s in args.seeds.split(",")):
        agents = agent_paths(args.work, seed)
        scratch = args.work / f"seed{seed}" / f"check-n{args.n}"
        out[str(seed)] = {
            skill: check_agent(
                args.work / "base", agents[skill], skill, scratch, args.n, args.work / "evals", scales, log=_log
            )
            for skill in TRAINED
        }
    args.json.write_text(json.dumps({"n": args.n, "scales": scales, "seeds": out}, indent=1) + "\n")
    for seed, skills in out.items():
        for skill, r in skills.items():
            print(
                f"seed {seed} {skill}: gain at 1.5 {100 * r['gain_1.5']:+.1f} vs 2 SE {100 * r['two_se']:.1f}, "
                f"converged {r['converged']}"
            )


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
