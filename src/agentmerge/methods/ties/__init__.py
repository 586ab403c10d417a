"""The TIES family: TIES, DARE (linear and TIES), Model Breadcrumbs, DELLA, and the RAM authors' RAM-TIES.

They share named steps (``kernels.py``: trim by magnitude, drop with rescale, elect signs, disjoint mean) and one
compiled loop (``compiled.py``, ``loops.py``). Records, mergekit names and entries here (no torch).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from agentmerge.methods.hooks import Needs, TensorPrepare
from agentmerge.methods.mergekit_map import MethodMap
from agentmerge.methods.method import Method
from agentmerge.methods.params import MethodParams, Param, use
from agentmerge.methods.spec import Lazy, MaskedParams

SCALE = Param("scale", 1.0, "multiplies the merged task vector (was lambda, still accepted)", aliases=("lambda",))


DENSITY = Param(
    "density", 0.2, "fraction of each agent's entries kept per tensor, by magnitude", 0.0, 1.0, per_model=True
)


DROP = Param(
    "p", 0.5, "drop probability of each task-vector element (survivors scaled by 1/(1-p))", 0.0, 1.0, per_model=True
)


@dataclass(frozen=True, eq=False)
class RamTiesParams(MaskedParams):
    keep: float = use(
        Param("keep", 0.1, "fraction of the shared region each agent keeps, by magnitude", 0.0, 1.0, per_model=True)
    )


@dataclass(frozen=True, eq=False)
class TiesParams(MethodParams):
    output_scale: ClassVar[str | None] = "scale"
    density: float = use(DENSITY)
    scale: float = use(SCALE)


@dataclass(frozen=True, eq=False)
class DropParams(MethodParams):
    """DARE's drop probability (the base of both DARE records)."""

    p: float = use(DROP)

    def check(self, n_models: int) -> None:
        if self.p >= 1.0:
            raise ValueError(f"parameter 'p' = {self.p} must be below 1 (1 drops everything)")


@dataclass(frozen=True, eq=False)
class DareLinearParams(DropParams):
    output_scale: ClassVar[str | None] = "scale"
    scale: float = use(
        replace(SCALE, tune="scale = 1 adds every rescaled task vector whole; try 1/N to 0.5 or a sweep")
    )


@dataclass(frozen=True, eq=False)
class DareTiesParams(DropParams):
    output_scale: ClassVar[str | None] = "scale"
    density: float = use(Param("density", 1.0, "TIES trim after the drop (1: none)", 0.0, 1.0, per_model=True))
    scale: float = use(SCALE)


@dataclass(frozen=True, eq=False)
class BreadcrumbsParams(MethodParams):
    output_scale: ClassVar[str | None] = "scale"
    density: float = use(
        Param("density", 0.9, "fraction of each agent's entries kept per tensor", 0.0, 1.0, per_model=True)
    )
    gamma: float = use(Param("gamma", 0.01, "fraction of largest-magnitude entries dropped", 0.0, 1.0, per_model=True))
    scale: float = use(replace(SCALE, tune="scale = 1 adds every pruned task vector whole; try 1/N to 0.5 or a sweep"))

    def check(self, n_models: int) -> None:
        if self.density + self.gamma > 1.0:
            raise ValueError("breadcrumbs: density + gamma must not exceed 1")


@dataclass(frozen=True, eq=False)
class DellaParams(MethodParams):
    output_scale: ClassVar[str | None] = "scale"
    p: float = use(Param("p", 0.5, "mean drop probability", 0.0, 1.0, per_model=True))
    eps: float = use(
        Param(
            "eps",
            0.1,
            "spread of drop probabilities: p - eps/2 (largest) .. p + eps/2 (smallest)",
            0.0,
            1.0,
            per_model=True,
        )
    )
    scale: float = use(SCALE)

    def check(self, n_models: int) -> None:
        p, eps = self.p, self.eps
        if p - eps / 2 < 0 or p + eps / 2 >= 1:
            raise ValueError(
                f"della: drop probabilities p +- eps/2 = [{p - eps / 2}, {p + eps / 2}] must lie in [0, 1)"
            )


# mergekit's names for these methods (``agentmerge.config.mergekit_names`` collects them)
_KEEP_TO_DROP = {"density": ("p", 1.0, -1.0)}  # mergekit keeps a fraction; ours drops one
_LAMBDA = {"lambda": ("scale", 0.0, 1.0)}  # mergekit's lambda is our scale
# mergekit 0.1.5's defaults (generalized_task_arithmetic.py): density 1.0 (no trim, no drop) for every
# sparsifying method, lambda 1.0, breadcrumbs' gamma 0.01, della's epsilon 0.15.
_GTA = {"density": 1.0}  # lambda: mergekit 1.0, the same as ours (not filled in)
MERGEKIT_TIES = MethodMap(
    "ties", "ties", defaults=_GTA, normalize=True, ours_normalize=True, rescale=False, convert=_LAMBDA
)
MERGEKIT_DARE_TIES = MethodMap(  # mergekit's density is DARE's kept fraction; it has no TIES trim (ours: density)
    "dare_ties",
    "dare_ties",
    defaults=_GTA,
    normalize=False,
    ours_normalize=True,
    rescale=True,
    convert={**_KEEP_TO_DROP, **_LAMBDA},
    ours_only=("density",),
)
MERGEKIT_DARE_LINEAR = MethodMap(
    "dare_linear",
    "dare_linear",
    defaults=_GTA,
    normalize=False,
    ours_normalize=False,
    rescale=True,
    convert={**_KEEP_TO_DROP, **_LAMBDA},
)
MERGEKIT_BREADCRUMBS = MethodMap(
    "breadcrumbs",
    "breadcrumbs",
    defaults={**_GTA, "gamma": 0.01},
    normalize=False,
    ours_normalize=False,
    rescale=False,
    convert=_LAMBDA,
)
MERGEKIT_DELLA = MethodMap(
    "della",
    "della",
    defaults={**_GTA, "epsilon": 0.15},
    normalize=True,
    ours_normalize=True,
    rescale=True,
    convert={**_KEEP_TO_DROP, **_LAMBDA, "epsilon": ("eps", 0.0, 2.0)},  # mergekit: half-width; ours: full spread
)

# --------------------------------------------------------------------------- the entries

TIES = Method(
    "ties",
    "TIES: trim to top-density magnitudes, elect signs by mass, disjoint mean",
    Lazy("agentmerge.methods.ties.kernels:ties"),
    TiesParams,
    Needs(weights=True),
    passes=(TensorPrepare(Lazy("agentmerge.methods.ties.kernels:ties_prepare")),),
    compiled_at=Lazy("agentmerge.methods.ties.compiled:TIES"),
    paper="2306.01708",
    mergekit=(MERGEKIT_TIES,),
)

DARE_LINEAR = Method(
    "dare_linear",
    "DARE + task arithmetic: random drop with rescale, then scale * weighted sum",
    Lazy("agentmerge.methods.ties.kernels:dare_linear"),
    DareLinearParams,
    Needs(weights=True),
    compiled_at=Lazy("agentmerge.methods.ties.compiled:DARE_LINEAR"),
    paper="2311.03099",
    mergekit=(MERGEKIT_DARE_LINEAR,),
)

DARE_TIES = Method(
    "dare_ties",
    "DARE + TIES: random drop with rescale, then (optional trim,) sign election and disjoint mean",
    Lazy("agentmerge.methods.ties.kernels:dare_ties"),
    DareTiesParams,
    Needs(weights=True),
    passes=(TensorPrepare(Lazy("agentmerge.methods.ties.kernels:dare_ties_prepare")),),
    compiled_at=Lazy("agentmerge.methods.ties.compiled:DARE_TIES"),
    paper="2311.03099",
    mergekit=(MERGEKIT_DARE_TIES,),
)

BREADCRUMBS = Method(
    "breadcrumbs",
    "Model Breadcrumbs: drop the largest gamma and smallest magnitudes, keep density; task arithmetic",
    Lazy("agentmerge.methods.ties.kernels:breadcrumbs"),
    BreadcrumbsParams,
    Needs(weights=True),
    passes=(TensorPrepare(Lazy("agentmerge.methods.ties.kernels:breadcrumbs_prepare")),),
    compiled_at=Lazy("agentmerge.methods.ties.compiled:BREADCRUMBS"),
    paper="2312.06795",
    mergekit=(MERGEKIT_BREADCRUMBS,),
)

DELLA = Method(
    "della",
    "DELLA: magnitude-ranked random drop per row with rescale, sign election, disjoint mean",
    Lazy("agentmerge.methods.ties.kernels:della"),
    DellaParams,
    Needs(weights=True, chunk_multiple=Lazy("agentmerge.methods.ties.kernels:row_length")),
    paper="2406.11617",
    mergekit=(MERGEKIT_DELLA,),
)

RAM_TIES = Method(
    "ram_ties",
    "RAM authors' arm-ties: unique updates kept whole, TIES (keep fraction) on the shared region",
    Lazy("agentmerge.methods.ties.kernels:ram_ties"),
    RamTiesParams,
    passes=(TensorPrepare(Lazy("agentmerge.methods.ties.kernels:ram_ties_prepare")),),
    compiled_at=Lazy("agentmerge.methods.ties.compiled:RAM_TIES"),
)
