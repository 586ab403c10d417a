"""The spherical methods of mergekit: Karcher mean, Multi-SLERP, NuSLERP.

Records, mergekit names and entries (no torch); kernels in ``kernels.py`` (written on the N x N Gram matrix),
compiled forms in ``compiled.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentmerge.methods.hooks import STAT_BLOCKS, Needs, TensorPrepare
from agentmerge.methods.mergekit_map import MethodMap
from agentmerge.methods.method import Method
from agentmerge.methods.params import MethodParams, Param, use
from agentmerge.methods.spec import Lazy


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


# mergekit's names for these methods (``agentmerge.config.mergekit_names`` collects them)
MERGEKIT_KARCHER = MethodMap("karcher", "karcher", uses_base=False, base_joins=True)  # max_iter 10, tol 1e-5 as ours
MERGEKIT_MULTISLERP = MethodMap("multislerp", "multislerp", weights_required=True)  # normalize_weights, eps as ours
MERGEKIT_NUSLERP = MethodMap("nuslerp", "nuslerp", weights_required=True)  # flatten true, row_wise false as ours

# --------------------------------------------------------------------------- the entries

KARCHER = Method(
    "karcher",
    "Karcher mean (mergekit): Riemannian mean of the models' weight directions, times their mean norm",
    Lazy("agentmerge.methods.spherical.kernels:karcher"),
    KarcherParams,
    Needs(base=False, chunk_multiple=STAT_BLOCKS),
    passes=(TensorPrepare(Lazy("agentmerge.methods.spherical.kernels:karcher_prepare")),),
    compiled_at=Lazy("agentmerge.methods.spherical.compiled:KARCHER"),
    mergekit=(MERGEKIT_KARCHER,),
)

MULTISLERP = Method(
    "multislerp",
    "Multi-SLERP (mergekit): weighted spherical interpolation of task vectors (with a base) or weights",
    Lazy("agentmerge.methods.spherical.kernels:multislerp"),
    MultiSlerpParams,
    Needs(base=False, weights=True, chunk_multiple=STAT_BLOCKS),
    passes=(TensorPrepare(Lazy("agentmerge.methods.spherical.kernels:multislerp_prepare")),),
    compiled_at=Lazy("agentmerge.methods.spherical.compiled:MULTISLERP"),
    mergekit=(MERGEKIT_MULTISLERP,),
)

NUSLERP = Method(
    "nuslerp",
    "NuSLERP (mergekit): SLERP of two task vectors (with a base) or models, t = w_1 / (w_0 + w_1)",
    Lazy("agentmerge.methods.spherical.kernels:nuslerp"),
    NuSlerpParams,
    Needs(
        base=False,
        weights=True,
        models=(2, 2),
        chunk_multiple=Lazy("agentmerge.methods.spherical.kernels:nuslerp_unit"),
    ),
    passes=(TensorPrepare(Lazy("agentmerge.methods.spherical.kernels:nuslerp_prepare")),),
    compiled_at=Lazy("agentmerge.methods.spherical.compiled:NUSLERP"),
    mergekit=(MERGEKIT_NUSLERP,),
)
