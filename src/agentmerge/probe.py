"""Probing task vectors: how dense each agent's update is and how much it overlaps the others'.

From the per-tensor overlap histograms ``H[i, k]`` (elements agent i updated together with exactly k
other agents, see ``deltas.py``), per agent and per group of tensors (whole model, layer, module type):

    density_i   = sum_k H[i, k] / numel
    overlap_i,k = H[i, k] / sum_k H[i, k]            (k = 0 is the unique fraction, "w.0")
    rho_i       = sum_{k>=1} H[i, k] / H[i, 0]       (inf when agent i has no unique element)
    lambda_i    = 1 + r * clip(rho_i, 0, alpha)      (the RAM+ scale for the unique region)

``independent`` is what the overlap histogram would be if each agent chose its updated elements
independently at random with its per-tensor density: per tensor t, agent i's updated elements that k
others also update are ``numel_t * d_i(t) * P(k of the others)``, with a Poisson-binomial P.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from agentmerge.deltas import rho_from_histogram
from agentmerge.groups import layer_of, module_type
from agentmerge.methods import ram_lambda
from agentmerge.spec import EPSILON_DEFAULT
from agentmerge.stream import Inputs, overlap_stats, torch_threads


@dataclass(frozen=True)
class AgentStats:
    """One agent over one group of tensors."""

    name: str
    numel: int
    updated: int
    density: float
    overlap: list[float]  # k = 0..N-1: fraction of its updated elements shared with exactly k others
    rho: float
    lam: float


@dataclass
class ProbeResult:
    """Density and overlap per agent: over the model, per layer, per module type, per tensor."""

    base: str
    models: list[str]
    epsilon: float
    r: float
    alpha: float
    agents: list[AgentStats]
    independent: list[list[float]]  # [N][N]: overlap fractions that independent masks would give
    per_layer: dict[str, list[AgentStats]] = field(default_factory=dict)
    per_module: dict[str, list[AgentStats]] = field(default_factory=dict)
    per_tensor: dict[str, list[AgentStats]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        def rows(stats: list[AgentStats]) -> list[dict[str, Any]]:
            return [{**asdict(a), "rho": _finite(a.rho)} for a in stats]

        return {
            "base": self.base,
            "models": self.models,
            "epsilon": self.epsilon,
            "ram_plus": {"r": self.r, "alpha": self.alpha},
            "agents": rows(self.agents),
            "independent_overlap": self.independent,
            "per_layer": {k: rows(v) for k, v in self.per_layer.items()},
            "per_module": {k: rows(v) for k, v in self.per_module.items()},
            "per_tensor": {k: rows(v) for k, v in self.per_tensor.items()},
        }


def _finite(x: float) -> float | str:
    return x if math.isfinite(x) else "inf"


def agent_stats(
    hist: torch.Tensor, numel: int, labels: Sequence[str], r: float = 0.1, alpha: float = 2.0
) -> list[AgentStats]:
    """``[N, N]`` histogram of a group of ``numel`` elements -> per-agent statistics."""
    out = []
    for i, (row, rho) in enumerate(zip(hist.tolist(), rho_from_histogram(hist), strict=True)):
        updated = sum(row)
        overlap = [c / updated if updated else 0.0 for c in row]
        lam = ram_lambda(rho, {"r": r, "alpha": alpha})
        out.append(AgentStats(labels[i], numel, updated, updated / numel if numel else 0.0, overlap, rho, lam))
    return out


def poisson_binomial(probs: Sequence[float]) -> list[float]:
    """P(exactly k of independent events with these probabilities happen), k = 0..len(probs)."""
    dist = [1.0]
    for p in probs:
        dist = [a * (1 - p) + b * p for a, b in zip([*dist, 0.0], [0.0, *dist], strict=True)]
    return dist


def independent_overlap(hists: Mapping[str, torch.Tensor], numels: Mapping[str, int]) -> list[list[float]]:
    """Per agent, the overlap fractions expected if updates were placed independently (per-tensor densities)."""
    n = next(iter(hists.values())).shape[0] if hists else 0
    expected = [[0.0] * n for _ in range(n)]
    for name, h in hists.items():
        dens = [v / numels[name] for v in h.sum(1).tolist()] if numels[name] else [0.0] * n
        for i in range(n):
            others = poisson_binomial([d for j, d in enumerate(dens) if j != i])
            for k, p in enumerate(others):
                expected[i][k] += numels[name] * dens[i] * p
    return [[v / sum(row) if sum(row) else 0.0 for v in row] for row in expected]


def _grouped(
    hists: Mapping[str, torch.Tensor], numels: Mapping[str, int], key: Any, labels: Sequence[str], r: float, a: float
) -> dict[str, list[AgentStats]]:
    groups: dict[str, list[str]] = {}
    for name in hists:
        groups.setdefault(key(name), []).append(name)
    return {
        g: agent_stats(_sum(hists[t] for t in names), sum(numels[t] for t in names), labels, r, a)
        for g, names in sorted(groups.items(), key=lambda kv: _natural(kv[0]))
    }


def _sum(hists: Iterable[torch.Tensor]) -> torch.Tensor:
    items = list(hists)
    return torch.stack(items).sum(0)


def _natural(key: str) -> tuple[int, str]:
    return (int(key), "") if key.isdigit() else (1 << 30, key)


def probe(
    base: str,
    models: Sequence[str],
    *,
    epsilon: float = EPSILON_DEFAULT,
    r: float = 0.1,
    alpha: float = 2.0,
    labels: Sequence[str] | None = None,
    threads: int | None = None,
    chunk_size: int = 1 << 22,
    quiet: bool = False,
    allow_dtype_mismatch: bool = False,
) -> ProbeResult:
    """Read base and models once (streamed) and compute every statistic of ``ProbeResult``.

    ``allow_dtype_mismatch`` accepts models stored in another floating dtype than the base (e.g. a bf16 base
    with fp32 agents); task vectors are then computed in float32.
    """
    labels = list(labels) if labels else [Path(m).name or m for m in models]
    n_threads = threads or os.cpu_count() or 1
    inputs = Inputs(base, list(models), allow_dtype_mismatch=allow_dtype_mismatch)
    try:
        names = [n for n, i in inputs.reference.tensors.items() if i.dtype.is_floating_point and i.numel]
        numels = {n: inputs.reference.tensors[n].numel for n in names}
        with torch_threads(1):
            hists = overlap_stats(inputs, dict.fromkeys(names, epsilon), n_threads, chunk_size, quiet)
    finally:
        inputs.close()
    return probe_from_histograms(hists, numels, base, list(models), labels, epsilon, r, alpha)


def probe_from_histograms(
    hists: Mapping[str, torch.Tensor],
    numels: Mapping[str, int],
    base: str,
    models: list[str],
    labels: Sequence[str],
    epsilon: float,
    r: float = 0.1,
    alpha: float = 2.0,
) -> ProbeResult:
    """Build a ``ProbeResult`` from per-tensor histograms already collected (e.g. by a merge)."""
    total = _sum(hists.values()) if hists else torch.zeros(len(models), len(models), dtype=torch.int64)
    return ProbeResult(
        base=base,
        models=models,
        epsilon=epsilon,
        r=r,
        alpha=alpha,
        agents=agent_stats(total, sum(numels.values()), labels, r, alpha),
        independent=independent_overlap(hists, numels),
        per_layer=_grouped(hists, numels, layer_of, labels, r, alpha),
        per_module=_grouped(hists, numels, module_type, labels, r, alpha),
        per_tensor=_grouped(hists, numels, lambda t: t, labels, r, alpha),
    )
