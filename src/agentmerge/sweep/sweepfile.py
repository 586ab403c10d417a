"""A sweep file: which merges to try and how to score them, and the trials it expands to.

```yaml
base: PATH
models: [A1, A2, A3]              # paths or hub ids, as in merge
subsets: all                      # the full set; or pairs; or explicit lists of model indexes [[0, 1], [0, 2]]
methods:                          # each method with value lists for its parameters (a grid)
  ram: {}
  ram_plus: {r: [0.05, 0.1, 0.2]}
  ties: {density: [0.3, 0.6]}
output_scale: null                # the fair protocol: e.g. [0.5, 1, 1.5], each method's output scale over it
search: grid                      # or {kind: random, n_trials: 8, seed: 0}, or {kind: optuna, n_trials: 20}
seeds: [0]                        # each setting once per seed (the merge's seed: DARE, DELLA draws)
evaluate: zoo                     # or zoo:test, lm-eval:TASKS, python:MODULE:FUNCTION
objective: agentic_avg            # the metric to rank by (default: the evaluator's own, or the only metric)
direction: max                    # or min
resources: {cpus: 1, gpus: 0}     # per trial; also retries: 3 (reruns of a trial whose worker or node died)
keep: best                        # which merged folders to keep: none, best, all
merge: {dtype: bfloat16}          # anything else a merge config takes (exclude, max_memory, ...)
trials: []                        # explicit named settings besides the grid (below)
evaluate_options: {}              # the evaluator's options (zoo: n, tasks, batch_size, cache)
fingerprint: null                 # what else decides the results (e.g. a digest of the inputs' bytes)
kept: false                       # also measure what each trial's merge kept of each model's update (needs base)
space: null                       # a search (space.py, docs/search.md): a space, not methods; cmaes | tpe | random
test: null                        # a search's test evaluator (test_options refine evaluate_options for it) and
baseline: null                    # data-free baseline, scored once at the end
test_options: {}
```

The example gives 1 x (1 + 3 + 2) x 1 = 6 trials. ``output_scale`` (the fair protocol: every method tuned alike)
tries every method of ``methods`` that has an output scale (``Method.output_scale``: task arithmetic's ``lambda``,
RAM's ``scale``, ...) at each of these values of it, unless its own grid sets that parameter; with
``output_scale: [0.5, 1, 1.5]`` the example gives 1 x (3 + 3 x 3 + 2 x 3) = 18 trials.

A trial's id is a stable hash of everything that decides its result (inputs, method, parameters, seed,
evaluator, merge options), so a rerun recognises it.

An explicit trial is one named setting, ``{name, method, params, models, fisher, evaluate_options}``:
``models`` are indexes into ``models`` (default all), ``fisher`` one Fisher file per merged model (for
``method: fisher``), ``evaluate_options`` refine the sweep's for this trial (e.g. score a pair of agents on
their two domains only). A named trial keeps its merged folder under ``trials/NAME`` and its record carries
``name``. The keys added after the first release (``trials``, ``evaluate_options``, ``fingerprint``) enter a
trial's id only when set, so the ids of older sweep files do not change.

``kept: true`` adds to each finished trial's record ``kept``: for each merged model, in order, the share of its
update the merge kept (``<Δ, τ_i> / <τ_i, τ_i>`` over the elements it updated, ``agentmerge probe --merged``), one
more streamed pass over the base, those models and the merge. It does not change what a trial merges or scores, so
it is not part of a trial's id: trials finished before it was set keep their records without it.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agentmerge.config.schema import MergeConfig, config_from_dict
from agentmerge.config.userinput import did_you_mean, read_yaml
from agentmerge.errors import ConfigError
from agentmerge.io.guards import jsontext
from agentmerge.methods.registry import METHODS
from agentmerge.methods.spec import ParamValue
from agentmerge.sweep import evaluators
from agentmerge.sweep import space as search_space
from agentmerge.sweep.space import Baseline, Space, baseline_merge, dimensions, midpoint, model_groups, point_config

TRIAL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")  # an explicit trial's name: its folder's name
TRIAL_ID = re.compile(r"[0-9a-f]{16}")  # ``trial_of``: the first 16 hex digits of a sha256
MAX_TRIALS = 100_000  # settings x seeds of one sweep file, counted before anything is expanded


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Search(_Frozen):
    """How trials are chosen: the whole grid, a seeded random sample of it, or optuna's sampler."""

    kind: Literal["grid", "random", "optuna", "cmaes", "tpe"] = "grid"  # cmaes, tpe (and random): a space
    n_trials: int | None = Field(default=None, ge=1)  # settings to try (random, optuna)
    seed: int = 0
    early_stop: search_space.EarlyStop | None = None  # a search's only (space:); docs/search.md


class Resources(_Frozen):
    """Per trial: Ray's request (and the merge's threads); ``retries``: reruns when its worker or node dies."""

    cpus: int = Field(default=1, ge=1)
    gpus: float = Field(default=0, ge=0)
    retries: int = Field(default=3, ge=0)


class TrialEntry(_Frozen):
    """One explicit setting: a named merge of some of the models with fixed parameters."""

    name: str  # also its folder's name
    method: str
    params: dict[str, ParamValue] = Field(default_factory=dict)
    models: list[int] | None = None  # indexes into the sweep's models; default all
    fisher: list[str] | None = None  # one Fisher file per merged model
    evaluate_options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("method")
    @classmethod
    def _known(cls, v: str) -> str:
        return search_space.known_method(v)

    @field_validator("name")
    @classmethod
    def _folder_name(cls, v: str) -> str:
        if not TRIAL_NAME.fullmatch(v):
            raise ValueError(f"{v!r}: use letters, digits and . _ + - (it names the trial's folder)")
        return v


class SweepConfig(_Frozen):
    base: str | None = None
    models: list[str] = Field(min_length=1)
    subsets: Literal["all", "pairs"] | list[list[int]] = "all"
    methods: dict[str, dict[str, ParamValue | list[ParamValue]]] = Field(default_factory=dict)
    output_scale: list[float] | None = Field(default=None, min_length=1)  # one shared grid of every output scale
    trials: list[TrialEntry] = Field(default_factory=list)
    search: Search = Field(default_factory=Search)
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    evaluate: str
    objective: str | None = None
    direction: Literal["max", "min"] = "max"
    resources: Resources = Field(default_factory=Resources)
    keep: Literal["none", "best", "all"] = "best"
    merge: dict[str, Any] = Field(default_factory=dict)
    evaluate_options: dict[str, Any] = Field(default_factory=dict)
    fingerprint: str | None = None
    kept: bool = False
    space: Space | None = None
    test: str | None = None
    test_options: dict[str, Any] = Field(default_factory=dict)  # refine evaluate_options for test (e.g. more n)
    baseline: Baseline | None = None

    @field_validator("search", mode="before")
    @classmethod
    def _search_word(cls, v: object) -> object:
        return {"kind": v} if isinstance(v, str) else v

    @field_validator("evaluate", "test")
    @classmethod
    def _known_evaluator(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            evaluators.parse(v)
        except ConfigError as e:
            raise ValueError(str(e).removeprefix("evaluate: ")) from None
        return v

    @field_validator("methods")
    @classmethod
    def _known_methods(cls, v: dict[str, Any]) -> dict[str, Any]:
        for name in v:
            search_space.known_method(name)
        return v

    @model_validator(mode="after")
    def _entries(self) -> SweepConfig:
        if self.space is not None or self.search.kind in ("cmaes", "tpe"):
            return self._search_entries()
        if self.test is not None or self.baseline is not None or self.search.early_stop is not None:
            raise ValueError("test, baseline and early_stop belong to a search: give space (docs/search.md)")
        if not self.methods and not self.trials:
            raise ValueError("name the merges to try: methods (a grid), trials (explicit settings), or both")
        if self.kept and self.base is None:
            raise ValueError("kept: true measures each merge against the base: give base")
        if self.trials and self.search.kind == "optuna":
            raise ValueError("search: optuna chooses from the methods grid; run explicit trials with grid or random")
        names = [e.name for e in self.trials]
        if len(set(names)) != len(names):
            raise ValueError(f"trials: the name {next(n for n in names if names.count(n) > 1)!r} is used twice")
        for entry in self.trials:
            models = self.entry_models(entry)
            if entry.fisher is not None and len(entry.fisher) != len(models):
                raise ValueError(f"trials: {entry.name}: give one fisher file per merged model ({len(models)})")
        for options in [self.evaluate_options, *(e.evaluate_options for e in self.trials)]:
            try:
                evaluators.check_options(self.evaluate, options)
            except ConfigError as e:
                raise ValueError(str(e)) from None
        return self

    def _search_entries(self) -> SweepConfig:
        """A search: a space, no grid, a sampler, a budget, and a fitness that is never the test split."""
        if self.space is None:
            raise ValueError(f"search: {self.search.kind} samples a space: give space (docs/search.md)")
        if self.methods or self.trials or self.output_scale is not None or self.subsets != "all":
            raise ValueError(
                "space searches one method on all the models: remove methods, trials, output_scale, subsets"
            )
        if self.search.kind not in ("cmaes", "tpe", "random"):
            raise ValueError(f"search: a space is searched by cmaes, tpe or random, not {self.search.kind}")
        n = self.search.n_trials
        if n is None or n > MAX_TRIALS:
            raise ValueError(f"search.n_trials: give the budget, 1 to {MAX_TRIALS} trials (got {n})")
        if self.evaluate == self.test or self.evaluate.endswith(":test"):
            raise ValueError(
                f"evaluate: {self.evaluate!r} is the fitness of every trial; score validation there "
                "(zoo, tasks:VAL.jsonl) and name the test split in test: only"
            )
        if self.test is None and self.baseline is not None:
            raise ValueError("baseline is scored on test at the end: give test (e.g. zoo:test)")
        if self.search.early_stop is not None and not evaluators.parse(self.evaluate)[0].stops_early:
            raise ValueError(f"search.early_stop: the evaluator {self.evaluate!r} {search_space.NO_EARLY_STOP}")
        try:
            evaluators.check_options(self.evaluate, self.evaluate_options)
            if self.test is not None:
                evaluators.check_options(self.test, {**self.evaluate_options, **self.test_options})
        except ConfigError as e:
            raise ValueError(str(e)) from None
        return self

    def entry_models(self, entry: TrialEntry) -> tuple[int, ...]:
        """The model indexes an explicit trial merges (checked: distinct, in range)."""
        if entry.models is None:
            return tuple(range(len(self.models)))
        return self._indexes(entry.models, f"trials: {entry.name}: models")

    @field_validator("merge")
    @classmethod
    def _merge_keys(cls, v: dict[str, Any]) -> dict[str, Any]:
        owned = {"method", "base", "models", "params", "seed"}
        bad = sorted(set(v) & owned)
        if bad:
            raise ValueError(f"merge: {bad[0]!r} is set by the sweep itself (use base, models, methods, seeds)")
        return v

    def method_grid(self, method: str) -> dict[str, ParamValue | list[ParamValue]]:
        """A method's parameter grid: its own values, and ``output_scale`` on its output scale unless it sets it."""
        values = METHODS[method].canonical(self.methods[method])  # an old name (lambda) counts as the scale
        scale = METHODS[method].output_scale
        if self.output_scale is not None and scale is not None and scale not in values:
            values[scale] = list(self.output_scale)
        return values

    def subset_list(self) -> list[tuple[int, ...]]:
        """The model index sets to merge."""
        n = len(self.models)
        if self.subsets == "all":
            return [tuple(range(n))]
        if self.subsets == "pairs":
            return list(itertools.combinations(range(n), 2))
        return [self._indexes(s, "subsets") for s in self.subsets]

    def _indexes(self, s: list[int], where: str) -> tuple[int, ...]:
        n = len(self.models)
        if not s or any(not 0 <= i < n for i in s) or len(set(s)) != len(s):
            raise ConfigError(f"{where}: {s} must be distinct model indexes in 0..{n - 1}")
        return tuple(s)

    def options_of(self, setting: Setting) -> dict[str, Any]:
        """The evaluator's options for a setting: the sweep's, refined by its explicit entry's."""
        entry = next((e for e in self.trials if e.name == setting.name), None)
        return {**self.evaluate_options, **(entry.evaluate_options if entry else {})}


@dataclass(frozen=True)
class Setting:
    """One point of the search space: a method with parameter values, on a subset of the models."""

    method: str
    params: tuple[tuple[str, ParamValue], ...]  # sorted by name
    models: tuple[int, ...]
    name: str | None = None  # an explicit trial's name
    fisher: tuple[str, ...] | None = None  # an explicit trial's Fisher files, one per merged model
    point: tuple[tuple[str, float], ...] | None = None  # a search's point of its space (``space.py``), sorted

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        params = ", ".join(f"{k}={v}" for k, v in self.params)
        return f"{self.method}({params})" if params else self.method


@dataclass(frozen=True)
class Trial:
    """One merge and evaluation: a setting with a seed; ``id`` is stable across runs."""

    setting: Setting
    seed: int
    id: str


def grid(cfg: SweepConfig) -> list[Setting]:
    """Every setting, in file order: subsets, then methods, then the product of parameter values; then ``trials``."""
    out = []
    for models in cfg.subset_list():
        for method in cfg.methods:
            values = cfg.method_grid(method)
            names = sorted(values)
            lists = [v if isinstance(v, list) else [v] for v in (values[k] for k in names)]
            for combo in itertools.product(*lists):
                out.append(Setting(method, tuple(zip(names, combo, strict=True)), models))
    for e in cfg.trials:
        fisher = tuple(e.fisher) if e.fisher is not None else None
        out.append(Setting(e.method, tuple(sorted(e.params.items())), cfg.entry_models(e), e.name, fisher))
    return out


def choose(cfg: SweepConfig) -> list[Setting]:
    """The settings grid or random search will try (optuna chooses its own as it goes)."""
    settings = grid(cfg)
    if cfg.search.kind == "random" and cfg.search.n_trials is not None and cfg.search.n_trials < len(settings):
        return random.Random(cfg.search.seed).sample(settings, cfg.search.n_trials)
    return settings


def trial_of(cfg: SweepConfig, setting: Setting, seed: int) -> Trial:
    """The trial of ``setting`` with ``seed``; its id hashes everything that decides its result."""
    identity: dict[str, Any] = {
        "base": cfg.base,
        "models": [cfg.models[i] for i in setting.models],
        "method": setting.method,
        "params": dict(setting.params),
        "seed": seed,
        "evaluate": cfg.evaluate,
        "merge": cfg.merge,
    }
    # keys added later enter only when set, so older sweeps keep their ids; where the cache lies decides nothing
    options = {k: v for k, v in cfg.options_of(setting).items() if k != "cache"}
    later: dict[str, Any] = {
        "name": setting.name,
        "fisher": setting.fisher,
        "options": options,
        "fingerprint": cfg.fingerprint,
        "point": setting.point,
    }
    identity |= {k: v for k, v in later.items() if v}
    digest = hashlib.sha256(jsontext.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()
    return Trial(setting, seed, digest[:16])


def trials(cfg: SweepConfig, settings: Sequence[Setting]) -> list[Trial]:
    return [trial_of(cfg, s, seed) for s in settings for seed in cfg.seeds]


def merge_config(cfg: SweepConfig, trial: Trial) -> MergeConfig:
    """The merge a trial runs (validated: a bad parameter fails before any trial starts)."""
    return config_from_dict(merge_data(cfg, trial), f"sweep trial {trial.setting.label}")


def merge_data(cfg: SweepConfig, trial: Trial) -> dict[str, Any]:
    """The merge config of a trial as the plain mapping a YAML file holds (``merge_config`` validates it)."""
    s = trial.setting
    data = {
        **cfg.merge,
        "method": s.method,
        "models": [
            {"path": cfg.models[i], **({"fisher": s.fisher[k]} if s.fisher else {})} for k, i in enumerate(s.models)
        ],
        "params": dict(s.params),
        "seed": trial.seed,
        "threads": cfg.merge.get("threads", cfg.resources.cpus),
    }
    if cfg.base is not None:
        data["base"] = cfg.base
    if s.point is not None and cfg.space is not None:
        data |= point_config(
            cfg.space, model_groups(cfg.base or cfg.models[0], cfg.space), dict(s.point), len(s.models)
        )
    return data


def point_setting(cfg: SweepConfig, point: dict[str, float]) -> Setting:
    """The setting of a search point: the space's method with its global parameters, on all the models."""
    assert cfg.space is not None
    params = point_config(cfg.space, [], point, len(cfg.models))["params"]
    return Setting(
        cfg.space.method,
        tuple(sorted(params.items())),
        tuple(range(len(cfg.models))),
        point=tuple(sorted(point.items())),
    )


def check_space(cfg: SweepConfig, source: str) -> None:
    """A search's space against the method and the base (one ``ConfigError`` line), and its centre's merge config."""
    if cfg.space is None:
        return
    try:
        dims = dimensions(cfg.space, model_groups(cfg.base or cfg.models[0], cfg.space), len(cfg.models))
        merge_config(cfg, trial_of(cfg, point_setting(cfg, midpoint(dims)), cfg.seeds[0]))
        if cfg.baseline is not None:
            config_from_dict(baseline_merge(cfg.baseline, cfg.base, cfg.models, cfg.merge, cfg.seeds[0]), "baseline")
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


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
        loc = ".".join(str(x) for x in first["loc"])
        where = f"{loc}: " if loc else ""
        raise ConfigError(f"{source}: {where}{str(first['msg']).removeprefix('Value error, ')}") from None
    check_size(cfg, source)
    check_space(cfg, source)
    for setting in grid(cfg):
        merge_config(cfg, trial_of(cfg, setting, cfg.seeds[0]))
    return cfg


def grid_size(cfg: SweepConfig) -> int:
    """How many settings ``grid`` gives, counted without building them."""
    n = len(cfg.models)
    subsets = 1 if cfg.subsets == "all" else n * (n - 1) // 2 if cfg.subsets == "pairs" else len(cfg.subsets)
    per_subset = sum(
        math.prod(len(v) if isinstance(v, list) else 1 for v in cfg.method_grid(m).values()) for m in cfg.methods
    )
    return subsets * per_subset + len(cfg.trials)


def check_size(cfg: SweepConfig, source: str) -> None:
    """At most ``MAX_TRIALS`` trials (settings x seeds), refused before the grid is expanded."""
    settings = grid_size(cfg)
    if settings * len(cfg.seeds) > MAX_TRIALS:
        raise ConfigError(
            f"{source}: {settings} settings x {len(cfg.seeds)} seeds = {settings * len(cfg.seeds)} trials; at most "
            f"{MAX_TRIALS} trials in one sweep: give fewer values, subsets or seeds"
        )
