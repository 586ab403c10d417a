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
from collections.abc import Callable, Iterator
from typing import Any

from agentmerge.errors import ConfigError
from agentmerge.sweep import evaluators
from agentmerge.sweep.space import dimensions, model_groups
from agentmerge.sweep.spec import Setting, SweepConfig, Trial, grid, point_setting, trial_of


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
    study = optuna.create_study(direction="maximize" if cfg.direction == "max" else "minimize", sampler=_sampler(cfg))
    recorded = {r["trial"]: r for r in earlier}
    if cfg.space is not None:
        suggest = _space_suggest(cfg)
        replayed = _replay_points(cfg, study, recorded, objective, suggest)
    else:
        choices = _choices(cfg)
        replayed = _replay(cfg, study, choices, recorded, objective)
        suggest = lambda ot: _suggest(ot, cfg, choices)  # noqa: E731
    open_settings: dict[Setting, Any] = {}  # setting -> its optuna trial, until all its seeds are in
    for _ in range(max(0, (cfg.search.n_trials or len(grid(cfg))) - replayed)):
        _tell_finished(cfg, study, open_settings, recorded, finished, objective)
        ot = study.ask()
        setting = suggest(ot)
        ids = [trial_of(cfg, setting, seed) for seed in cfg.seeds]
        if setting in open_settings or all(t.id in done for t in ids):
            _tell(study, ot, _value([recorded[t.id] for t in ids if t.id in recorded], objective))
            continue
        open_settings[setting] = ot
        yield from (t for t in ids if t.id not in done)
    _tell_finished(cfg, study, open_settings, recorded, finished, objective)


def _sampler(cfg: SweepConfig) -> Any:
    """The seeded sampler: TPE for a grid and ``tpe``, CMA-ES for ``cmaes``, uniform for a space's ``random``."""
    import optuna

    seed = cfg.search.seed
    if cfg.search.kind == "cmaes":
        if importlib.util.find_spec("cmaes") is None:  # optuna's CMA-ES sampler runs on it
            raise ConfigError("search: cmaes needs the cmaes package: pip install 'agentmerge[sweep]'")
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    if cfg.search.kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def _space_suggest(cfg: SweepConfig) -> Callable[[Any], Setting]:
    """Ask an optuna trial for every coordinate of the space: the point's setting."""
    assert cfg.space is not None
    dims = dimensions(cfg.space, model_groups(cfg.base or cfg.models[0], cfg.space), len(cfg.models))

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
    cfg: SweepConfig,
    study: Any,
    recorded: dict[str, Any],
    objective: str,
    suggest: Callable[[Any], Setting],
) -> int:
    """Tell the sampler the points an earlier run recorded (every seed), in the order they were recorded."""
    seen: set[tuple[tuple[str, float], ...]] = set()
    count = 0
    for record in recorded.values():
        point = tuple(sorted((k, float(v)) for k, v in record.get("point", {}).items()))
        if not point or point in seen:
            continue
        seen.add(point)
        setting = point_setting(cfg, dict(point))
        ids = [trial_of(cfg, setting, seed).id for seed in cfg.seeds]
        if not all(i in recorded for i in ids):
            continue
        study.enqueue_trial(dict(point))
        ot = study.ask()
        suggest(ot)  # the enqueued values: the sampler records the trial as one of its own
        _tell(study, ot, _value([recorded[i] for i in ids], objective))
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
