"""How crowded the shared region gets as more agents are merged: shares of unique, shared and conflicting elements.

For a set of N agents with task vectors tau_i = theta_i - theta_0 and RAM's activity mask m_i = |tau_i| > eps,
each floating element e of the model has an overlap count c(e) = sum_i m_i(e). Over all elements:

    untouched = P[c = 0],   unique = P[c = 1],   shared = P[c >= 2]
    conflict  = P[c >= 2 and the active tau_i(e) do not all have one sign] / shared

``shared_independent`` is what ``shared`` would be if the masks were independent with each agent's overall density
d_i: 1 - prod_i (1 - d_i) - sum_i d_i prod_{j != i} (1 - d_j). RAM averages the shared region (dividing each
agent's update there by c) and keeps the unique one, so a shared share that grows with N is the dilution RAM
cannot avoid, and a conflict share that grows is where a plain average cancels updates (``shared: elect``).

Tensors are read one at a time (the base and the agents' same tensor), in float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from agentmerge.api import overlap_count, task_vectors, update_mask

EPSILON = 1e-5  # RAM's default activity threshold


def _weights(folder: str | Path) -> Path:
    path = Path(folder)
    return path / "model.safetensors" if path.is_dir() else path


def tensor_counts(tau: torch.Tensor, eps: float = EPSILON) -> dict[str, int]:
    """``[N, E]`` task vectors -> element counts: untouched, unique, shared, conflict, and active per agent."""
    mask = update_mask(tau, eps)
    count = overlap_count(mask)
    shared = count >= 2
    positive = ((tau > 0) & mask).any(0)
    negative = ((tau < 0) & mask).any(0)
    out = {
        "untouched": int((count == 0).sum()),
        "unique": int((count == 1).sum()),
        "shared": int(shared.sum()),
        "conflict": int((shared & positive & negative).sum()),
    }
    for i, active in enumerate(mask.sum(1).tolist()):
        out[f"active{i}"] = int(active)
    return out


def independent_shared(densities: Sequence[float]) -> float:
    """P[c >= 2] for independent masks of the given densities."""
    none = 1.0
    for d in densities:
        none *= 1.0 - d
    exactly_one = 0.0
    for i, d in enumerate(densities):
        rest = 1.0
        for j, other in enumerate(densities):
            if j != i:
                rest *= 1.0 - other
        exactly_one += d * rest
    return 1.0 - none - exactly_one


def crowding(base: str | Path, agents: Sequence[str | Path], eps: float = EPSILON) -> dict[str, Any]:
    """Shares of untouched / unique / shared elements, the conflicting share of the shared region, and the
    agents' densities, over every floating tensor of the base (agents may be stored in another float dtype)."""
    totals: dict[str, int] = {}
    numel = 0
    with ExitStack() as stack:
        ref = stack.enter_context(safe_open(str(_weights(base)), "pt"))
        models = [stack.enter_context(safe_open(str(_weights(a)), "pt")) for a in agents]
        for name in ref.keys():  # noqa: SIM118 - safe_open has no iterator
            w0 = ref.get_tensor(name)
            if not w0.dtype.is_floating_point:
                continue
            stacked = torch.stack([m.get_tensor(name).float().flatten() for m in models])
            counts = tensor_counts(task_vectors(w0.flatten(), stacked), eps)
            for key, value in counts.items():
                totals[key] = totals.get(key, 0) + value
            numel += w0.numel()
    densities = [totals[f"active{i}"] / numel for i in range(len(agents))]
    shared = totals["shared"] / numel
    return {
        "agents": len(agents),
        "untouched": totals["untouched"] / numel,
        "unique": totals["unique"] / numel,
        "shared": shared,
        "conflict": totals["conflict"] / totals["shared"] if totals["shared"] else 0.0,
        "shared_independent": independent_shared(densities),
        "densities": densities,
        "epsilon": eps,
    }
