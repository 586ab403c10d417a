"""``search: optuna``: optuna's sampler (TPE, seeded) picks each next setting from the grid's values; a search
(``space:``, ``search: cmaes | tpe | random``) samples points of a continuous space with CMA-ES, TPE or at random.

Each optuna trial is one setting (subset, method, parameter values as categorical choices; or a point of the
space); it runs once per seed, and optuna is told the mean of the objective over the seeds, or that it failed.
On a resumed sweep the recorded settings are told first, so the sampler continues where it stopped: a grid
setting as a trial of its own, a point of a space enqueued and asked again (so CMA-ES counts it in its
generation), then told its recorded value. The budget counts the recorded settings.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable, Iterator
from typing import Any

from agentmerge.errors import ConfigError
from agentmerge.sweep import evaluators
from agentmerge.sweep.space import Dimension, dimensions, model_groups
from agentmerge.sweep.sweepfile import Setting, SweepConfig, Trial, grid, point_setting, trial_of


def _choices(cfg: SweepConfig) -> dict[str, list[Any]]:
    """Every categorical the sampler chooses from: subset index, method, and each method's parameters."""
    out: dict[str, list[Any]] = {"subset": list(range(len(cfg.subset_list()))), "method": list(cfg.methods)}
    for method in cfg.methods:
        for name, v in cfg.method_grid(method).items():
            out[f"{method}.{name}"] = v if isinstance(v, list) else [v]
    return out


def _suggest(ot: Any, cfg: SweepConfig, choices: dict[str, list[Any]]) -> Setting:
    subset = cfg.subset_list()[ot.suggest_categorical("subset", choices["subset"])]
    method = ot.suggest_categorical("method", choices["method"])
    params = tuple(
        (n, ot.suggest_categorical(f"{method}.{n}", choices[f"{method}.{n}"])) for n in sorted(cfg.method_grid(method))
    )
    return Setting(method, params, subset)


def optuna_trials(
    cfg: SweepConfig, done: set[str], earlier: list[dict[str, Any]], finished: list[dict[str, Any]]
) -> Iterator[Trial]:
    """Yield the trials optuna asks for, telling it each setting's result as it lands in ``finished``.

    ``earlier``: the records of earlier runs; ``finished``: the runner's list of this run's records, which
    grows while the generator is consumed.
    """
    try:
        import optuna
    except ImportError:
        raise ConfigError("search: optuna needs optuna: pip install 'agentmerge[sweep]'") from None
    objective = cfg.objective or evaluators.default_objective(cfg.evaluate)
    if objective is None:
        raise ConfigError("search: optuna needs an objective: set objective: METRIC in the sweep file")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dims = _dimensions(cfg) if cfg.space is not None else []
    sampler = _sampler(cfg, len(dims))
    study = optuna.create_study(direction="maximize" if cfg.direction == "max" else "minimize", sampler=sampler)
    recorded = {r["trial"]: r for r in earlier}
    if cfg.space is not None:
        suggest = _space_suggest(cfg, dims)
        replayed = _replay_points(cfg, study, recorded, objective, dims)
    else:
        choices = _choices(cfg)
        replayed = _replay(cfg, study, choices, recorded, objective)
        suggest = lambda ot: _suggest(ot, cfg, choices)  # noqa: E731
    open_settings: dict[Setting, Any] = {}  # setting -> its optuna trial, until all its seeds are in
    left = max(0, (cfg.search.n_trials or len(grid(cfg))) - replayed)
    # a grid counts every ask (a repeated setting too); a space counts new points only, since a seeded sampler
    # resumed on its recorded points asks them again first (at most 10 asks per point, so a loop always ends)
    for _ in range(left if cfg.space is None else 10 * left):
        if left == 0:
            break
        _tell_finished(cfg, study, open_settings, recorded, finished, objective)
        ot = study.ask()
        setting = suggest(ot)
        ids = [trial_of(cfg, setting, seed) for seed in cfg.seeds]
        if setting in open_settings or all(t.id in done for t in ids):
            _tell(study, ot, _value([recorded[t.id] for t in ids if t.id in recorded], objective))
            left -= cfg.space is None
            continue
        left -= 1
        open_settings[setting] = ot
        yield from (t for t in ids if t.id not in done)
    _tell_finished(cfg, study, open_settings, recorded, finished, objective)


CMA_GENERATION = "cma:generation"  # optuna's CmaEsSampler: the generation a trial's point was sampled in


def _popsize(dims: int) -> int:
    """CMA-ES's population per generation (the usual 4 + 3 ln d), fixed so a resumed search can replay it."""
    return 4 + int(3 * math.log(max(dims, 1)))


def _sampler(cfg: SweepConfig, dims: int) -> Any:
    """The seeded sampler: TPE for a grid and ``tpe``, CMA-ES for ``cmaes``, uniform for a space's ``random``."""
    import optuna

    seed = cfg.search.seed
    if cfg.search.kind == "cmaes":
        if importlib.util.find_spec("cmaes") is None:  # optuna's CMA-ES sampler runs on it
            raise ConfigError("search: cmaes needs the cmaes package: pip install 'agentmerge[sweep]'")
        return optuna.samplers.CmaEsSampler(seed=seed, popsize=_popsize(dims), warn_independent_sampling=False)
    if cfg.search.kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def _dimensions(cfg: SweepConfig) -> list[Dimension]:
    assert cfg.space is not None
    return dimensions(cfg.space, model_groups(cfg.base or cfg.models[0], cfg.space), len(cfg.models))


def _space_suggest(cfg: SweepConfig, dims: list[Dimension]) -> Callable[[Any], Setting]:
    """Ask an optuna trial for every coordinate of the space: the point's setting."""

    def suggest(ot: Any) -> Setting:
        point = {
            d.name: float(ot.suggest_int(d.name, int(d.low), int(d.high)))
            if d.integer
            else ot.suggest_float(d.name, d.low, d.high)
            for d in dims
        }
        return point_setting(cfg, point)

    return suggest


def _replay_points(
    cfg: SweepConfig, study: Any, recorded: dict[str, Any], objective: str, dims: list[Dimension]
) -> int:
    """Tell the sampler the points an earlier run recorded (every seed), in the order they were recorded.

    For CMA-ES each finished point is filed under a generation (the first alone, then ``popsize`` a
    generation, as a run that asks one at a time files them): its next asks tell the optimizer those
    generations one by one and go on from there.
    """
    import optuna

    dists: dict[str, optuna.distributions.BaseDistribution] = {
        d.name: optuna.distributions.IntDistribution(int(d.low), int(d.high))
        if d.integer
        else optuna.distributions.FloatDistribution(d.low, d.high)
        for d in dims
    }
    seen: set[tuple[tuple[str, float], ...]] = set()
    count = complete = 0
    for record in recorded.values():
        point = tuple(sorted((k, float(v)) for k, v in record.get("point", {}).items()))
        setting = point_setting(cfg, dict(point)) if point and point not in seen else None
        ids = [trial_of(cfg, setting, seed).id for seed in cfg.seeds] if setting is not None else []
        if not ids or not all(i in recorded for i in ids) or set(dict(point)) != set(dists):
            continue
        seen.add(point)
        value = _value([recorded[i] for i in ids], objective)
        attrs = {}
        if cfg.search.kind == "cmaes" and value is not None:
            attrs = {CMA_GENERATION: (complete - 1) // _popsize(len(dims))} if complete else {}
            complete += 1
        params = {k: int(v) if isinstance(dists[k], optuna.distributions.IntDistribution) else v for k, v in point}
        state = optuna.trial.TrialState.FAIL if value is None else optuna.trial.TrialState.COMPLETE
        trial = optuna.trial.create_trial(
            params=params, distributions=dists, value=value, state=state, system_attrs=attrs
        )
        study.add_trial(trial)
        count += 1
    return count


def _tell(study: Any, ot: Any, value: float | None) -> None:
    import optuna

    if value is None:
        study.tell(ot, state=optuna.trial.TrialState.FAIL)
    else:
        study.tell(ot, value)


def _replay(
    cfg: SweepConfig, study: Any, choices: dict[str, list[Any]], recorded: dict[str, Any], objective: str
) -> int:
    """Tell optuna the settings an earlier run finished (every seed recorded); returns how many."""
    import optuna

    dists: dict[str, optuna.distributions.BaseDistribution] = {
        k: optuna.distributions.CategoricalDistribution(v) for k, v in choices.items()
    }
    subsets = cfg.subset_list()
    count = 0
    for setting in grid(cfg):
        ids = [trial_of(cfg, setting, seed).id for seed in cfg.seeds]
        value = _value([recorded[i] for i in ids if i in recorded], objective)
        if value is None or not all(i in recorded for i in ids):
            continue
        params = {"subset": subsets.index(setting.models), "method": setting.method}
        params |= {f"{setting.method}.{n}": v for n, v in setting.params}
        used = {k: dists[k] for k in params}
        study.add_trial(optuna.trial.create_trial(params=params, distributions=used, value=value))
        count += 1
    return count


def _value(records: list[dict[str, Any]], objective: str) -> float | None:
    values = [r["metrics"].get(objective) for r in records if r.get("status") == "ok"]
    if not values or any(not isinstance(v, int | float) for v in values):
        return None
    return sum(float(v) for v in values) / len(values)


def _tell_finished(
    cfg: SweepConfig,
    study: Any,
    open_settings: dict[Setting, Any],
    recorded: dict[str, Any],
    finished: list[dict[str, Any]],
    objective: str,
) -> None:
    """Tell optuna every open setting whose seeds have all been recorded."""
    recorded.update({r["trial"]: r for r in finished})
    for setting, ot in list(open_settings.items()):
        ids = [trial_of(cfg, setting, seed).id for seed in cfg.seeds]
        if all(i in recorded for i in ids):
            _tell(study, ot, _value([recorded[i] for i in ids], objective))
            del open_settings[setting]
