"""Reference kernels of linear merging (weighted mean of the models) and task arithmetic (arXiv 2212.04089):

linear:           delta = sum_i w_i tau_i / sum_i w_i
task arithmetic:  delta = scale * sum_i w_i tau_i
"""

from __future__ import annotations

import torch

from agentmerge.methods.arithmetic import TaskArithmeticParams
from agentmerge.methods.deltas import sum_agents
from agentmerge.methods.spec import Chunk


def weighted_sum(tau: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``[N, E]``, ``[N]`` -> ``[E]``: sum_i w_i tau_i."""
    return sum_agents(tau * weights[:, None])


def linear(c: Chunk) -> torch.Tensor:
    return weighted_sum(c.tau, c.weights) / c.weights.sum()


def task_arithmetic(c: Chunk) -> torch.Tensor:
    return TaskArithmeticParams.of(c.params).scale * weighted_sum(c.tau, c.weights)
