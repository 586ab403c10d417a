"""The RAM family and the simple baselines: one small reference kernel per method.

A kernel sees one ``Chunk`` (an element range of one tensor, every agent's task vector for it) and
returns the merged task vector ``tau*`` for those elements; the driver writes ``theta_0 + tau*``.
Every kernel is elementwise given its chunk's statistics, so results do not depend on chunking.

RAM (arXiv 2601.13572), per element p, with m_i = |tau_i| > eps and c = sum_i m_i (or another mask
rule of ``masks.py``: a grid of ulps, a percentile or valley threshold per agent and tensor):

    tau*[p] = 0                                   c = 0   (untouched: keep the base)
            = lambda_i * tau_i[p]                 c = 1   (unique to agent i: no dilution)
            = (1/c) * sum_{i: m_i} tau_i[p]       c >= 2  (shared: mean of the agents that moved it)

RAM uses lambda_i = 1. RAM+ rescales unique updates by rho_i = |shared_i| / |unique_i|:
paper form ``lambda_i = 1 + r * clip(rho_i, 0, alpha)``; the authors' code form
``lambda_i = 1 + (R - 1) * min(rho_i, 1)``. rho is counted over the whole model (``scope: global``,
the default), per tensor (``scope: tensor``) or per group of tensors (``layer``, ``module``, ``pattern``:
the group's summed histogram, see ``groups.py``).

``shared: elect`` (RAM, RAM+; default ``mean``, the paper's) replaces the shared-region mean by TIES's
election over the active agents: ``s = sgn(sum_{i: m_i} tau_i)``, ``tau* = mean of the active tau_i with
sgn(tau_i) = s`` (0 when ``s = 0``), the primitive ``deltas.disjoint_merge`` with unit weights.

``ram_fisher``: RAM's regions (m_i under the tensor's mask rule), with ``F_i = max(fisher_i, floor)``::

    tau*[p] = sum_{i: m_i} F_i tau_i / sum_{i: m_i} F_i          c >= 2
            = lambda_i * tau_i[p]                                c = 1
    lambda_i = 1 + r * clip(rho_i, 0, alpha),  rho_i = sum_{S_i} F_i / sum_{U_i} F_i   (r = 0: lambda_i = 1)

with the Fisher masses summed over every merged tensor by ram_fisher's statistics pass (``fisher_masses`` of
every chunk, a ``hooks.ModelSum``), run only when some tensor rescales (``fisher_rescales``: r > 0).

``unique_only`` is the paper's dilution ablation: ``s * tau_a`` on the elements only agent ``a`` updated, zero
elsewhere. The baselines (linear and task arithmetic: ``methods.arithmetic``; TIES, DARE, Breadcrumbs, DELLA,
RAM-TIES: ``methods.ties``; Model Stock, SLERP, Fisher) live in their own packages; ``registry.py`` lists every
method.
"""

from __future__ import annotations

import math

import torch

from agentmerge.methods.deltas import disjoint_merge, overlap_count, rho_from_histogram, safe_divide, sum_agents
from agentmerge.methods.groups import group_of
from agentmerge.methods.masks import chunk_mask
from agentmerge.methods.ram import (
    RamFisherParams,
    RamParams,
    RamPlusParams,
    UniqueOnlyParams,
)
from agentmerge.methods.spec import Chunk, ChunkSpec, Params


def ram_lambdas(hist: torch.Tensor, params: Params) -> torch.Tensor:
    """``[N, N]`` overlap histogram -> ``[N]`` float32 unique-region scales lambda_i of RAM+ (``unique_scale``)."""
    p = RamPlusParams.of(params)
    return torch.tensor([p.unique_scale(rho) for rho in rho_from_histogram(hist)], dtype=torch.float64).float()


def ram_regions(
    tau: torch.Tensor, mask: torch.Tensor, lam: torch.Tensor | None = None, shared: str = "mean"
) -> torch.Tensor:
    """``[N, E]`` task vectors and update mask (any mask rule, ``masks.chunk_mask``) -> ``[E]``: the mean over
    active agents where shared (``shared="elect"``: TIES's sign election over them, ``deltas.disjoint_merge``
    with unit weights), ``lambda_i * tau_i`` where unique, 0 where untouched."""
    count = overlap_count(mask)
    active = torch.where(mask, tau, 0.0)
    mean = sum_agents(active) / count.clamp(min=1)
    if shared == "elect":
        mean = torch.where(count >= 2, disjoint_merge(active, torch.ones(tau.shape[0])), mean)
    if lam is None:
        return mean  # c = 1: the mean is the lone agent's delta; c = 0: zero
    scaled = sum_agents(active * lam[:, None])
    return torch.where(count == 1, scaled, mean)


def ram(c: Chunk) -> torch.Tensor:
    p = RamParams.of(c.params)  # ``scale`` 1 (the paper) leaves the merged delta bit for bit
    return ram_regions(c.tau, chunk_mask(c), shared=p.shared) * p.scale


def scope_group(name: str, params: Params) -> str | None:
    """RAM+'s statistics pass: the group tensor ``name``'s histogram is summed into (None: scope global / tensor)."""
    p = RamPlusParams.of(params)
    return group_of(name, p) if p.grouped else None


def scope_histogram(spec: ChunkSpec) -> torch.Tensor | None:
    """The ``[N, N]`` histogram RAM+ takes rho from: the tensor's, its group's (``groups.group_of``) or the model's."""
    p = RamPlusParams.of(spec.params)
    if p.scope == "tensor":
        return spec.stats.tensor_hist
    return spec.stats.group_hist if p.grouped else spec.stats.model_hist


def ram_plus_lambdas(spec: ChunkSpec) -> torch.Tensor:
    """``[N]`` RAM+ scales of a chunk, from the histogram of its ``scope`` (model, tensor or group)."""
    p = RamPlusParams.of(spec.params)
    hist = scope_histogram(spec)
    if hist is None:
        raise RuntimeError(f"ram_plus: {spec.name}: no overlap statistics for scope {p.scope!r}")
    return ram_lambdas(hist, p)


def ram_plus(c: Chunk) -> torch.Tensor:
    p = RamPlusParams.of(c.params)
    return ram_regions(c.tau, chunk_mask(c), ram_plus_lambdas(c), p.shared) * p.scale


# --------------------------------------------------------------------------- RAM with Fisher weights


def fisher_values(c: Chunk) -> torch.Tensor:
    """``[N, E]`` float32 ``F_i = max(fisher_i, floor)`` of a chunk."""
    f = c.extras.get("fisher")
    if f is None:
        raise RuntimeError(f"{c.name}: the driver did not provide the models' Fisher tensors")
    return f.float().clamp(min=RamFisherParams.of(c.params).floor)


def fisher_mass(mask: torch.Tensor, fisher: torch.Tensor) -> torch.Tensor:
    """``[N, E]`` update mask (the tensor's rule), floored Fisher -> ``[N, 2]`` float64 Fisher mass (unique, shared)."""
    count = overlap_count(mask)
    f = torch.where(mask, fisher, 0.0).double()
    return torch.stack([(f * (count == 1)).sum(1), (f * (count >= 2)).sum(1)], dim=1)


def fisher_masses(c: Chunk) -> torch.Tensor:
    """ram_fisher's statistics pass over one chunk: ``[N, 2]`` float64 Fisher mass of each agent (unique, shared),
    counted under the tensor's mask rule as the merge counts it."""
    return fisher_mass(chunk_mask(c), fisher_values(c))


def fisher_rescales(params: Params) -> bool:
    """Whether a tensor's unique updates are rescaled by Fisher mass (``r > 0``): the pass then runs."""
    return RamFisherParams.of(params).r > 0


def fisher_rho(mass: torch.Tensor) -> list[float]:
    """``[N, 2]`` Fisher masses (unique, shared) -> per agent rho_i = shared / unique (``inf``: no unique mass)."""
    return [s / u if u else math.inf for u, s in mass.tolist()]


def fisher_lambdas(spec: ChunkSpec) -> torch.Tensor | None:
    """``[N]`` float32 ``1 + r clip(rho_i, 0, alpha)``, rho_i = shared / unique Fisher mass; None when r = 0."""
    p = RamFisherParams.of(spec.params)
    if p.r == 0.0:
        return None
    mass = spec.stats.model_stat
    if mass is None:
        raise RuntimeError(f"ram_fisher: {spec.name}: no Fisher masses; the driver did not run the statistics pass")
    return torch.tensor([p.unique_scale(x) for x in fisher_rho(mass)], dtype=torch.float64).float()


def ram_fisher(c: Chunk) -> torch.Tensor:
    """RAM with a Fisher-weighted mean on the shared region: ``sum_i m_i F_i tau_i / sum_i m_i F_i``."""
    mask = chunk_mask(c)
    count = overlap_count(mask)
    active = torch.where(mask, c.tau, 0.0)
    f = torch.where(mask, fisher_values(c), 0.0)
    shared = safe_divide(sum_agents(f * active), sum_agents(f))
    lam = fisher_lambdas(c)
    unique = sum_agents(active if lam is None else active * lam[:, None])
    return torch.where(count >= 2, shared, unique)


def unique_only(c: Chunk) -> torch.Tensor:
    """Dilution ablation: ``scale * tau_a`` where only agent ``a`` updated the element."""
    p = UniqueOnlyParams.of(c.params)
    a = p.agent  # below N: the config checks it
    mask = chunk_mask(c)
    keep = mask[a] & (overlap_count(mask) == 1)
    return torch.where(keep, c.tau[a] * p.scale, 0.0)


# --------------------------------------------------------------------------- simple baselines
