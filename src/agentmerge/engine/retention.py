"""How much of each agent's update merged models kept, per overlap region (``agentmerge probe --merged``).

With base θ0, agent i's task vector τ_i = θ_i − θ0 and a merge's delta Δ = θ_m − θ0, over a set S of elements
(float64 sums of float32 values):

    kept_i(S) = <Δ, τ_i>_S / <τ_i, τ_i>_S        the least-squares coefficient of Δ on τ_i over S
    cos_i     = <Δ, τ_i> / (|Δ| |τ_i|)           over every element

``kept_i`` is 1 where the merge carries the agent's update whole, 1/N where it averages N agents whose
updates there are unrelated (plain averaging everywhere: 1/N; task arithmetic: 1 plus the others' projections),
0 where it drops it. It is reported over every element agent i updated and, as in the probe, per region
``k``: the elements agent i updated together with exactly ``k`` other agents (``k = 0``: its unique updates), so
RAM's rule reads off directly: kept 1 at ``k = 0`` and about 1/(k + 1) above. ``outside`` is the share of
|Δ|² on elements no agent updated (what a merge moved that no agent did, e.g. a low-rank or spectral method's
spill). "Updated" is the probe's mask rule (``|τ| > epsilon`` by default).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from agentmerge.engine.counting import mask_levels
from agentmerge.engine.inputs import Inputs
from agentmerge.engine.merge_plan import resolve_mask
from agentmerge.engine.parallel import fold_parallel, torch_threads
from agentmerge.methods.deltas import task_vectors
from agentmerge.methods.masks import Levels, tensor_mask
from agentmerge.methods.spec import EPSILON_DEFAULT, MaskRule, Params, mask_rule


def region_sums(tau: torch.Tensor, delta: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[N, E]`` task vectors, merged delta ``[E]`` (or ``[K, E]``, K merges), ``[N, E]`` update mask ->
    ``[N, N + 1, 2]`` (or ``[K, N, N + 1, 2]``) float64 sums.

    ``[i, k, 0]`` = <Δ, τ_i> and ``[i, k, 1]`` = <τ_i, τ_i> over the elements agent i updated with exactly ``k``
    others; ``[i, N, 0]`` (the same for every i) = |Δ|² over every element, ``[i, N, 1]`` = |Δ|² where no agent
    updated. The regions and <τ_i, τ_i> are found once for all K merges.
    """
    deltas = delta if delta.dim() == 2 else delta[None]
    n, k = tau.shape[0], deltas.shape[0]
    others = mask.sum(0) - 1  # [E], valid where the agent's own mask holds
    out = torch.zeros(k, n, n + 1, 2, dtype=torch.float64)
    for i in range(n):
        where = mask[i]
        region, t = others[where], tau[i][where]
        out[:, i, :n, 1] = torch.zeros(n, dtype=torch.float64).index_add_(0, region, t.double().square())
        dot = (deltas[:, where] * t).double()  # [K, E_i]
        out[:, i, :n, 0] = torch.zeros(k, n, dtype=torch.float64).index_add_(1, region, dot)
    d2 = deltas.double().square()
    out[:, :, n, 0] = d2.sum(1)[:, None]
    out[:, :, n, 1] = d2[:, ~mask.any(0)].sum(1)[:, None]
    return out if delta.dim() == 2 else out[0]


@dataclass(frozen=True)
class AgentKept:
    """One agent under one merge."""

    name: str
    kept: float  # over every element the agent updated
    by_region: list[float]  # k = 0..N-1 (NaN where the agent has no such element)
    cos: float


@dataclass(frozen=True)
class Retention:
    """One merged model against the agents it was made from."""

    merged: str
    agents: list[AgentKept]
    outside: float  # share of |Δ|² on elements no agent updated

    def to_dict(self) -> dict[str, Any]:
        def row(a: AgentKept) -> dict[str, Any]:
            return {
                **asdict(a),
                "kept": _finite(a.kept),
                "cos": _finite(a.cos),
                "by_region": list(map(_finite, a.by_region)),
            }

        return {"merged": self.merged, "agents": [row(a) for a in self.agents], "outside": self.outside}


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan


def retention_from_sums(total: torch.Tensor, merged: str, labels: Sequence[str]) -> Retention:
    """The ``[N, N + 1, 2]`` sums of ``region_sums`` over a model -> the ``Retention`` they give."""
    n = total.shape[0]
    delta_sq = float(total[0, n, 0])
    agents = []
    for i, label in enumerate(labels):
        dot, sq = total[i, :n, 0], total[i, :n, 1]
        cos = _ratio(float(dot.sum()), math.sqrt(float(sq.sum()) * delta_sq))
        regions = [_ratio(float(d), float(s)) for d, s in zip(dot, sq, strict=True)]
        agents.append(AgentKept(label, _ratio(float(dot.sum()), float(sq.sum())), regions, cos))
    return Retention(merged, agents, _ratio(float(total[0, n, 1]), delta_sq) if delta_sq > 0 else 0.0)


def retention(
    base: str,
    models: Sequence[str],
    merged: Sequence[str],
    *,
    epsilon: float = EPSILON_DEFAULT,
    mask: Params | None = None,
    labels: Sequence[str] | None = None,
    threads: int | None = None,
    chunk_size: int = 1 << 22,
    quiet: bool = False,
    seed: int = 0,
) -> list[Retention]:
    """Read base, agents and every merged model once (streamed, chunk-parallel) -> one ``Retention`` per merge.

    Each merged model is opened as one more model of the same base, so it must have the agents' tensors and
    shapes; tensors with added vocabulary rows count their base rows only. ``mask``: the probe's mask parameters.
    A chunk holds about ``chunk_size`` x (agents + 1) values whatever the number of merges.
    """
    labels = list(labels) if labels else [Path(m).name or m for m in models]
    n_threads = threads or os.cpu_count() or 1
    n, k = len(models), len(merged)
    chunk = max(1 << 12, chunk_size * (n + 1) // (n + k + 1))
    inputs = Inputs(base, [*models, *merged])
    try:
        names = [t for t, i in inputs.reference.tensors.items() if i.dtype.is_floating_point and i.numel]
        params = {"epsilon": epsilon, **(mask or {})}
        rules = {t: mask_rule(resolve_mask(params, inputs.reference.tensors[t].dtype), seed) for t in names}
        with torch_threads(1):
            levels = _agent_levels(base, models, rules, n_threads, chunk_size, quiet)
            total = _sum_pass(inputs, rules, levels, n, n_threads, chunk, quiet)
    finally:
        inputs.close()
    return [retention_from_sums(total[j], m, labels) for j, m in enumerate(merged)]


def _agent_levels(
    base: str, models: Sequence[str], rules: Mapping[str, MaskRule], threads: int, chunk: int, quiet: bool
) -> dict[str, Levels]:
    """An adaptive mask rule's thresholds, from the agents alone (as the probe and a merge compute them)."""
    if not any(rule.adaptive for rule in rules.values()):
        return {}
    agents = Inputs(base, list(models))
    try:
        return mask_levels(agents, rules, threads, chunk, quiet)
    finally:
        agents.close()


def _sum_pass(
    inputs: Inputs,
    rules: Mapping[str, MaskRule],
    levels: Mapping[str, Levels],
    n: int,
    threads: int,
    chunk: int,
    quiet: bool,
) -> torch.Tensor:
    """``[K, N, N + 1, 2]``: ``region_sums`` of each of the K merged models (the inputs past the N agents), summed
    over every chunk of every tensor in task order (the same bits whatever the threads)."""
    k = len(inputs.models) - n

    def task(name: str, start: int, stop: int) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            ref, values = inputs.read(name, start, stop)
            tau = task_vectors(ref, values[:n])
            mask = tensor_mask(tau, ref, rules[name], levels.get(name))
            return region_sums(tau, values[n:] - ref, mask)

        return run

    sizes = {name: inputs.reference.tensors[name].numel for name in rules}
    tasks = [task(name, s, min(s + chunk, numel)) for name, numel in sizes.items() for s in range(0, numel, chunk)]
    start = torch.zeros(k, n, n + 1, 2, dtype=torch.float64)
    with tqdm(total=len(tasks), desc="retention", unit="chunk", disable=quiet or not tasks, leave=False) as bar:
        return fold_parallel(tasks, threads, _add, start, bar)


def _add(acc: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
    return acc.add_(part)
