"""Each method's parameters as a typed record (``params.MethodParams``), with its cross-parameter checks.

The registry names one record per method (``Method.record``); its fields, in order, are the method's
parameter table. Shared parameters are declared once (``LAMBDA``, ``DENSITY``, ...) and used by several
records; a record that extends another (``RamPlusParams(RamParams)``) takes its fields first. Pure Python:
no torch, so listing methods and checking configs stay fast.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from agentmerge.methods.groups import GROUPED_SCOPES, check_patterns
from agentmerge.methods.params import MethodParams, use
from agentmerge.methods.spec import EPSILON, MASK_PARAMS, Param, check_mask

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
_MASK_DTYPE, _MASK_ULPS, _EPSILON_RULE, _EPSILON_Q = MASK_PARAMS

# --------------------------------------------------------------------------- the RAM family


@dataclass(frozen=True, eq=False)
class MaskedParams(MethodParams):
    """What counts as an update (``spec.MaskRule``): the threshold and the mask rule of the RAM family."""

    epsilon: float = use(EPSILON)
    mask_dtype: str = use(_MASK_DTYPE)
    mask_ulps: int = use(_MASK_ULPS)
    epsilon_rule: str = use(_EPSILON_RULE)
    epsilon_q: float = use(_EPSILON_Q)

    def check(self, n_models: int) -> None:
        check_mask(self)


@dataclass(frozen=True, eq=False)
class RamParams(MaskedParams):
    output_scale: ClassVar[str | None] = "scale"
    shared: str = use(SHARED)
    scale: float = use(SCALE)


def paper_scale(rho: float, r: float, alpha: float) -> float:
    """RAM+'s unique-region scale, paper form: ``1 + r * clip(rho, 0, alpha)``."""
    return 1.0 + r * min(max(rho, 0.0), alpha)


@dataclass(frozen=True, eq=False)
class RamPlusParams(RamParams):
    form: str = use(
        Param(
            "form",
            "paper",
            "paper: 1 + r*clip(rho,0,alpha); authors: 1 + (R-1)*min(rho,1)",
            choices=("paper", "authors"),
        )
    )
    r: float = use(Param("r", 0.1, "paper form: strength of the unique-region rescaling", low=0.0))
    alpha: float = use(Param("alpha", 2.0, "paper form: clip bound of rho", low=0.0))
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
        return paper_scale(rho, self.r, self.alpha)

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
        Param("r", 0.0, "unique-region scale 1 + r*clip(rho,0,alpha), rho from Fisher mass (0: RAM's 1)", low=0.0)
    )
    alpha: float = use(Param("alpha", 2.0, "clip bound of the Fisher-mass rho", low=0.0))

    def unique_scale(self, rho: float) -> float:
        """``1 + r * clip(rho, 0, alpha)``, rho from the agent's Fisher masses."""
        return paper_scale(rho, self.r, self.alpha)


@dataclass(frozen=True, eq=False)
class UniqueOnlyParams(MaskedParams):
    agent: int = use(Param("agent", 0, "index of the agent whose unique updates are kept", low=0))
    scale: float = use(Param("scale", 1.0, "s: 1 keeps them whole, 1/N dilutes them as averaging would"))

    def check(self, n_models: int) -> None:
        if self.agent >= n_models:
            raise ValueError(f"parameter 'agent' = {self.agent} but there are only {n_models} models (0-based)")
        super().check(n_models)


@dataclass(frozen=True, eq=False)
class RamTiesParams(MaskedParams):
    keep: float = use(
        Param("keep", 0.1, "fraction of the shared region each agent keeps, by magnitude", 0.0, 1.0, per_model=True)
    )


# --------------------------------------------------------------------------- task arithmetic and the TIES family


@dataclass(frozen=True, eq=False)
class TaskArithmeticParams(MethodParams):
    output_scale: ClassVar[str | None] = "lambda"
    lam: float = use(
        Param(
            "lambda",
            1.0,
            "scaling coefficient of the summed task vectors",
            tune="lambda = 1 adds every task vector whole; try 1/N to 0.5 or a small sweep",
        )
    )


@dataclass(frozen=True, eq=False)
class TiesParams(MethodParams):
    output_scale: ClassVar[str | None] = "lambda"
    density: float = use(DENSITY)
    lam: float = use(LAMBDA)


@dataclass(frozen=True, eq=False)
class DropParams(MethodParams):
    """DARE's drop probability (the base of both DARE records)."""

    p: float = use(DROP)

    def check(self, n_models: int) -> None:
        if self.p >= 1.0:
            raise ValueError(f"parameter 'p' = {self.p} must be below 1 (1 drops everything)")


@dataclass(frozen=True, eq=False)
class DareLinearParams(DropParams):
    output_scale: ClassVar[str | None] = "lambda"
    lam: float = use(
        replace(LAMBDA, tune="lambda = 1 adds every rescaled task vector whole; try 1/N to 0.5 or a sweep")
    )


@dataclass(frozen=True, eq=False)
class DareTiesParams(DropParams):
    output_scale: ClassVar[str | None] = "lambda"
    density: float = use(Param("density", 1.0, "TIES trim after the drop (1: none)", 0.0, 1.0, per_model=True))
    lam: float = use(LAMBDA)


@dataclass(frozen=True, eq=False)
class BreadcrumbsParams(MethodParams):
    output_scale: ClassVar[str | None] = "lambda"
    density: float = use(
        Param("density", 0.9, "fraction of each agent's entries kept per tensor", 0.0, 1.0, per_model=True)
    )
    gamma: float = use(Param("gamma", 0.01, "fraction of largest-magnitude entries dropped", 0.0, 1.0, per_model=True))
    lam: float = use(replace(LAMBDA, tune="lambda = 1 adds every pruned task vector whole; try 1/N to 0.5 or a sweep"))

    def check(self, n_models: int) -> None:
        if self.density + self.gamma > 1.0:
            raise ValueError("breadcrumbs: density + gamma must not exceed 1")


@dataclass(frozen=True, eq=False)
class DellaParams(MethodParams):
    output_scale: ClassVar[str | None] = "lambda"
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
    lam: float = use(LAMBDA)

    def check(self, n_models: int) -> None:
        p, eps = self.p, self.eps
        if p - eps / 2 < 0 or p + eps / 2 >= 1:
            raise ValueError(
                f"della: drop probabilities p +- eps/2 = [{p - eps / 2}, {p + eps / 2}] must lie in [0, 1)"
            )


# --------------------------------------------------------------------------- the others


@dataclass(frozen=True, eq=False)
class SlerpParams(MethodParams):
    t: float = use(Param("t", 0.5, "interpolation: 0 gives the first model, 1 the second", 0.0, 1.0))
    colinear: float = use(Param("colinear", 0.9995, "|cos| above which plain linear interpolation is used", 0.0, 1.0))


@dataclass(frozen=True, eq=False)
class FisherParams(MethodParams):
    floor: float = use(FLOOR)
