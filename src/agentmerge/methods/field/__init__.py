"""The parameter records of the field's methods: MagMax, Consensus TA, SCE, Karcher, Multi-SLERP, NuSLERP.

Defaults are the references' (``../shared/field-methods.md``): MagMax's lambda 0.5 (the authors'), the
data-free placeholders of Consensus (k 2, TALL lambda 0.6, lambda 0.3), mergekit's for the rest. Pure Python:
no torch, so listing methods and checking configs stay fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from agentmerge.methods.params import MethodParams, Param, use


@dataclass(frozen=True, eq=False)
class MagMaxParams(MethodParams):
    output_scale: ClassVar[str | None] = "lambda"
    lam: float = use(
        Param(
            "lambda",
            0.5,
            "scaling coefficient of the selected task vector (the authors' 0.5)",
            tune="the selected updates are not averaged; tune lambda on validation data like task arithmetic's",
        )
    )


@dataclass(frozen=True, eq=False)
class ConsensusParams(MethodParams):
    output_scale: ClassVar[str | None] = "lambda"
    k: int = use(
        Param("k", 2, "an element is kept when at least k agents' TALL masks hold (0: task arithmetic)", low=0)
    )
    tall_lambda: float = use(
        Param(
            "tall_lambda",
            0.6,
            "TALL mask of agent t: |tau_t| > tall_lambda * |sum_i tau_i - tau_t| (the authors tune it per task)",
            low=0.0,
            per_model=True,
        )
    )
    lam: float = use(
        Param(
            "lambda",
            0.3,
            "scaling coefficient of the masked sum",
            tune="the authors choose it on validation data from 0.1 .. 1.0; 0.3 is a placeholder",
        )
    )


@dataclass(frozen=True, eq=False)
class SceParams(MethodParams):
    select_topk: float = use(
        Param(
            "select_topk",
            1.0,
            "fraction of the positions of nonzero variance kept, by variance (1: no selection)",
            0.0,
            1.0,
            reference_only=True,
        )
    )


@dataclass(frozen=True, eq=False)
class KarcherParams(MethodParams):
    max_iter: int = use(Param("max_iter", 10, "iterations of the Karcher mean at most", low=0, high=10_000))
    tol: float = use(
        Param("tol", 1e-5, "convergence tolerance (and the norm below which an input is left out)", low=0.0)
    )


@dataclass(frozen=True, eq=False)
class MultiSlerpParams(MethodParams):
    normalize_weights: bool = use(Param("normalize_weights", True, "divide the model weights by their sum"))
    eps: float = use(Param("eps", 1e-8, "stabiliser added to norms", low=0.0))


@dataclass(frozen=True, eq=False)
class NuSlerpParams(MethodParams):
    nuslerp_flatten: bool = use(
        Param(
            "nuslerp_flatten",
            True,
            "interpolate each tensor as one vector (false: per row or column)",
            reference_only=True,
        )
    )
    nuslerp_row_wise: bool = use(
        Param("nuslerp_row_wise", False, "without flatten: vectors along dimension 0 (columns), not rows")
    )
