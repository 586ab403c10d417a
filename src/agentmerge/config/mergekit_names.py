"""mergekit's method names mapped onto ours: which of our methods, with which fixed parameters and defaults.

``MERGEKIT`` is read by the mergekit config reader (``mergekit``) and writer (``mergekit_export``); it is
about configs, not kernels, so it lives here and not in the method table (``methods.registry``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from agentmerge.methods.spec import MASK_PARAMS

Scalar = bool | int | float | str


@dataclass(frozen=True)
class MethodMap:
    """How one mergekit method maps onto ours.

    ``target``: our method name. ``fixed``: parameters implied by the mergekit method itself.
    ``defaults``: mergekit's defaults (its names and values, as in mergekit 0.1.5), applied when the config
    leaves a parameter out, each with a note, so a config means what it means in mergekit.
    ``normalize`` / ``rescale``: mergekit's defaults for those flags (None: it has no such flag);
    ``ours_normalize``: what our method computes (weighted mean: True, weighted sum: False).
    ``convert``: mergekit name -> (our name, a, b), our value = a + b * mergekit's value.
    ``endpoints``: the base model becomes the first of two models (SLERP: t = 0 gives the base).
    ``ours_only``: our parameters the mergekit method does not have; what mergekit computes is our default,
    so a config exports to mergekit only with them at their defaults.
    """

    target: str
    fixed: Mapping[str, Scalar] = field(default_factory=dict)
    defaults: Mapping[str, Scalar] = field(default_factory=dict)
    normalize: bool | None = None
    ours_normalize: bool | None = None
    rescale: bool | None = None
    convert: Mapping[str, tuple[str, float, float]] = field(default_factory=dict)
    endpoints: bool = False
    uses_base: bool = True  # False: mergekit ignores base_model (an entry of models that is the base is averaged)
    ours_only: tuple[str, ...] = ()
    base_joins: bool = False  # mergekit's planner adds base_model as one more input model (karcher)
    weights_required: bool = False  # mergekit requires every model's ``weight`` (written even when 1)


# mergekit's RAM masks by |tau| > epsilon and averages the shared region: our mask rules and `shared` at their defaults
_RAM_ONLY = (*(p.name for p in MASK_PARAMS), "shared", "scale")
_KEEP_TO_DROP = {"density": ("p", 1.0, -1.0)}  # mergekit keeps a fraction; ours drops one
# mergekit 0.1.5's defaults (generalized_task_arithmetic.py): density 1.0 (no trim, no drop) for every
# sparsifying method, lambda 1.0, breadcrumbs' gamma 0.01, della's epsilon 0.15.
_GTA = {"density": 1.0}  # lambda: mergekit 1.0, the same as ours (not filled in)

MERGEKIT: Mapping[str, MethodMap] = MappingProxyType(
    {
        "ram": MethodMap("ram", ours_only=_RAM_ONLY),
        "ramplus_tl": MethodMap(
            "ram_plus",
            fixed={"scope": "tensor"},
            defaults={"alpha": 0.2},
            ours_only=("form", "rescale_factor", "groups", *_RAM_ONLY),
        ),
        "linear": MethodMap("linear", normalize=True, ours_normalize=True, uses_base=False),
        "task_arithmetic": MethodMap("task_arithmetic", normalize=False, ours_normalize=False, rescale=False),
        "ties": MethodMap("ties", defaults=_GTA, normalize=True, ours_normalize=True, rescale=False),
        "dare_ties": MethodMap(  # mergekit's density is DARE's kept fraction; it has no TIES trim (ours: density)
            "dare_ties",
            defaults=_GTA,
            normalize=False,
            ours_normalize=True,
            rescale=True,
            convert=_KEEP_TO_DROP,
            ours_only=("density",),
        ),
        "dare_linear": MethodMap(
            "dare_linear", defaults=_GTA, normalize=False, ours_normalize=False, rescale=True, convert=_KEEP_TO_DROP
        ),
        "breadcrumbs": MethodMap(
            "breadcrumbs", defaults={**_GTA, "gamma": 0.01}, normalize=False, ours_normalize=False, rescale=False
        ),
        "breadcrumbs_ties": MethodMap("breadcrumbs_ties", normalize=False, rescale=False),
        "della": MethodMap(
            "della",
            defaults={**_GTA, "epsilon": 0.15},
            normalize=True,
            ours_normalize=True,
            rescale=True,
            convert={**_KEEP_TO_DROP, "epsilon": ("eps", 0.0, 2.0)},  # mergekit: half-width; ours: full spread
        ),
        "della_linear": MethodMap("della_linear", normalize=False, rescale=True),
        "model_stock": MethodMap("model_stock"),
        "slerp": MethodMap("slerp", endpoints=True, ours_only=("colinear",)),  # mergekit's threshold: 0.9995
        "sce": MethodMap("sce"),  # mergekit's default select_topk 1.0 is ours
        "karcher": MethodMap("karcher", uses_base=False, base_joins=True),  # max_iter 10, tol 1e-5 as ours
        "multislerp": MethodMap("multislerp", weights_required=True),  # normalize_weights true, eps 1e-8 as ours
        "nuslerp": MethodMap("nuslerp", weights_required=True),  # nuslerp_flatten true, nuslerp_row_wise false
    }
)

# mergekit methods we know of but have no counterpart for (a clearer message than "unknown").
MERGEKIT_WITHOUT_COUNTERPART = ("nearswap", "arcee_fusion", "passthrough")
