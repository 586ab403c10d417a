"""Task-vector statistics for the precision regimes: density, drift, and overlap by base-weight magnitude.

``task_vector_stats`` gives one agent's density (|tau| > epsilon, as in the probe) and drift (mean |tau| over
every floating element). ``magnitude_overlap`` splits every tensor's elements into quartiles of the base
weight's magnitude |w0| (per tensor, so norm gains near 1 do not swamp the matrices) and reports, per quartile
and agent, the density, the measured unique share w.0 and the w.0 that independent masks of the same
per-tensor-quartile densities would give. Under bf16 rounding a weight moves only when its update exceeds half a
bf16 ulp (about |w0| * 2^-9), so small weights move for every agent and the masks correlate through |w0|.

Agents may be stored in another floating dtype than the base (a bf16 base with fp32 agents): everything is
computed in float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

QUARTILES = ("q1 (smallest |w0|)", "q2", "q3", "q4 (largest |w0|)")


def load_floats(path: str | Path) -> dict[str, torch.Tensor]:
    """Every floating tensor of a checkpoint folder (or a .safetensors file) in float32."""
    file = Path(path)
    if file.is_dir():
        file = file / "model.safetensors"
    return {k: v.float() for k, v in load_file(str(file)).items() if v.dtype.is_floating_point}


def task_vector_stats(base: str | Path, agent: str | Path, epsilon: float = 1e-5) -> dict[str, float]:
    """density (|tau| > epsilon), drift (mean |tau|), updated and total element counts."""
    ref, model = load_floats(base), load_floats(agent)
    updated, numel, abs_sum = 0, 0, 0.0
    for name, w0 in ref.items():
        tau = (model[name] - w0).abs()
        updated += int((tau > epsilon).sum())
        numel += tau.numel()
        abs_sum += float(tau.double().sum())
    return {"density": updated / numel, "drift": abs_sum / numel, "updated": updated, "numel": numel}


def _quartile_index(w0: torch.Tensor) -> torch.Tensor:
    """0..3 per element: the quartile of |w0| within its tensor (ties broken by position, equal-sized bins)."""
    flat = w0.abs().flatten()
    order = torch.argsort(flat, stable=True)
    index = torch.empty_like(order)
    index[order] = torch.arange(flat.numel()) * 4 // max(flat.numel(), 1)
    return index


def magnitude_overlap(
    base: str | Path, agents: Sequence[str | Path], labels: Sequence[str], epsilon: float = 1e-5
) -> dict[str, Any]:
    """Per |w0| quartile and agent: density, measured w.0 and independent-mask w.0 (fractions)."""
    ref = load_floats(base)
    models = [load_floats(a) for a in agents]
    n = len(models)
    counts = torch.zeros(4, n, dtype=torch.float64)  # updated elements
    unique = torch.zeros(4, n, dtype=torch.float64)  # updated by this agent only
    expected_unique = torch.zeros(4, n, dtype=torch.float64)  # under independent masks
    numel = torch.zeros(4, dtype=torch.float64)
    w0_abs = torch.zeros(4, dtype=torch.float64)
    for name, w0 in ref.items():
        q = _quartile_index(w0)
        masks = torch.stack([(m[name] - w0).abs().flatten() > epsilon for m in models])  # [N, E]
        overlap = masks.sum(dim=0)
        for b in range(4):
            sel = q == b
            size = int(sel.sum())
            if size == 0:
                continue
            numel[b] += size
            w0_abs[b] += float(w0.abs().flatten()[sel].double().sum())
            dens = masks[:, sel].double().mean(dim=1)
            for i in range(n):
                upd = masks[i, sel]
                counts[b, i] += float(upd.sum())
                unique[b, i] += float((upd & (overlap[sel] == 1)).sum())
                others = torch.cat([dens[:i], dens[i + 1 :]])
                expected_unique[b, i] += float(upd.sum()) * float(torch.prod(1 - others))
    rows = []
    for b, label in enumerate(QUARTILES):
        agents_out = []
        for i, name in enumerate(labels):
            c = float(counts[b, i])
            agents_out.append(
                {
                    "agent": name,
                    "density": c / float(numel[b]) if numel[b] else 0.0,
                    "w0": float(unique[b, i]) / c if c else float("nan"),
                    "w0_independent": float(expected_unique[b, i]) / c if c else float("nan"),
                }
            )
        mean_abs = float(w0_abs[b] / numel[b]) if numel[b] else 0.0
        rows.append({"quartile": label, "mean_abs_w0": mean_abs, "agents": agents_out})
    return {"epsilon": epsilon, "quartiles": rows}
