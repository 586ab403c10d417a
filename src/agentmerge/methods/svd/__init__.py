"""The SVD methods: TSV-M, Iso-C, Iso-CTS, CART, ResMerge. Records and entries here (no torch); kernels in
``kernels.py`` and ``resmerge.py``, which tensors each decomposes in ``rules.py``.

Defaults are the references' (``../shared/field-methods.md``). Every record also has the post-steps' fields of
``params.MethodParams``: ``svd_embeddings`` there says whether TSV-M, Iso-C and Iso-CTS decompose the
embeddings and LM head (and whether SVC calibrates them), and ``svc_floor`` defaults per method as
fusion_bench's SVC configs do (1.0 after TSV-M, 0.2 after Iso-CTS, 0.1 after any other method). The output
scale (``MethodParams.output_scale``) of TSV-M, Iso-C and Iso-CTS is ``scale`` (the papers' ``alpha``, an alias);
CART's ``prior`` scales only the low-rank part (not an output scale) and ResMerge has none.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from agentmerge.methods.hooks import Needs
from agentmerge.methods.method import Method
from agentmerge.methods.params import SVC_FLOOR, MethodParams, Param, use
from agentmerge.methods.spec import Lazy
from agentmerge.methods.svd.rules import (
    CART_WHOLE,
    ISO_C_WHOLE,
    ISO_CTS_WHOLE,
    RESMERGE_WHOLE,
    TSV_WHOLE,
    cart_check,
    cts_check,
    resmerge_check,
)

SVD_SCALE = Param(
    "scale",
    1.0,
    "scales the merged delta (1-D means included): theta_0 + scale * delta; the papers' alpha (still accepted), "
    "the authors tune it on validation data over (0, 3], fusion_bench uses 1",
    aliases=("alpha",),
)


@dataclass(frozen=True, eq=False)
class IsoCParams(MethodParams):
    output_scale: ClassVar[str | None] = "scale"
    scale: float = use(SVD_SCALE)


@dataclass(frozen=True, eq=False)
class TsvParams(MethodParams):
    output_scale: ClassVar[str | None] = "scale"
    svc_floor: float = use(replace(SVC_FLOOR, default=1.0))
    scale: float = use(SVD_SCALE)


@dataclass(frozen=True, eq=False)
class IsoCtsParams(MethodParams):
    output_scale: ClassVar[str | None] = "scale"
    svc_floor: float = use(replace(SVC_FLOOR, default=0.2))
    scale: float = use(SVD_SCALE)
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


# --------------------------------------------------------------------------- the entries

TSV = Method(
    "tsv",
    "TSV-M: each task vector's top k/N singular triplets side by side, both factors orthogonalised (polar)",
    Lazy("agentmerge.methods.svd.kernels:tsv"),
    TsvParams,
    Needs(whole=TSV_WHOLE),
    paper="2412.00081",
)

ISO_C = Method(
    "iso_c",
    "Iso-C: the sum of the task vectors with all its singular values set to their mean",
    Lazy("agentmerge.methods.svd.kernels:iso_c"),
    IsoCParams,
    Needs(whole=ISO_C_WHOLE),
    paper="2502.04959",
)

ISO_CTS = Method(
    "iso_cts",
    "Iso-CTS: Iso-C over the sum's top directions and each task's own directions outside them",
    Lazy("agentmerge.methods.svd.kernels:iso_cts"),
    IsoCtsParams,
    Needs(whole=ISO_CTS_WHOLE, check_tensor=cts_check),
    paper="2502.04959",
)

CART = Method(
    "cart",
    "CART: the average plus prior times the sum of each model's low-rank deviation from the average",
    Lazy("agentmerge.methods.svd.kernels:cart"),
    CartParams,
    Needs(whole=CART_WHOLE, check_tensor=cart_check),
    paper="2412.12153",
)

RESMERGE = Method(
    "resmerge",
    "ResMerge: coherence-scaled backbone of the task vectors' SVD tails plus a gated head correction",
    Lazy("agentmerge.methods.svd.resmerge:resmerge"),
    ResMergeParams,
    Needs(whole=RESMERGE_WHOLE, check_tensor=resmerge_check),
    paper="2606.02252",
)
