"""Every merge method in one table: name, summary, parameters, what the driver must provide, compiled form.

``METHODS`` is the only registry: the config, the CLI (`agentmerge methods`), the driver and the
mergekit translation all read it. A method's reference kernel lives in ``methods.py`` (RAM family,
linear, task arithmetic) or ``baselines.py``; its compiled twin, when it has one, in ``fused/``. The
entries name them as ``Lazy`` references (``rm("ram")`` is ``agentmerge.methods.ram:ram``), imported on first
use: the table itself, and everything that only reads it (`agentmerge methods`, config checks), loads
without torch or numba.
``MERGEKIT`` below maps mergekit's method names onto these entries.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from agentmerge.methods.groups import GROUPED_SCOPES, check_patterns
from agentmerge.methods.spec import EPSILON, MASK_PARAMS, Lazy, Method, Param, Params, check_mask


def rm(name: str) -> Lazy:
    """A reference kernel (or hook) of ``methods.py``, imported on first use."""
    return Lazy(f"agentmerge.methods.ram:{name}")


def bl(name: str) -> Lazy:
    """A reference kernel (or hook) of ``baselines.py``, imported on first use."""
    return Lazy(f"agentmerge.methods.baselines:{name}")


def fk(name: str) -> Lazy:
    """A compiled form (``Compiled``) in ``fused/kernels.py`` (RAM family, linear, task arithmetic)."""
    return Lazy(f"agentmerge.methods.fused.kernels:{name}")


def ft(name: str) -> Lazy:
    """A compiled form (``Compiled``) of the TIES family in ``fused/ties.py``."""
    return Lazy(f"agentmerge.methods.fused.ties:{name}")


STAT_BLOCKS = Lazy("agentmerge.methods.stats:stat_blocks")
RAM_PAPER = "2601.13572"  # Reinforced Agent Merging (RAM, RAM+), the paper this project implements

# --------------------------------------------------------------------------- shared parameters

LAMBDA = Param("lambda", 1.0, "scaling coefficient of the merged task vector")
DENSITY = Param(
    "density", 0.2, "fraction of each agent's entries kept per tensor, by magnitude", 0.0, 1.0, per_model=True
)
DROP = Param(
    "p", 0.5, "drop probability of each task-vector element (survivors scaled by 1/(1-p))", 0.0, 1.0, per_model=True
)
SCALE = Param(
    "scale",
    1.0,
    "multiplies the merged task vector: theta_0 + scale * (RAM's merged delta); 1 is the paper (a beyond-paper "
    "knob, to be tuned on validation like task arithmetic's lambda)",
    low=0.0,
    reference_only=True,
)
SHARED = Param(
    "shared",
    "mean",
    "shared region (2+ agents): mean of the active agents (the paper), or elect: TIES sign election, "
    "mean of the active agents agreeing with the elected sign",
    choices=("mean", "elect"),
)
FLOOR = Param("floor", 1e-10, "lower bound of each Fisher value (all-zero Fisher -> plain average)", 0.0, low_open=True)
RAM_PLUS_PARAMS = (
    EPSILON,
    *MASK_PARAMS,
    SHARED,
    SCALE,
    Param(
        "form", "paper", "paper: 1 + r*clip(rho,0,alpha); authors: 1 + (R-1)*min(rho,1)", choices=("paper", "authors")
    ),
    Param("r", 0.1, "paper form: strength of the unique-region rescaling", low=0.0),
    Param("alpha", 2.0, "paper form: clip bound of rho", low=0.0),
    Param("rescale_factor", 1.2, "authors form: R (the released RAM+ uses 1.2)", low=1.0),
    Param(
        "scope",
        "global",
        "rho and lambda over the whole model (global), per tensor, per layer index, per module type, "
        "or per pattern of groups",
        choices=("global", "tensor", *GROUPED_SCOPES),
    ),
    Param(
        "groups",
        "",
        "scope pattern: whitespace-separated globs (re:REGEX for a regex), first match wins, the rest one group",
    ),
)

# --------------------------------------------------------------------------- cross-parameter checks


def check_ram_plus(params: Params) -> None:
    check_mask(params)
    pattern, groups = params["scope"] == "pattern", str(params["groups"]).strip()
    if pattern and not groups:
        raise ValueError("ram_plus: scope 'pattern' needs 'groups' (whitespace-separated globs or re:REGEX)")
    if groups and not pattern:
        raise ValueError(f"ram_plus: 'groups' is read only with scope 'pattern' (scope is {params['scope']!r})")
    check_patterns(groups)


def check_dare(params: Params) -> None:
    if float(params["p"]) >= 1.0:
        raise ValueError(f"parameter 'p' = {params['p']} must be below 1 (1 drops everything)")


def check_della(params: Params) -> None:
    p, eps = float(params["p"]), float(params["eps"])
    if p - eps / 2 < 0 or p + eps / 2 >= 1:
        raise ValueError(f"della: drop probabilities p +- eps/2 = [{p - eps / 2}, {p + eps / 2}] must lie in [0, 1)")


def check_crumbs(params: Params) -> None:
    if float(params["density"]) + float(params["gamma"]) > 1.0:
        raise ValueError("breadcrumbs: density + gamma must not exceed 1")


# --------------------------------------------------------------------------- the table

_ALL = (
    Method(
        "ram",
        "RAM: mean where 2+ agents updated, unique updates kept whole",
        rm("ram"),
        (EPSILON, *MASK_PARAMS, SHARED, SCALE),
        validate=check_mask,
        compiled_at=fk("RAM"),
        paper=RAM_PAPER,
    ),
    Method(
        "ram_plus",
        "RAM+: RAM with each agent's unique updates scaled up by its overlap-unique ratio",
        rm("ram_plus"),
        RAM_PLUS_PARAMS,
        needs_model_stats=True,
        validate=check_ram_plus,
        compiled_at=fk("RAM_PLUS"),
        paper=RAM_PAPER,
    ),
    Method(
        "ram_fisher",
        "RAM with a Fisher-weighted mean where 2+ agents updated; unique updates kept whole (or scaled by Fisher mass)",
        rm("ram_fisher"),
        (
            EPSILON,
            *MASK_PARAMS,
            FLOOR,
            Param("r", 0.0, "unique-region scale 1 + r*clip(rho,0,alpha), rho from Fisher mass (0: RAM's 1)", low=0.0),
            Param("alpha", 2.0, "clip bound of the Fisher-mass rho", low=0.0),
        ),
        validate=check_mask,
        model_inputs=("fisher",),
        model_pass=Lazy("agentmerge.engine.stream:fisher_mass_pass"),
    ),
    Method(
        "unique_only",
        "dilution ablation: base + scale * (one agent's unique updates only)",
        rm("unique_only"),
        (
            EPSILON,
            *MASK_PARAMS,
            Param("agent", 0, "index of the agent whose unique updates are kept", low=0),
            Param("scale", 1.0, "s: 1 keeps them whole, 1/N dilutes them as averaging would"),
        ),
        paper=RAM_PAPER,
        validate=check_mask,
    ),
    Method(
        "linear",
        "weighted average of the models",
        rm("linear"),
        uses_weights=True,
        needs_base=False,
        compiled_at=fk("LINEAR"),
    ),
    Method(
        "task_arithmetic",
        "base + lambda * sum of weighted task vectors",
        rm("task_arithmetic"),
        (Param("lambda", 1.0, "scaling coefficient of the summed task vectors"),),
        uses_weights=True,
        compiled_at=fk("TASK_ARITHMETIC"),
        paper="2212.04089",
    ),
    Method(
        "ties",
        "TIES: trim to top-density magnitudes, elect signs by mass, disjoint mean",
        bl("ties"),
        (DENSITY, LAMBDA),
        uses_weights=True,
        prepare=bl("ties_prepare"),
        compiled_at=ft("TIES"),
        paper="2306.01708",
    ),
    Method(
        "dare_linear",
        "DARE + task arithmetic: random drop with rescale, then lambda * weighted sum",
        bl("dare_linear"),
        (DROP, LAMBDA),
        uses_weights=True,
        validate=check_dare,
        compiled_at=ft("DARE_LINEAR"),
        paper="2311.03099",
    ),
    Method(
        "dare_ties",
        "DARE + TIES: random drop with rescale, then (optional trim,) sign election and disjoint mean",
        bl("dare_ties"),
        (DROP, Param("density", 1.0, "TIES trim after the drop (1: none)", 0.0, 1.0, per_model=True), LAMBDA),
        uses_weights=True,
        prepare=bl("dare_ties_prepare"),
        validate=check_dare,
        compiled_at=ft("DARE_TIES"),
        paper="2311.03099",
    ),
    Method(
        "breadcrumbs",
        "Model Breadcrumbs: drop the largest gamma and smallest magnitudes, keep density; task arithmetic",
        bl("breadcrumbs"),
        (
            Param("density", 0.9, "fraction of each agent's entries kept per tensor", 0.0, 1.0, per_model=True),
            Param("gamma", 0.01, "fraction of largest-magnitude entries dropped", 0.0, 1.0, per_model=True),
            LAMBDA,
        ),
        uses_weights=True,
        prepare=bl("breadcrumbs_prepare"),
        validate=check_crumbs,
        compiled_at=ft("BREADCRUMBS"),
        paper="2312.06795",
    ),
    Method(
        "della",
        "DELLA: magnitude-ranked random drop per row with rescale, sign election, disjoint mean",
        bl("della"),
        (
            Param("p", 0.5, "mean drop probability", 0.0, 1.0, per_model=True),
            Param(
                "eps",
                0.1,
                "spread of drop probabilities: p - eps/2 (largest) .. p + eps/2 (smallest)",
                0.0,
                1.0,
                per_model=True,
            ),
            LAMBDA,
        ),
        uses_weights=True,
        chunk_multiple=bl("row_length"),
        validate=check_della,
        paper="2406.11617",
    ),
    Method(
        "model_stock",
        "Model Stock: average of the models pulled toward the base by their task vectors' mean cosine",
        bl("model_stock"),
        prepare=bl("model_stock_prepare"),
        chunk_multiple=STAT_BLOCKS,
        paper="2403.19522",
    ),
    Method(
        "slerp",
        "spherical interpolation of two models' weights per tensor (lerp when nearly colinear)",
        bl("slerp"),
        (
            Param("t", 0.5, "interpolation: 0 gives the first model, 1 the second", 0.0, 1.0),
            Param("colinear", 0.9995, "|cos| above which plain linear interpolation is used", 0.0, 1.0),
        ),
        min_models=2,
        max_models=2,
        needs_base=False,
        prepare=bl("slerp_prepare"),
        chunk_multiple=STAT_BLOCKS,
    ),
    Method(
        "ram_ties",
        "RAM authors' arm-ties: unique updates kept whole, TIES (keep fraction) on the shared region",
        bl("ram_ties"),
        (
            EPSILON,
            *MASK_PARAMS,
            Param(
                "keep", 0.1, "fraction of the shared region each agent keeps, by magnitude", 0.0, 1.0, per_model=True
            ),
        ),
        prepare=bl("ram_ties_prepare"),
        validate=check_mask,
        compiled_at=ft("RAM_TIES"),
    ),
    Method(
        "fisher",
        "diagonal Fisher merging: sum_i w_i F_i theta_i / sum_i w_i F_i",
        bl("fisher"),
        (FLOOR,),
        uses_weights=True,
        needs_base=False,
        model_inputs=("fisher",),
        paper="2111.09832",
    ),
)

METHODS: Mapping[str, Method] = MappingProxyType({m.name: m for m in _ALL})


# --------------------------------------------------------------------------- mergekit's names for them

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
    }
)

# mergekit methods we know of but have no counterpart for (a clearer message than "unknown").
MERGEKIT_WITHOUT_COUNTERPART = ("nuslerp", "multislerp", "karcher", "sce", "nearswap", "arcee_fusion", "passthrough")
