"""Diagonal Fisher merging (arXiv 2111.09832). Record and entry (no torch); kernel in ``kernels.py``."""

from __future__ import annotations

from dataclasses import dataclass

from agentmerge.methods.hooks import Needs
from agentmerge.methods.method import Method
from agentmerge.methods.params import FLOOR, MethodParams, use
from agentmerge.methods.spec import Lazy


@dataclass(frozen=True, eq=False)
class FisherParams(MethodParams):
    floor: float = use(FLOOR)


# --------------------------------------------------------------------------- the entries

FISHER = Method(
    "fisher",
    "diagonal Fisher merging: sum_i w_i F_i theta_i / sum_i w_i F_i",
    Lazy("agentmerge.methods.fisher.kernels:fisher"),
    FisherParams,
    Needs(weights=True, base=False, extras=("fisher",)),
    paper="2111.09832",
)
