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
the default) or per tensor (``scope: tensor``).

Baselines: linear ``sum_i w_i tau_i / sum_i w_i`` (= weighted average of the models) and task
arithmetic ``lambda * sum_i w_i tau_i``. ``unique_only`` is the paper's dilution ablation:
``s * tau_a`` on the elements only agent ``a`` updated, zero elsewhere. The other baselines (TIES, DARE,
Breadcrumbs, DELLA, Model Stock, SLERP, RAM-TIES, Fisher) live in ``baselines.py``; ``registry.py`` lists
every method with its parameters and its compiled form.
"""

from __future__ import annotations

import torch

from agentmerge.deltas import overlap_count, rho_from_histogram, sum_agents, update_mask
from agentmerge.masks import chunk_mask
from agentmerge.spec import Chunk, ChunkSpec, Params


def ram_lambda(rho: float, params: Params) -> float:
    """RAM+'s unique-region scale of one agent from its overlap-unique ratio ``rho`` (``inf``: no unique element).

    Paper form ``1 + r * clip(rho, 0, alpha)``; the authors' form ``1 + (R - 1) * min(rho, 1)``.
    """
    if params.get("form", "paper") == "authors":
        return 1.0 + (float(params["rescale_factor"]) - 1.0) * min(max(rho, 0.0), 1.0)
    return 1.0 + float(params["r"]) * min(max(rho, 0.0), float(params["alpha"]))


def ram_lambdas(hist: torch.Tensor, params: Params) -> torch.Tensor:
    """``[N, N]`` overlap histogram -> ``[N]`` float32 unique-region scales lambda_i (``ram_lambda`` per agent)."""
    return torch.tensor([ram_lambda(rho, params) for rho in rho_from_histogram(hist)], dtype=torch.float64).float()


def ram_combine(tau: torch.Tensor, eps: float, lam: torch.Tensor | None = None) -> torch.Tensor:
    """``[N, E]`` -> ``[E]``: mean over active agents where shared, ``lambda_i * tau_i`` where unique, 0 else."""
    return ram_regions(tau, update_mask(tau, eps), lam)


def ram_regions(tau: torch.Tensor, mask: torch.Tensor, lam: torch.Tensor | None = None) -> torch.Tensor:
    """``ram_combine`` given the ``[N, E]`` update mask."""
    count = overlap_count(mask)
    active = torch.where(mask, tau, 0.0)
    mean = sum_agents(active) / count.clamp(min=1)
    if lam is None:
        return mean  # c = 1: the mean is the lone agent's delta; c = 0: zero
    scaled = sum_agents(active * lam[:, None])
    return torch.where(count == 1, scaled, mean)


def ram(c: Chunk) -> torch.Tensor:
    return ram_regions(c.tau, chunk_mask(c))


def ram_plus_lambdas(spec: ChunkSpec) -> torch.Tensor:
    """``[N]`` RAM+ scales of a chunk: from its tensor's histogram (``scope: tensor``) or the whole model's."""
    hist = spec.stats.tensor_hist if spec.params["scope"] == "tensor" else spec.stats.model_hist
    if hist is None:
        raise RuntimeError("ram_plus needs overlap statistics; the driver did not provide them")
    return ram_lambdas(hist, spec.params)


def ram_plus(c: Chunk) -> torch.Tensor:
    return ram_regions(c.tau, chunk_mask(c), ram_plus_lambdas(c))


def unique_only(c: Chunk) -> torch.Tensor:
    """Dilution ablation: ``scale * tau_a`` where only agent ``a`` updated the element."""
    a = int(c.params["agent"])  # below N: the config checks it
    mask = chunk_mask(c)
    keep = mask[a] & (overlap_count(mask) == 1)
    return torch.where(keep, c.tau[a] * float(c.params["scale"]), 0.0)


# --------------------------------------------------------------------------- simple baselines


def weighted_sum(tau: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``[N, E]``, ``[N]`` -> ``[E]``: sum_i w_i tau_i."""
    return sum_agents(tau * weights[:, None])


def linear(c: Chunk) -> torch.Tensor:
    return weighted_sum(c.tau, c.weights) / c.weights.sum()


def task_arithmetic(c: Chunk) -> torch.Tensor:
    return float(c.params["lambda"]) * weighted_sum(c.tau, c.weights)
