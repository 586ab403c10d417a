"""A search space over one method's merge: per agent and per layer group, per group, and global parameters.

```yaml
space:
  method: task_arithmetic
  layers_per_group: 4               # K: the decoder layers 0..K-1 are one group, K..2K-1 the next, ...
  groups: [embeddings, blocks, norms, head]   # default: every kind the model has
  per_agent: {weight: [0, 2]}       # one value per agent and group: the agent's model weight on that group
  per_group: {density: [0.1, 1]}    # one value per group, shared by the agents (any parameter of the method)
  params: {lambda: [0.5, 1.5], epsilon: 1e-5}   # global: [low, high] is searched, a single value is fixed
```

A *group* is a set of tensor-name patterns of the base: ``embeddings`` (``*embed*``), one group per block of K
decoder layers (``*.layers.i.*`` for each layer i of the block), ``norms`` (``*norm*``: every norm, the layers'
too) and ``head`` (``*lm_head*``). A tensor belongs to the last group (in that order) with a matching pattern,
which is how the merge config's ``overrides`` apply (the last match wins); a tensor no group matches takes the
global parameters and the models' own weights.

A point of the space is a flat mapping of names to numbers: ``weight.I.GROUP`` (agent I's weight on GROUP),
``NAME.GROUP`` (a per-group parameter) and ``NAME`` (a global one). It reaches the merge as an ordinary merge
config: the globals in ``params``, each group as overrides (one per pattern) with its ``params`` and its
``weights`` (one per model), so the best point is a YAML file that ``agentmerge merge`` runs as it is.

Every name is checked against the method's typed parameter records (unknown names get a suggestion), every
range against the parameter's allowed range, every group against the base's tensors (a group without a tensor
is refused), before Ray starts.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentmerge.config.schema import check_weight
from agentmerge.config.userinput import did_you_mean
from agentmerge.errors import ConfigError
from agentmerge.methods.lines import layer_of
from agentmerge.methods.params import Param
from agentmerge.methods.registry import METHODS
from agentmerge.methods.spec import ParamValue

GroupKind = Literal["embeddings", "blocks", "norms", "head"]
KINDS: tuple[GroupKind, ...] = ("embeddings", "blocks", "norms", "head")  # also the order of the overrides
PATTERNS = {"embeddings": "*embed*", "norms": "*norm*", "head": "*lm_head*"}
PER_AGENT = ("weight",)  # what varies per agent and group: the model weight (methods that weight models)

Range = tuple[float, float]


def known_method(name: str) -> str:
    """``name`` when the registry has it, else a ``ValueError`` suggesting the closest (sweep and search files)."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}{did_you_mean(name, tuple(METHODS))}")
    return name


class Space(BaseModel):
    """The ``space:`` of a search file (see the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: str
    layers_per_group: int = Field(default=4, ge=1)
    groups: list[GroupKind] | None = Field(default=None, min_length=1)
    per_agent: dict[str, list[float]] = Field(default_factory=dict)
    per_group: dict[str, list[float]] = Field(default_factory=dict)
    params: dict[str, ParamValue | list[float]] = Field(default_factory=dict)

    _known = field_validator("method")(classmethod(lambda cls, v: known_method(v)))


NO_EARLY_STOP = "cannot score its first items alone; remove early_stop or score on a task file (tasks:VAL.jsonl)"


class EarlyStop(BaseModel):
    """A search's early stopping: a trial scores its ``first`` items, and stops there when that score is worse
    than the best trial's by more than ``margin`` (in the objective's units, either direction)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    first: int = Field(ge=1)
    margin: float = Field(ge=0, allow_inf_nan=False)


class Baseline(BaseModel):
    """A search's data-free baseline: a method and its parameters, merged from all the models."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: str
    params: dict[str, ParamValue] = Field(default_factory=dict)

    _known = field_validator("method")(classmethod(lambda cls, v: known_method(v)))


def baseline_merge(
    baseline: Baseline, base: str | None, models: Sequence[str], merge: Mapping[str, Any], seed: int
) -> dict[str, Any]:
    """The baseline's merge config, as the plain mapping of its YAML file."""
    data = {**merge, "method": baseline.method, "models": [{"path": m} for m in models]}
    return data | {"params": dict(baseline.params), "seed": seed, **({"base": base} if base else {})}


@dataclass(frozen=True)
class Group:
    """One layer group: its name (``embeddings``, ``layers0-3``, ...) and the tensor-name patterns it holds."""

    name: str
    patterns: tuple[str, ...]


@dataclass(frozen=True)
class Dimension:
    """One searched coordinate: its name in a point, its range, whether it is a whole number."""

    name: str
    low: float
    high: float
    integer: bool = False


def groups_of(names: Sequence[str], space: Space) -> list[Group]:
    """The space's groups over the tensor ``names`` of the base, each holding at least one tensor (else refused)."""
    layers = sorted({i for i in map(layer_of, names) if i is not None})
    wanted = space.groups or KINDS
    out: list[Group] = []
    for kind in KINDS:
        if kind not in wanted:
            continue
        if kind != "blocks":
            out.append(Group(kind, (PATTERNS[kind],)))
            continue
        k = space.layers_per_group
        for first in range(0, (layers[-1] + 1) if layers else 0, k):
            block = [i for i in layers if first <= i < first + k]
            if block:
                out.append(Group(f"layers{block[0]}-{block[-1]}", tuple(f"*.layers.{i}.*" for i in block)))
    held = {g.name: 0 for g in out}
    for name in names:
        owner = owner_of(name, out)
        if owner is not None:
            held[owner] += 1
    empty = [g for g in held if not held[g]] + (["blocks"] if "blocks" in wanted and not layers else [])
    if empty and (space.groups is not None or empty == ["blocks"]):
        raise ConfigError(
            f"space.groups: group {empty[0]!r} holds no tensor of the base (its tensors are named like "
            f"{names[0]!r}, ...); leave it out of groups"
        )
    return [g for g in out if held[g.name]]


def model_groups(ref: str, space: Space) -> list[Group]:
    """The space's groups over the tensors of the model ``ref`` (the base; the first model without one)."""
    from agentmerge.io.formats.open import open_model

    model = open_model(ref, None)
    try:
        names = list(model.tensors)
    finally:
        model.close()
    return groups_of(names, space)


def owner_of(tensor: str, groups: Sequence[Group]) -> str | None:
    """The group a tensor belongs to: the last one with a matching pattern (as overrides apply), else None."""
    owner = None
    for g in groups:
        if any(fnmatch.fnmatchcase(tensor, p) for p in g.patterns):
            owner = g.name
    return owner


def dimensions(space: Space, groups: Sequence[Group], n_agents: int) -> list[Dimension]:
    """Every searched coordinate, checked against the method's parameters (one ``ConfigError`` line if not)."""
    method = METHODS[space.method]
    dims: list[Dimension] = []
    for name, bounds in space.per_agent.items():
        if name not in PER_AGENT:
            raise ConfigError(
                f"space.per_agent: {name!r} cannot vary per agent (only {', '.join(PER_AGENT)}); "
                "put a method parameter in per_group or params"
            )
        if not method.uses_weights:
            raise ConfigError(
                f"space.per_agent: method {space.method!r} does not use model weights; search its parameters "
                "per_group instead (agentmerge methods lists them)"
            )
        low, high = _weight_range(bounds)
        dims += [Dimension(f"weight.{i}.{g.name}", low, high) for i in range(n_agents) for g in groups]
    for name, bounds in space.per_group.items():
        if name in space.params:
            raise ConfigError(f"space: {name!r} is in both per_group and params; keep it in one")
        low, high, integer = _param_range(space.method, name, bounds, "space.per_group")
        dims += [Dimension(f"{name}.{g.name}", low, high, integer) for g in groups]
    for name, value in space.params.items():
        if isinstance(value, list):
            dims.append(Dimension(name, *_param_range(space.method, name, value, "space.params")))
        else:
            _param(space.method, name, "space.params").check(value, space.method)
    if not dims:
        raise ConfigError("space: nothing to search: give per_agent, per_group or params with a [low, high] range")
    return dims


def _param(method: str, name: str, where: str) -> Param:
    p = METHODS[method].param(name)
    if p is None:
        names = METHODS[method].names()
        raise ConfigError(f"{where}: method {method!r} has no parameter {name!r}{did_you_mean(name, names)}")
    return p


def _bounds(bounds: Sequence[float], where: str) -> Range:
    if len(bounds) != 2 or not all(isinstance(b, int | float) and math.isfinite(b) for b in bounds):
        raise ConfigError(f"{where}: give a range as [low, high] (got {list(bounds)})")
    low, high = float(bounds[0]), float(bounds[1])
    if not low < high:
        raise ConfigError(f"{where}: the range [{low:g}, {high:g}] is empty; give low < high")
    return low, high


def _weight_range(bounds: Sequence[float]) -> Range:
    low, high = _bounds(bounds, "space.per_agent.weight")
    try:
        check_weight(low), check_weight(high)
    except ValueError as e:
        raise ConfigError(f"space.per_agent.weight: {e}") from None
    return low, high


def _param_range(method: str, name: str, bounds: Sequence[float], where: str) -> tuple[float, float, bool]:
    p = _param(method, name, where)
    if p.choices or isinstance(p.default, str | bool):
        raise ConfigError(f"{where}.{name}: not a number; fix it in params (a single value)")
    low, high = _bounds(bounds, f"{where}.{name}")
    for end in (low, high):
        try:
            p.check(end, method)
        except ValueError as e:
            raise ConfigError(f"{where}.{name}: the range [{low:g}, {high:g}] leaves the allowed range: {e}") from None
    return low, high, isinstance(p.default, int)


def point_config(space: Space, groups: Sequence[Group], point: Mapping[str, float], n: int) -> dict[str, Any]:
    """A point's part of the merge config: ``params`` (the globals, fixed and searched) and ``overrides``."""
    params: dict[str, Any] = {k: v for k, v in space.params.items() if not isinstance(v, list)}
    params |= {k: point[k] for k, v in space.params.items() if isinstance(v, list)}
    overrides = []
    for g in groups:
        entry: dict[str, Any] = {"params": {k: point[f"{k}.{g.name}"] for k in space.per_group}}
        if "weight" in space.per_agent:
            entry["weights"] = [point[f"weight.{i}.{g.name}"] for i in range(n)]
        overrides += [{"pattern": p, **entry} for p in g.patterns]
    return {"params": dict(sorted(params.items())), "overrides": overrides}


def midpoint(dims: Sequence[Dimension]) -> dict[str, float]:
    """The centre of the space (a point that validates the merge config before any trial)."""
    return {d.name: round((d.low + d.high) / 2) if d.integer else (d.low + d.high) / 2 for d in dims}
