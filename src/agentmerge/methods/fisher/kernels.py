"""Reference kernel of diagonal Fisher merging (arXiv 2111.09832):

    tau* = sum_i w_i F_i tau_i / sum_i w_i F_i,   F_i = max(fisher_i, floor)

(so an all-zero Fisher gives the weighted average), i.e. ``theta = sum_i w_i F_i theta_i / sum_i w_i F_i``.
"""

from __future__ import annotations

import torch

from agentmerge.methods.deltas import sum_agents
from agentmerge.methods.fisher import FisherParams
from agentmerge.methods.spec import Chunk


def fisher(c: Chunk) -> torch.Tensor:
    f = c.extras.get("fisher")
    if f is None:
        raise RuntimeError("fisher: the driver did not provide the models' Fisher tensors")
    fw = f.float().clamp(min=FisherParams.of(c.params).floor) * c.weights[:, None]
    return sum_agents(fw * c.tau) / sum_agents(fw)
