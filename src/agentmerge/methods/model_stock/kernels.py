"""Reference kernel of Model Stock (arXiv 2403.19522).

``cos`` = mean over pairs i < j of cos(tau_i, tau_j) over the whole tensor (a pair with a zero vector counts 0;
negative means clamp to 0), ``t = N cos / (1 + (N - 1) cos)`` (t = 1 for one
model), ``tau* = t * mean_i tau_i`` i.e. ``theta = t * mean_i theta_i + (1 - t) * theta_0``.
"""

from __future__ import annotations

import torch

from agentmerge.methods.deltas import sum_agents
from agentmerge.methods.spec import Chunk
from agentmerge.methods.stats import gram_prepare, tensor_gram


def _raw_tau(c: Chunk) -> torch.Tensor:
    return c.tau


def model_stock_ratio(g: torch.Tensor) -> float:
    """``[N, N]`` Gram of task vectors -> Model Stock's interpolation ratio t."""
    n = g.shape[0]
    if n == 1:
        return 1.0
    norms = g.diagonal().sqrt()
    cos = [
        float(g[i, j] / (norms[i] * norms[j])) if norms[i] > 0 and norms[j] > 0 else 0.0
        for i in range(n)
        for j in range(i + 1, n)
    ]
    mean = max(0.0, sum(cos) / len(cos))
    return n * mean / (1.0 + (n - 1) * mean)


def model_stock(c: Chunk) -> torch.Tensor:
    t = model_stock_ratio(tensor_gram(c, _raw_tau))
    return t * (sum_agents(c.tau) / c.tau.shape[0])


model_stock_prepare = gram_prepare(_raw_tau)
