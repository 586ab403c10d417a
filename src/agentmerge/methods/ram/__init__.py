"""RAM and its variants (arXiv 2601.13572): RAM, RAM+, RAM with Fisher weights, the unique-only ablation.

Their parameter records, mergekit names and registry entries (no torch); the kernels are in ``kernels.py``, the
compiled forms in ``compiled.py``, what RAM+ and ram_fisher report in ``scales.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from agentmerge.methods.groups import GROUPED_SCOPES, check_patterns
from agentmerge.methods.hooks import ModelSum, Needs, OverlapCounts, Scales
from agentmerge.methods.mergekit_map import MethodMap
from agentmerge.methods.method import Method
from agentmerge.methods.params import FLOOR, Param, use
from agentmerge.methods.spec import MASK_PARAMS, Lazy, MaskedParams

RAM_PAPER = "2601.13572"  # Reinforced Agent Merging (RAM, RAM+), the paper this project implements

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


@dataclass(frozen=True, eq=False)
class RamParams(MaskedParams):
    output_scale: ClassVar[str | None] = "scale"
    shared: str = use(SHARED)
    scale: float = use(SCALE)


def paper_scale(rho: float, r: float, clip: float) -> float:
    """RAM+'s unique-region scale, paper form: ``1 + r * min(max(rho, 0), clip)`` (the paper's clip bound alpha)."""
    return 1.0 + r * min(max(rho, 0.0), clip)


@dataclass(frozen=True, eq=False)
class RamPlusParams(RamParams):
    form: str = use(
        Param(
            "form",
            "paper",
            "paper: 1 + r*min(max(rho,0),clip); authors: 1 + (R-1)*min(rho,1)",
            choices=("paper", "authors"),
        )
    )
    r: float = use(Param("r", 0.1, "paper form: strength of the unique-region rescaling", low=0.0))
    clip: float = use(
        Param(
            "clip",
            2.0,
            "paper form: upper bound of rho (the paper's alpha, still accepted)",
            low=0.0,
            aliases=("alpha",),
        )
    )
    rescale_factor: float = use(Param("rescale_factor", 1.2, "authors form: R (the released RAM+ uses 1.2)", low=1.0))
    scope: str = use(
        Param(
            "scope",
            "global",
            "rho and lambda over the whole model (global), per tensor, per layer index, per module type, "
            "or per pattern of groups",
            choices=("global", "tensor", *GROUPED_SCOPES),
        )
    )
    groups: str = use(
        Param(
            "groups",
            "",
            "scope pattern: whitespace-separated globs (re:REGEX for a regex), first match wins, the rest one group",
        )
    )

    def unique_scale(self, rho: float) -> float:
        """lambda of an agent with overlap-unique ratio ``rho``: the paper's form, or the authors' code's
        ``1 + (R - 1) * min(rho, 1)``."""
        if self.form == "authors":
            return 1.0 + (self.rescale_factor - 1.0) * min(max(rho, 0.0), 1.0)
        return paper_scale(rho, self.r, self.clip)

    @property
    def grouped(self) -> bool:
        """Whether rho is counted over a group of tensors (``scope`` layer, module or pattern)."""
        return self.scope in GROUPED_SCOPES

    def check(self, n_models: int) -> None:
        super().check(n_models)
        pattern, groups = self.scope == "pattern", self.groups.strip()
        if pattern and not groups:
            raise ValueError("ram_plus: scope 'pattern' needs 'groups' (whitespace-separated globs or re:REGEX)")
        if groups and not pattern:
            raise ValueError(f"ram_plus: 'groups' is read only with scope 'pattern' (scope is {self.scope!r})")
        check_patterns(groups)


@dataclass(frozen=True, eq=False)
class RamFisherParams(MaskedParams):
    floor: float = use(FLOOR)
    r: float = use(
        Param("r", 0.0, "unique-region scale 1 + r*min(max(rho,0),clip), rho from Fisher mass (0: RAM's 1)", low=0.0)
    )
    clip: float = use(
        Param(
            "clip", 2.0, "upper bound of the Fisher-mass rho (was alpha, still accepted)", low=0.0, aliases=("alpha",)
        )
    )

    def unique_scale(self, rho: float) -> float:
        """``1 + r * min(max(rho, 0), clip)``, rho from the agent's Fisher masses."""
        return paper_scale(rho, self.r, self.clip)


@dataclass(frozen=True, eq=False)
class UniqueOnlyParams(MaskedParams):
    agent: int = use(Param("agent", 0, "index of the agent whose unique updates are kept", low=0))
    scale: float = use(Param("scale", 1.0, "s: 1 keeps them whole, 1/N dilutes them as averaging would"))

    def check(self, n_models: int) -> None:
        if self.agent >= n_models:
            raise ValueError(f"parameter 'agent' = {self.agent} but there are only {n_models} models (0-based)")
        super().check(n_models)


# mergekit's names for these methods (``agentmerge.config.mergekit_names`` collects them)
# mergekit's RAM masks by |tau| > epsilon and averages the shared region: our mask rules and `shared` at their defaults
_RAM_ONLY = (*(p.name for p in MASK_PARAMS), "shared", "scale")
MERGEKIT_RAM = MethodMap("ram", "ram", ours_only=_RAM_ONLY)
MERGEKIT_RAMPLUS_TL = MethodMap(
    "ramplus_tl",
    "ram_plus",
    fixed={"scope": "tensor"},
    defaults={"alpha": 0.2},
    convert={"alpha": ("clip", 0.0, 1.0)},  # mergekit's alpha is our clip
    ours_only=("form", "rescale_factor", "groups", *_RAM_ONLY),
)

# --------------------------------------------------------------------------- the entries

RAM = Method(
    "ram",
    "RAM: mean where 2+ agents updated, unique updates kept whole",
    Lazy("agentmerge.methods.ram.kernels:ram"),
    RamParams,
    advice=Lazy("agentmerge.methods.ram.scales:ram_shared_advice"),
    compiled_at=Lazy("agentmerge.methods.ram.compiled:RAM"),
    paper=RAM_PAPER,
    mergekit=(MERGEKIT_RAM,),
)

RAM_PLUS = Method(
    "ram_plus",
    "RAM+: RAM with each agent's unique updates scaled up by its overlap-unique ratio",
    Lazy("agentmerge.methods.ram.kernels:ram_plus"),
    RamPlusParams,
    passes=(OverlapCounts(group=Lazy("agentmerge.methods.ram.kernels:scope_group")),),
    scales=Scales(
        rows=Lazy("agentmerge.methods.ram.scales:ram_plus_rows"),
        summary=Lazy("agentmerge.methods.ram.scales:ram_plus_summary"),
    ),
    advice=Lazy("agentmerge.methods.ram.scales:ram_shared_advice"),
    compiled_at=Lazy("agentmerge.methods.ram.compiled:RAM_PLUS"),
    paper=RAM_PAPER,
    mergekit=(MERGEKIT_RAMPLUS_TL,),
)

RAM_FISHER = Method(
    "ram_fisher",
    "RAM with a Fisher-weighted mean where 2+ agents updated; unique updates kept whole (or scaled by Fisher mass)",
    Lazy("agentmerge.methods.ram.kernels:ram_fisher"),
    RamFisherParams,
    Needs(extras=("fisher",)),
    passes=(
        ModelSum(
            count=Lazy("agentmerge.methods.ram.kernels:fisher_masses"),
            wanted=Lazy("agentmerge.methods.ram.kernels:fisher_rescales"),
            label="statistics (Fisher)",
        ),
    ),
    scales=Scales(
        rows=Lazy("agentmerge.methods.ram.scales:ram_fisher_rows"),
        summary=Lazy("agentmerge.methods.ram.scales:ram_fisher_summary"),
    ),
)

UNIQUE_ONLY = Method(
    "unique_only",
    "dilution ablation: base + scale * (one agent's unique updates only)",
    Lazy("agentmerge.methods.ram.kernels:unique_only"),
    UniqueOnlyParams,
    paper=RAM_PAPER,
)
