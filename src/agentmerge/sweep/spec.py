"""A sweep file: which merges to try and how to score them, and the trials it expands to.

```yaml
base: PATH
models: [A1, A2, A3]              # paths or hub ids, as in merge
subsets: all                      # the full set; or pairs; or explicit lists of model indexes [[0, 1], [0, 2]]
methods:                          # each method with value lists for its parameters (a grid)
  ram: {}
  ram_plus: {r: [0.05, 0.1, 0.2]}
  ties: {density: [0.3, 0.6]}
search: grid                      # or {kind: random, n_trials: 8, seed: 0}, or {kind: optuna, n_trials: 20}
seeds: [0]                        # each setting once per seed (the merge's seed: DARE, DELLA draws)
evaluate: zoo                     # or zoo:test, lm-eval:TASKS, python:MODULE:FUNCTION
objective: agentic_avg            # the metric to rank by (default: the evaluator's own, or the only metric)
direction: max                    # or min
resources: {cpus: 1, gpus: 0}     # per trial
keep: best                        # which merged folders to keep: none, best, all
merge: {dtype: bfloat16}          # anything else a merge config takes (exclude, max_memory, ...)
```

The example gives 1 x (1 + 3 + 2) x 1 = 6 trials. A trial's id is a stable hash of everything that decides
its result (inputs, method, parameters, seed, evaluator, merge options), so a rerun recognises it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agentmerge.config import MergeConfig, config_from_dict
from agentmerge.errors import ConfigError
from agentmerge.registry import METHODS
from agentmerge.spec import ParamValue
from agentmerge.sweep import evaluators
from agentmerge.userinput import did_you_mean, read_yaml


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Search(_Frozen):
    """How trials are chosen: the whole grid, a seeded random sample of it, or optuna's sampler."""

    kind: Literal["grid", "random", "optuna"] = "grid"
    n_trials: int | None = Field(default=None, ge=1)  # settings to try (random, optuna)
    seed: int = 0


class Resources(_Frozen):
    cpus: int = Field(default=1, ge=1)
    gpus: float = Field(default=0, ge=0)


class SweepConfig(_Frozen):
    base: str | None = None
    models: list[str] = Field(min_length=1)
    subsets: Literal["all", "pairs"] | list[list[int]] = "all"
    methods: dict[str, dict[str, ParamValue | list[ParamValue]]] = Field(min_length=1)
    search: Search = Field(default_factory=Search)
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    evaluate: str
    objective: str | None = None
    direction: Literal["max", "min"] = "max"
    resources: Resources = Field(default_factory=Resources)
    keep: Literal["none", "best", "all"] = "best"
    merge: dict[str, Any] = Field(default_factory=dict)

    @field_validator("search", mode="before")
    @classmethod
    def _search_word(cls, v: object) -> object:
        return {"kind": v} if isinstance(v, str) else v

    @field_validator("evaluate")
    @classmethod
    def _known_evaluator(cls, v: str) -> str:
        try:
            evaluators.parse(v)
        except ConfigError as e:
            raise ValueError(str(e).removeprefix("evaluate: ")) from None
        return v

    @field_validator("methods")
    @classmethod
    def _known_methods(cls, v: dict[str, Any]) -> dict[str, Any]:
        for name in v:
            if name not in METHODS:
                raise ValueError(f"unknown method {name!r}{did_you_mean(name, tuple(METHODS))}")
        return v

    @field_validator("merge")
    @classmethod
    def _merge_keys(cls, v: dict[str, Any]) -> dict[str, Any]:
        owned = {"method", "base", "models", "params", "seed"}
        bad = sorted(set(v) & owned)
        if bad:
            raise ValueError(f"merge: {bad[0]!r} is set by the sweep itself (use base, models, methods, seeds)")
        return v

    def subset_list(self) -> list[tuple[int, ...]]:
        """The model index sets to merge."""
        n = len(self.models)
        if self.subsets == "all":
            return [tuple(range(n))]
        if self.subsets == "pairs":
            return list(itertools.combinations(range(n), 2))
        out = []
        for s in self.subsets:
            if not s or any(not 0 <= i < n for i in s) or len(set(s)) != len(s):
                raise ConfigError(f"subsets: {s} must be distinct model indexes in 0..{n - 1}")
            out.append(tuple(s))
        return out


@dataclass(frozen=True)
class Setting:
    """One point of the search space: a method with parameter values, on a subset of the models."""

    method: str
    params: tuple[tuple[str, ParamValue], ...]  # sorted by name
    models: tuple[int, ...]

    @property
    def label(self) -> str:
        params = ", ".join(f"{k}={v}" for k, v in self.params)
        return f"{self.method}({params})" if params else self.method


@dataclass(frozen=True)
class Trial:
    """One merge and evaluation: a setting with a seed; ``id`` is stable across runs."""

    setting: Setting
    seed: int
    id: str


def grid(cfg: SweepConfig) -> list[Setting]:
    """Every setting of the grid, in file order: subsets, then methods, then the product of parameter values."""
    out = []
    for models in cfg.subset_list():
        for method, values in cfg.methods.items():
            names = sorted(values)
            lists = [v if isinstance(v, list) else [v] for v in (values[k] for k in names)]
            for combo in itertools.product(*lists):
                out.append(Setting(method, tuple(zip(names, combo, strict=True)), models))
    return out


def choose(cfg: SweepConfig) -> list[Setting]:
    """The settings grid or random search will try (optuna chooses its own as it goes)."""
    settings = grid(cfg)
    if cfg.search.kind == "random" and cfg.search.n_trials is not None and cfg.search.n_trials < len(settings):
        return random.Random(cfg.search.seed).sample(settings, cfg.search.n_trials)
    return settings


def trial_of(cfg: SweepConfig, setting: Setting, seed: int) -> Trial:
    """The trial of ``setting`` with ``seed``; its id hashes everything that decides its result."""
    identity = {
        "base": cfg.base,
        "models": [cfg.models[i] for i in setting.models],
        "method": setting.method,
        "params": dict(setting.params),
        "seed": seed,
        "evaluate": cfg.evaluate,
        "merge": cfg.merge,
    }
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()
    return Trial(setting, seed, digest[:16])


def trials(cfg: SweepConfig, settings: Sequence[Setting]) -> list[Trial]:
    return [trial_of(cfg, s, seed) for s in settings for seed in cfg.seeds]


def merge_config(cfg: SweepConfig, trial: Trial) -> MergeConfig:
    """The merge a trial runs (validated: a bad parameter fails before any trial starts)."""
    s = trial.setting
    data = {
        **cfg.merge,
        "method": s.method,
        "models": [{"path": cfg.models[i]} for i in s.models],
        "params": dict(s.params),
        "seed": trial.seed,
        "threads": cfg.merge.get("threads", cfg.resources.cpus),
    }
    if cfg.base is not None:
        data["base"] = cfg.base
    return config_from_dict(data, f"sweep trial {s.label}")


def load_sweep(path: str | Path) -> SweepConfig:
    """Read and validate a sweep file; every trial's merge config is validated too."""
    p = Path(path)
    data = read_yaml(p)
    if not isinstance(data, Mapping):
        raise ConfigError(f"{p}: expected a mapping with base, models, methods, evaluate")
    return sweep_from_dict(data, str(p))


def sweep_from_dict(data: Mapping[str, Any], source: str = "sweep") -> SweepConfig:
    known = tuple(SweepConfig.model_fields)
    for key in data:
        if key not in known:
            raise ConfigError(f"{source}: unknown key {key!r}{did_you_mean(str(key), known)}")
    try:
        cfg = SweepConfig.model_validate(dict(data))
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise ConfigError(f"{source}: {where}: {str(first['msg']).removeprefix('Value error, ')}") from None
    for setting in grid(cfg):
        merge_config(cfg, trial_of(cfg, setting, cfg.seeds[0]))
    return cfg
