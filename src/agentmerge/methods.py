"""Merge methods: one small kernel per method, and one registry table (``METHODS``) at the bottom.

A kernel sees one ``Chunk`` (an element range of one tensor, every agent's task vector for it) and
returns the merged task vector ``tau*`` for those elements; the driver writes ``theta_0 + tau*``.
Every kernel is elementwise given its chunk's statistics, so results do not depend on chunking.

RAM (arXiv 2601.13572), per element p, with m_i = |tau_i| > eps and c = sum_i m_i:

    tau*[p] = 0                                   c = 0   (untouched: keep the base)
            = lambda_i * tau_i[p]                 c = 1   (unique to agent i: no dilution)
            = (1/c) * sum_{i: m_i} tau_i[p]       c >= 2  (shared: mean of the agents that moved it)

RAM uses lambda_i = 1. RAM+ rescales unique updates by rho_i = |shared_i| / |unique_i|:
paper form ``lambda_i = 1 + r * clip(rho_i, 0, alpha)``; the authors' code form
``lambda_i = 1 + (R - 1) * min(rho_i, 1)``. rho is counted over the whole model (``scope: global``,
the default) or per tensor (``scope: tensor``).

Baselines: linear ``sum_i w_i tau_i / sum_i w_i`` (= weighted average of the models) and task
arithmetic ``lambda * sum_i w_i tau_i``. ``unique_only`` is the paper's dilution ablation:
``s * tau_a`` on the elements only agent ``a`` updated, zero elsewhere. The other baselines (TIES, DARE,
Breadcrumbs, DELLA, Model Stock, SLERP, RAM-TIES, Fisher) live in ``baselines.py`` and join ``METHODS`` below.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from agentmerge.deltas import overlap_count, rho_from_histogram, sum_agents, update_mask

ParamValue = float | int | str | bool


@dataclass(frozen=True)
class Param:
    """One method parameter: default, help, and the range or choices a value must respect."""

    name: str
    default: ParamValue
    help: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    low_open: bool = False  # True: value must be > low (not >=)
    per_model: bool = False  # may be set per model (``models[i].params``)

    def check(self, value: object, method: str) -> ParamValue:
        """Return ``value`` coerced to the default's type, or raise ``ValueError`` saying why not."""
        where = f"{method}: parameter {self.name!r}"
        if self.choices:
            if value not in self.choices:
                raise ValueError(f"{where} must be one of {', '.join(self.choices)} (got {value!r})")
            return str(value)
        kind = type(self.default)
        if kind is bool:
            if not isinstance(value, bool):
                raise ValueError(f"{where} must be true or false (got {value!r})")
            return value
        if isinstance(value, str):
            value = _number(value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{where} must be a number (got {value!r})")
        try:
            if kind is int and float(value) != int(value):
                raise ValueError(f"{where} must be a whole number (got {value!r})")
            number: float | int = int(value) if kind is int else float(value)
        except OverflowError:  # inf for an int parameter, or an integer too large for a float
            raise ValueError(f"{where} must be a finite number of sensible size (got {str(value)[:40]})") from None
        self._check_range(where, number)
        return number

    def _check_range(self, where: str, number: float) -> None:
        if not math.isfinite(number):
            raise ValueError(f"{where} must be finite (got {number})")
        below = self.low is not None and (number <= self.low if self.low_open else number < self.low)
        above = self.high is not None and number > self.high
        if below or above:
            lo = "-inf" if self.low is None else f"{self.low}"
            hi = "inf" if self.high is None else f"{self.high}"
            bracket = "(" if self.low_open else "["
            raise ValueError(f"{where} = {number} is out of range {bracket}{lo}, {hi}]")


def _number(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


@dataclass(frozen=True)
class TensorStats:
    """Statistics a kernel may use: overlap histograms of this tensor and of the whole merge."""

    tensor_hist: torch.Tensor | None = None  # [N, N] int64, this tensor
    model_hist: torch.Tensor | None = None  # [N, N] int64, summed over every merged tensor
    prepared: Any = None  # whatever the method's ``prepare`` computed for this tensor


@dataclass(frozen=True)
class Chunk:
    """Elements ``start:stop`` of tensor ``name``: everything a kernel gets."""

    name: str
    start: int
    stop: int
    base: torch.Tensor  # [E] float32
    tau: torch.Tensor  # [N, E] float32
    weights: torch.Tensor  # [N] float32
    params: Mapping[str, ParamValue]  # method params resolved for this tensor
    stats: TensorStats = field(default_factory=TensorStats)
    seed: int = 0
    extras: Mapping[str, torch.Tensor] = field(default_factory=dict)  # e.g. "fisher": [N, E]
    shape: tuple[int, ...] = ()  # the whole tensor's shape (() when unknown)
    model_params: tuple[Mapping[str, ParamValue], ...] = ()  # per model, when any model sets params; else ()


ChunkSource = Callable[[], Iterator[Chunk]]  # a fresh pass over one whole tensor, chunk by chunk


@dataclass(frozen=True)
class TensorSource:
    """The ``ChunkSource`` the driver hands to ``prepare``, with what it knows about the tensor up front."""

    name: str
    shape: tuple[int, ...]
    n_chunks: int
    model_params: tuple[Mapping[str, ParamValue], ...]
    read: ChunkSource

    def __call__(self) -> Iterator[Chunk]:
        return self.read()


@dataclass(frozen=True)
class Method:
    """A merge method: its kernel and what the driver must provide it."""

    name: str
    summary: str
    kernel: Callable[[Chunk], torch.Tensor]
    params: tuple[Param, ...] = ()
    needs_model_stats: bool = False  # run the statistics pass over the whole model first
    uses_weights: bool = False
    min_models: int = 1
    max_models: int | None = None
    needs_base: bool = True
    # optional per-tensor pass over all of the tensor's chunks before the merge pass (e.g. thresholds)
    prepare: Callable[[ChunkSource, Mapping[str, ParamValue]], Any] | None = None
    model_inputs: tuple[str, ...] = ()  # extra per-model tensors, e.g. ("fisher",)
    # chunks of a tensor of this shape start on multiples of this (e.g. whole rows); None: any
    chunk_multiple: Callable[[tuple[int, ...]], int] | None = None
    validate: Callable[[Mapping[str, ParamValue]], None] | None = None  # cross-parameter check (ValueError)

    def defaults(self) -> dict[str, ParamValue]:
        return {p.name: p.default for p in self.params}

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)


# --------------------------------------------------------------------------- RAM family

EPSILON = Param("epsilon", 1e-5, "an element counts as updated when |delta| > epsilon (strict)", low=0.0)


def ram_lambdas(hist: torch.Tensor, params: Mapping[str, ParamValue]) -> torch.Tensor:
    """``[N, N]`` overlap histogram -> ``[N]`` unique-region scales lambda_i (all ones for plain RAM)."""
    rho = torch.tensor(rho_from_histogram(hist), dtype=torch.float64)
    if params.get("form", "paper") == "authors":
        factor = float(params["rescale_factor"]) - 1.0
        lam = 1.0 + factor * rho.clamp(0.0, 1.0)
    else:
        lam = 1.0 + float(params["r"]) * rho.clamp(0.0, float(params["alpha"]))
    return lam.float()


def ram_combine(tau: torch.Tensor, eps: float, lam: torch.Tensor | None = None) -> torch.Tensor:
    """``[N, E]`` -> ``[E]``: mean over active agents where shared, ``lambda_i * tau_i`` where unique, 0 else."""
    mask = update_mask(tau, eps)
    count = overlap_count(mask)
    active = torch.where(mask, tau, 0.0)
    mean = sum_agents(active) / count.clamp(min=1)
    if lam is None:
        return mean  # c = 1: the mean is the lone agent's delta; c = 0: zero
    scaled = sum_agents(active * lam[:, None])
    return torch.where(count == 1, scaled, mean)


def ram(c: Chunk) -> torch.Tensor:
    return ram_combine(c.tau, float(c.params["epsilon"]))


def ram_plus(c: Chunk) -> torch.Tensor:
    hist = c.stats.tensor_hist if c.params["scope"] == "tensor" else c.stats.model_hist
    if hist is None:
        raise RuntimeError("ram_plus needs overlap statistics; the driver did not provide them")
    return ram_combine(c.tau, float(c.params["epsilon"]), ram_lambdas(hist, c.params))


def unique_only(c: Chunk) -> torch.Tensor:
    """Dilution ablation: ``scale * tau_a`` where only agent ``a`` updated the element."""
    a = int(c.params["agent"])
    if a >= c.tau.shape[0]:
        raise ValueError(f"unique_only: agent index {a} but only {c.tau.shape[0]} models")
    mask = update_mask(c.tau, float(c.params["epsilon"]))
    keep = mask[a] & (overlap_count(mask) == 1)
    return torch.where(keep, c.tau[a] * float(c.params["scale"]), 0.0)


# --------------------------------------------------------------------------- simple baselines


def weighted_sum(tau: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``[N, E]``, ``[N]`` -> ``[E]``: sum_i w_i tau_i."""
    return sum_agents(tau * weights[:, None])


def linear(c: Chunk) -> torch.Tensor:
    return weighted_sum(c.tau, c.weights) / c.weights.sum()


def task_arithmetic(c: Chunk) -> torch.Tensor:
    return float(c.params["lambda"]) * weighted_sum(c.tau, c.weights)


# --------------------------------------------------------------------------- registry

RAM_PLUS_PARAMS = (
    EPSILON,
    Param(
        "form", "paper", "paper: 1 + r*clip(rho,0,alpha); authors: 1 + (R-1)*min(rho,1)", choices=("paper", "authors")
    ),
    Param("r", 0.1, "paper form: strength of the unique-region rescaling", low=0.0),
    Param("alpha", 2.0, "paper form: clip bound of rho", low=0.0),
    Param("rescale_factor", 1.2, "authors form: R (the released RAM+ uses 1.2)", low=1.0),
    Param("scope", "global", "rho counted over the whole model (global) or per tensor", choices=("global", "tensor")),
)

METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("ram", "RAM: mean where 2+ agents updated, unique updates kept whole", ram, (EPSILON,)),
        Method(
            "ram_plus",
            "RAM+: RAM with each agent's unique updates scaled up by its overlap-unique ratio",
            ram_plus,
            RAM_PLUS_PARAMS,
            needs_model_stats=True,
        ),
        Method(
            "unique_only",
            "dilution ablation: base + scale * (one agent's unique updates only)",
            unique_only,
            (
                EPSILON,
                Param("agent", 0, "index of the agent whose unique updates are kept", low=0),
                Param("scale", 1.0, "s: 1 keeps them whole, 1/N dilutes them as averaging would"),
            ),
        ),
        Method("linear", "weighted average of the models", linear, uses_weights=True, needs_base=False),
        Method(
            "task_arithmetic",
            "base + lambda * sum of weighted task vectors",
            task_arithmetic,
            (Param("lambda", 1.0, "scaling coefficient of the summed task vectors"),),
            uses_weights=True,
        ),
    )
}


from agentmerge.baselines import BASELINES  # noqa: E402  (baselines build on the classes above)

METHODS.update({m.name: m for m in BASELINES})


def method_names() -> Sequence[str]:
    return sorted(METHODS)
