"""The parameter records of the SVD methods: TSV-M, Iso-C, Iso-CTS, CART, ResMerge (no torch).

Defaults are the references' (``../shared/field-methods.md``). Every record also has the post-steps' fields of
``params.MethodParams``: ``svd_embeddings`` there says whether TSV-M, Iso-C and Iso-CTS decompose the
embeddings and LM head (and whether SVC calibrates them), and ``svc_alpha`` defaults per method as
fusion_bench's SVC configs do (1.0 after TSV-M, 0.2 after Iso-CTS, 0.1 after any other method). The output
scale (``MethodParams.output_scale``) of TSV-M, Iso-C and Iso-CTS is ``alpha``; CART's ``prior`` scales only
the low-rank part and ResMerge has none.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from agentmerge.methods.params import SVC_ALPHA, MethodParams, Param, use

SVD_ALPHA = Param(
    "alpha",
    1.0,
    "scales the merged delta (1-D means included): theta_0 + alpha * delta; the authors tune it on validation "
    "data over (0, 3], fusion_bench uses 1",
)


@dataclass(frozen=True, eq=False)
class IsoCParams(MethodParams):
    output_scale: ClassVar[str | None] = "alpha"
    alpha: float = use(SVD_ALPHA)


@dataclass(frozen=True, eq=False)
class TsvParams(MethodParams):
    output_scale: ClassVar[str | None] = "alpha"
    svc_alpha: float = use(replace(SVC_ALPHA, default=1.0))
    alpha: float = use(SVD_ALPHA)


@dataclass(frozen=True, eq=False)
class IsoCtsParams(MethodParams):
    output_scale: ClassVar[str | None] = "alpha"
    svc_alpha: float = use(replace(SVC_ALPHA, default=0.2))
    alpha: float = use(SVD_ALPHA)
    common_space_fraction: float = use(
        Param("common_space_fraction", 0.8, "share of the k directions taken from the sum (common space)", 0, 1)
    )


@dataclass(frozen=True, eq=False)
class CartParams(MethodParams):
    prior: float = use(Param("prior", 2.0, "lambda: theta_avg + prior * sum_i lowrank(theta_i - theta_avg)", low=0.0))
    rank_ratio: float = use(
        Param("rank_ratio", 0.12, "rank kept per deviation: max(1, int(rank_ratio * min(m, n)))", 0.0, 1.0)
    )


@dataclass(frozen=True, eq=False)
class ResMergeParams(MethodParams):
    rank_topk: int = use(Param("rank_topk", 1, "singular components of each task vector that form its head", low=0))
    beta_min: float = use(
        Param("beta_min", 0.7, "exponent of the coherence at the highest residual agreement score", low=0.0)
    )
    beta_max: float = use(Param("beta_max", 1.0, "exponent of the coherence at score 0", low=0.0))
    head_ratio_budget: float = use(
        Param("head_ratio_budget", 0.2, "rho: size of the head correction relative to the backbone", low=0.0)
    )
