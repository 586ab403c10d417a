"""Linear merging (the weighted mean of the models) and task arithmetic (arXiv 2212.04089).

Records, mergekit names and entries (no torch); kernels in ``kernels.py``, compiled forms in ``compiled.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import ClassVar

from agentmerge.methods.hooks import Needs
from agentmerge.methods.mergekit_map import MethodMap
from agentmerge.methods.method import Method
from agentmerge.methods.params import MethodParams, Param, use
from agentmerge.methods.spec import Lazy


@dataclass(frozen=True, eq=False)
class LinearParams(MethodParams):
    """The weighted average has no parameters of its own; with equal weights it is ``(1/N) sum_i tau_i``."""

    def sum_multiple(self, weight: float, n_models: int) -> Fraction | None:
        return Fraction(1, n_models)


@dataclass(frozen=True, eq=False)
class TaskArithmeticParams(MethodParams):
    output_scale: ClassVar[str | None] = "scale"
    scale: float = use(
        Param(
            "scale",
            1.0,
            "multiplies the summed task vectors (the paper's lambda, still accepted as lambda)",
            tune="scale = 1 adds every task vector whole; try 1/N to 0.5 or a small sweep",
            aliases=("lambda",),
        )
    )

    def sum_multiple(self, weight: float, n_models: int) -> Fraction | None:
        return Fraction(self.scale * weight)


# mergekit's names for these methods (``agentmerge.config.mergekit_names`` collects them)
MERGEKIT_LINEAR = MethodMap("linear", "linear", normalize=True, ours_normalize=True, uses_base=False)
MERGEKIT_TASK_ARITHMETIC = MethodMap(
    "task_arithmetic",
    "task_arithmetic",
    normalize=False,
    ours_normalize=False,
    rescale=False,
    convert={"lambda": ("scale", 0.0, 1.0)},  # mergekit's lambda is our scale
)

# --------------------------------------------------------------------------- the entries

LINEAR = Method(
    "linear",
    "weighted average of the models",
    Lazy("agentmerge.methods.arithmetic.kernels:linear"),
    LinearParams,
    needs=Needs(weights=True, base=False),
    compiled_at=Lazy("agentmerge.methods.arithmetic.compiled:LINEAR"),
    mergekit=(MERGEKIT_LINEAR,),
)

TASK_ARITHMETIC = Method(
    "task_arithmetic",
    "base + scale * sum of weighted task vectors",
    Lazy("agentmerge.methods.arithmetic.kernels:task_arithmetic"),
    TaskArithmeticParams,
    Needs(weights=True),
    compiled_at=Lazy("agentmerge.methods.arithmetic.compiled:TASK_ARITHMETIC"),
    paper="2212.04089",
    mergekit=(MERGEKIT_TASK_ARITHMETIC,),
)
