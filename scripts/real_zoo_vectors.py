"""Two measurements of one real-zoo seed's agents quoted in docs/real/README.md, read tensor by tensor:

- the cosine between each pair of task vectors tau_i = agent_i - base over every 2-D weight (Model Stock's
  interpolation weight follows from it);
- each agent's total diagonal Fisher mass (the bench's ``fisher/`` files) and the code agent's Fisher weight
  F_code / sum_i F_i on the elements it updated (|tau| > 1e-5), averaged with weights tau^2 (what Fisher merging
  keeps of it, by that weight).

    PYTHONPATH=src:zoo/src python scripts/real_zoo_vectors.py --work real-work --seed 1
"""

from __future__ import annotations

import argparse
import itertools
import math
from pathlib import Path
from typing import Any

from safetensors import safe_open

from agentmerge_zoo.real.suite import TRAINED


def _open(folder: Path) -> Any:
    return safe_open(str(next(folder.glob("*.safetensors"))), "pt")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    seed = args.work / f"seed{args.seed}"
    base = _open(args.work / "base")
    agents = {s: _open(seed / f"agent_{s}") for s in TRAINED}
    fisher = {s: _open(next((seed / "fisher").glob(f"{s}-*"))) for s in TRAINED}
    dots: dict[tuple[str, str], float] = {}
    mass = dict.fromkeys(TRAINED, 0.0)
    num = den = 0.0
    names = base.keys()
    for name in names:
        theta0 = base.get_tensor(name).float()
        tau = {s: a.get_tensor(name).float() - theta0 for s, a in agents.items()}
        if theta0.dim() == 2:
            for a, b in itertools.combinations_with_replacement(TRAINED, 2):
                dots[a, b] = dots.get((a, b), 0.0) + float((tau[a] * tau[b]).sum())
        f = {s: h.get_tensor(name).float() for s, h in fisher.items()}
        for s in TRAINED:
            mass[s] += float(f[s].sum())
        updated = tau["code"].abs() > 1e-5
        weight = (f["code"] + 1e-10) / (sum(f.values()) + 3e-10)  # the Fisher merge's floor on every value
        num += float((weight[updated] * tau["code"][updated].square()).sum())
        den += float(tau["code"][updated].square().sum())
    for a, b in itertools.combinations(TRAINED, 2):
        print(f"cos(tau_{a}, tau_{b}) over 2-D weights: {dots[a, b] / math.sqrt(dots[a, a] * dots[b, b]):.4f}")
    print("Fisher mass: " + ", ".join(f"{s} {m:.3e}" for s, m in mass.items()))
    print(f"code agent's Fisher weight on its updated elements (tau^2-weighted): {num / den:.3f}")


if __name__ == "__main__":
    main()
