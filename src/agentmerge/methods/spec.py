"""The types that pass between the driver and the kernels: chunks, their statistics, compiled forms, mask rules.

A *chunk* is an element range ``start:stop`` of one tensor, flattened. The driver describes it with a
``ChunkSpec`` (where it lies, the method's parameters for that tensor, the model weights, the
statistics collected so far); the parameters are the method's typed record (``params.MethodParams``,
read in a kernel as ``RamPlusParams.of(c.params).r``), built once per tensor by the plan. A reference
kernel receives a ``Chunk``, the spec with the values (``base [E]`` and the task vectors ``tau [N, E]``
in float32); a compiled kernel receives the spec and the stored values (``ref [E]``, ``models [N, E]``
in their file dtype) and widens them itself.

One update threshold ``epsilon`` decides what counts as an update, per tensor: the value in the
tensor's parameters (after overrides) for methods that take it, else ``EPSILON_DEFAULT``. Masks,
overlap statistics and the RAM+ ratio all read it from ``ChunkSpec.eps`` / ``update_threshold``.

The RAM family may replace that test by another *mask rule* (``MaskRule``, read from the parameters
``mask_dtype``, ``mask_ulps``, ``epsilon_rule``, ``epsilon_q`` by ``mask_rule``): element p of agent i is
active when ``|tau_i[p]| > t_i[p]`` with

    fixed       t = epsilon                                   (the paper's rule, the default)
    ulp grid    |tau| >= k * ulp_F(theta_0[p])                 (mask_dtype F, mask_ulps k)
    percentile  t_i = q-th percentile of |tau_i| on the tensor (epsilon_q q)
    valley      t_i = valley of a 2-Gaussian fit to log10|tau_i| (epsilon as the fallback)

``agentmerge.methods.masks`` computes them; this module only describes the rule, without torch.
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from agentmerge.methods.params import MethodParams, use
from agentmerge.methods.params import Param as Param  # declared in ``params``; named here too
from agentmerge.methods.params import Params as Params
from agentmerge.methods.params import ParamValue as ParamValue

if TYPE_CHECKING:  # annotations only: this module, and the method table built from it, load without torch
    import torch

EPSILON_DEFAULT = 1e-5  # the paper's update threshold: |tau| > 1e-5 is an update


def update_threshold(params: Params) -> float:
    """The update threshold of a tensor: its ``epsilon`` parameter, else ``EPSILON_DEFAULT``."""
    return float(params.get("epsilon", EPSILON_DEFAULT))


EPSILON = Param("epsilon", EPSILON_DEFAULT, "an element counts as updated when |delta| > epsilon (strict)", low=0.0)

# --------------------------------------------------------------------------- the mask rule

MASK_DTYPES = ("none", "base", "float32", "bfloat16", "float16")  # base: the base tensor's dtype (resolved by the plan)
EPSILON_RULES = ("fixed", "percentile", "valley")

MASK_PARAMS = (
    Param(
        "mask_dtype",
        "none",
        "none: |delta| > epsilon; else a grid (base = the base tensor's dtype): |delta| >= mask_ulps * ulp(theta_0)",
        choices=MASK_DTYPES,
    ),
    Param("mask_ulps", 1, "k of the grid rule: an update moves the base weight by at least k ulps", low=1, high=2**20),
    Param(
        "epsilon_rule",
        "fixed",
        "fixed: epsilon; percentile: per agent and tensor the epsilon_q-th percentile of |delta|; "
        "valley: between the two modes of log10|delta| (epsilon when there is none)",
        choices=EPSILON_RULES,
    ),
    Param("epsilon_q", 50.0, "percentile rule: percent of each agent's entries counted as no update", 0.0, 100.0),
)


@dataclass(frozen=True)
class MaskRule:
    """What counts as an update of one tensor (see the module docstring); ``dtype`` is never ``base`` here."""

    epsilon: float = EPSILON_DEFAULT
    dtype: str = "none"  # none, or the grid: float32, bfloat16, float16
    ulps: int = 1
    rule: str = "fixed"  # fixed, percentile, valley
    q: float = 50.0
    seed: int = 0  # the valley rule's subsample of a large tensor

    @property
    def plain(self) -> bool:
        """Today's rule ``|tau| > epsilon`` (the compiled kernels run it)."""
        return self.dtype == "none" and self.rule == "fixed"

    @property
    def adaptive(self) -> bool:
        """Thresholds per agent and tensor, computed from the whole tensor before its kernel runs."""
        return self.dtype == "none" and self.rule != "fixed"

    @property
    def key(self) -> str:
        """A text that tells rules apart (cache keys); the plain rule's is ``repr(epsilon)``, as it always was."""
        if self.dtype != "none":
            return f"ulp:{self.dtype}:{self.ulps}"
        if self.rule == "percentile":
            return f"percentile:{self.q!r}"
        if self.rule == "valley":
            return f"valley:{self.epsilon!r}:{self.seed}"
        return repr(self.epsilon)

    def describe(self) -> str:
        """The rule in words, e.g. ``|tau| >= 1 ulp of theta_0 in bfloat16``."""
        if self.dtype != "none":
            return f"|tau| >= {self.ulps} ulp of theta_0 in {self.dtype}"
        if self.rule == "percentile":
            return f"|tau| > the {self.q:g}th percentile of |tau| per agent and tensor"
        if self.rule == "valley":
            return f"|tau| > the valley of log10|tau| per agent and tensor (else {self.epsilon:g})"
        return f"|tau| > {self.epsilon:g}"


def mask_rule(params: Params, seed: int = 0) -> MaskRule:
    """The mask rule of a tensor's parameters (methods without the mask parameters: ``|tau| > epsilon``).

    A grid rule ignores ``epsilon_rule`` (``check_mask`` refuses both in a config).
    """
    dtype = str(params.get("mask_dtype", "none"))
    if dtype == "base":
        raise ValueError("mask_dtype 'base' is resolved to the base tensor's dtype by the plan (plan.resolve_mask)")
    grid = dtype != "none"
    rule = "fixed" if grid else str(params.get("epsilon_rule", "fixed"))
    return MaskRule(  # parameters the rule does not read keep their defaults: equal rules compare equal
        epsilon=update_threshold(params),
        dtype=dtype,
        ulps=int(params.get("mask_ulps", 1)) if grid else 1,
        rule=rule,
        q=float(params.get("epsilon_q", 50.0)) if rule == "percentile" else 50.0,
        seed=seed if rule == "valley" else 0,
    )


def check_mask(params: Params) -> None:
    """A grid rule and an adaptive epsilon are two different rules: one at a time."""
    if params.get("mask_dtype", "none") != "none" and params.get("epsilon_rule", "fixed") != "fixed":
        raise ValueError(
            f"mask_dtype = {params['mask_dtype']!r} and epsilon_rule = {params['epsilon_rule']!r} are two mask rules; "
            "set one (mask_dtype: none for an epsilon rule, epsilon_rule: fixed for a grid)"
        )


@dataclass(frozen=True)
class TensorStats:
    """Statistics a kernel may use: overlap histograms of this tensor and of the whole merge."""

    tensor_hist: torch.Tensor | None = None  # [N, N] int64, this tensor
    model_hist: torch.Tensor | None = None  # [N, N] int64, summed over every merged tensor
    prepared: Any = None  # the method's whole-tensor statistics (prepare / compiled rounds), multi-chunk tensors
    group_hist: torch.Tensor | None = None  # [N, N] int64, summed over this tensor's group (RAM+ ``scope``)
    model_stat: Any = None  # a ``hooks.ModelSum`` pass's value, e.g. ram_fisher's Fisher masses
    levels: Any = None  # adaptive mask rules: this tensor's per-agent thresholds (``masks.Levels``)


@dataclass(frozen=True, kw_only=True)
class ChunkSpec:
    """Elements ``start:stop`` of tensor ``name`` and everything but their values that a kernel needs."""

    name: str
    start: int
    stop: int
    params: Params  # the method's parameters resolved for this tensor: its record (``Record.of(params)``)
    weights: torch.Tensor  # [N] float32 model weights
    stats: TensorStats = field(default_factory=TensorStats)
    seed: int = 0
    shape: tuple[int, ...] = ()  # the whole tensor's shape (() when unknown)
    model_params: tuple[Params, ...] = ()  # per model, when any model sets params; else ()
    has_base: bool = True  # False: no base model, task vectors are taken against the first model
    warn: Callable[[str], None] | None = None  # where a kernel reports a warning about this tensor (the merge summary)

    @property
    def eps(self) -> float:
        """This tensor's update threshold."""
        return update_threshold(self.params)

    @property
    def rule(self) -> MaskRule:
        """This tensor's mask rule (what its masks and overlap statistics count as an update)."""
        return mask_rule(self.params, self.seed)

    @property
    def whole(self) -> bool:
        """Whether the chunk is its whole tensor (a kernel may then compute tensor statistics itself)."""
        return self.start == 0 and (not self.shape or self.stop == math.prod(self.shape))

    def with_values(
        self, base: torch.Tensor, tau: torch.Tensor, extras: Mapping[str, torch.Tensor] | None = None
    ) -> Chunk:
        """This spec with the chunk's float32 values: what a reference kernel receives."""
        own = {f.name: getattr(self, f.name) for f in fields(ChunkSpec)}
        return Chunk(**own, base=base, tau=tau, extras=extras or {})


@dataclass(frozen=True, kw_only=True)
class Chunk(ChunkSpec):
    """A chunk with its values: the base ``[E]`` and every agent's task vector ``[N, E]``, float32."""

    base: torch.Tensor  # [E] float32
    tau: torch.Tensor  # [N, E] float32
    extras: Mapping[str, torch.Tensor] = field(default_factory=dict)  # e.g. "fisher": [N, E]


@dataclass(frozen=True)
class TensorSource:
    """One multi-chunk tensor as a method's ``prepare`` sees it: what is known up front, and a fresh pass."""

    name: str
    shape: tuple[int, ...]
    n_chunks: int
    params: Params
    model_params: tuple[Params, ...]
    read: Callable[[], Iterator[Chunk]]  # every chunk of the tensor, in order

    def __call__(self) -> Iterator[Chunk]:
        return self.read()


@dataclass(frozen=True)
class CompiledResult:
    """What a compiled kernel returns: ``theta_0 + tau*`` (float32) and the chunk's update-pattern counts."""

    merged: torch.Tensor | None  # [E] float32, None for a counts-only pass
    patterns: torch.Tensor  # [2**N] int64: elements per set of updating agents (bit i = agent i)
    finite: bool  # False: an input was not finite (the driver then takes the reference path, which names it)


# (ref [E], models [N, E] as stored, spec, out [E] float32 buffer) -> CompiledResult
CompiledKernel = Callable[["torch.Tensor", "torch.Tensor", ChunkSpec, "torch.Tensor"], CompiledResult]


@dataclass(frozen=True)
class Rounds:
    """Whole-tensor statistics computed in rounds of chunk-parallel counting (e.g. exact thresholds).

    Per round, every chunk of a tensor is counted (``count``: a tensor of counts and whether the inputs
    were finite), the counts are summed, and ``settle`` turns the sum into the next state; ``done`` says
    when a state is the final value, which a kernel then finds in ``spec.stats.prepared``.
    """

    wanted: Callable[[ChunkSpec], bool]  # whether this tensor needs the statistic
    count: Callable[[torch.Tensor, torch.Tensor, ChunkSpec, Any], tuple[torch.Tensor, bool]]
    settle: Callable[[torch.Tensor, ChunkSpec, Any], Any]
    done: Callable[[Any], bool]


@dataclass(frozen=True)
class Compiled:
    """A method's compiled form (``agentmerge.methods.fused``): bit-identical to its reference kernel."""

    kernel: CompiledKernel
    rounds: Rounds | None = None  # the statistics of multi-chunk tensors, if the kernel needs any


@dataclass(frozen=True)
class Lazy:
    """An object named ``"module:name"``, imported the first time it is used.

    The method table refers to its kernels this way, so listing methods or checking a config imports
    neither torch nor numba; calling a ``Lazy`` function imports its module (once) and calls it.
    """

    target: str  # e.g. "agentmerge.methods.ram.kernels:ram"

    def get(self) -> Any:
        return _load(self.target)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _load(self.target)(*args, **kwargs)


@functools.cache
def _load(target: str) -> Any:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True, eq=False)
class MaskedParams(MethodParams):
    """What counts as an update (``spec.MaskRule``): the threshold and the mask rule of the RAM family."""

    epsilon: float = use(EPSILON)
    mask_dtype: str = use(MASK_PARAMS[0])
    mask_ulps: int = use(MASK_PARAMS[1])
    epsilon_rule: str = use(MASK_PARAMS[2])
    epsilon_q: float = use(MASK_PARAMS[3])

    def check(self, n_models: int) -> None:
        check_mask(self)
