"""The real zoo's bench for one seed: every registry method on the lineup's three agents (``SeedInputs.agents``,
in order), defaults and tuned, the three pairs and the dilution ablation, run as trials of agentmerge's sweep
engine and scored by :func:`score_trial`.

- **defaults**: every method of ``agentmerge.METHODS`` that merges three models (the dilution ablation
  ``unique_only`` aside; the Fisher methods with each agent's diagonal Fisher), at its defaults, on test.
- **tuned** (the fair protocol): each method with an output scale (``Method.output_scale``: ``lambda``,
  ``scale``, ...) gets it chosen on validation from one shared grid by one rule (best mean strict score over
  the trained skills; a tie goes to the value nearest 1), then scored on test. A method without one is its defaults row.
- **pairs**: the 2-agent merges of ``pair_methods`` for each pair, scored on the pair's skills and the held-out one.
- **dilution**: each agent's unique updates alone (``unique_only``) at s = 1 and s = 1/N, on its own skill.

Two sweeps per seed (``WORK/val`` and ``WORK/test``), each with ``real-eval.json`` beside its ``results.jsonl``
saying which split, prompt count and skills each trial is scored on; :func:`score_trial` (the sweeps'
``python:`` evaluator) reads it (the lineup's trained skills included) from the trial folder's grandparent and
writes each trial's full report to ``reports/NAME.json`` (per-prompt scores included, for paired differences).
Evaluations are cached by the weights' sha256, so a rerun only does what is missing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentmerge.api import dumps_json
from agentmerge_zoo.real.evaluate import Report, evaluate_cached
from agentmerge_zoo.real.suite import HELD_OUT, TRAINED

EVAL_FILE = "real-eval.json"
EVALUATOR = "python:agentmerge_zoo.real.bench:score_trial"
PAIR_METHODS = ("task_arithmetic", "ties", "ram", "ram_plus")


@dataclass(frozen=True)
class BenchPlan:
    """Sizes and choices of one seed's bench."""

    n_val: int = 32
    n_test: int = 64
    grid: tuple[float, ...] = (0.5, 1.0, 1.5, 2.0, 3.0)
    methods: tuple[str, ...] = ()  # () = every eligible registry method
    pairs: bool = True
    pair_methods: tuple[str, ...] = PAIR_METHODS
    dilution: bool = True
    fisher_texts: int = 16
    threads: int = 2  # torch threads of each trial
    concurrent: int = 1  # trials at once (each with ``threads``)


def bench_methods(plan: BenchPlan) -> list[str]:
    """The registry's methods that merge three models, or the plan's own list."""
    from agentmerge import METHODS

    if plan.methods:
        return [m for m in plan.methods if m in METHODS]
    eligible = [
        name
        for name, method in METHODS.items()
        if name != "unique_only" and method.min_models <= 3 and (method.max_models or 3) >= 3
    ]
    return sorted(eligible)


def needs_fisher(method: str) -> bool:
    from agentmerge import METHODS

    return "fisher" in METHODS[method].model_inputs


def skill_metrics(report: Report, lineup: Sequence[str]) -> dict[str, float]:
    """Each skill's strict score under its name, and ``trained_avg``, their mean over the lineup's skills."""
    out = {name: float(r["strict"]) for name, r in report.items()}
    trained = [out[s] for s in lineup if s in out]
    if trained:
        out["trained_avg"] = sum(trained) / len(trained)
    return out


def score_trial(folder: Path) -> dict[str, float]:
    """The sweeps' evaluator: the trial's skills (``real-eval.json`` two folders up), strict scores and their mean."""
    folder = Path(folder)
    root = folder.parent.parent
    cfg = json.loads((root / EVAL_FILE).read_text())
    skills = cfg["trials"].get(folder.name, cfg["skills"])
    cache = Path(cfg["cache"]) if cfg.get("cache") else None
    report = evaluate_cached(folder, skills, cfg["split"], cfg["n"], cache)
    (root / "reports").mkdir(exist_ok=True)
    (root / "reports" / f"{folder.name}.json").write_text(dumps_json(report) + "\n")
    return skill_metrics(report, cfg.get("trained", TRAINED))  # an eval file without it: the default lineup's


def read_report(root: Path, name: str) -> Report:
    data: Report = json.loads((root / "reports" / f"{name}.json").read_text())
    return data


@dataclass
class SeedInputs:
    """What one seed's bench merges: the base, one agent per trained skill in the lineup's order, optional Fisher
    files."""

    base: Path
    agents: dict[str, Path]
    fisher: dict[str, Path]
    cache: Path
    fingerprint: str

    @property
    def trained(self) -> tuple[str, ...]:
        """The lineup: the agents' skills, in merge order."""
        return tuple(self.agents)

    @property
    def models(self) -> list[str]:
        return [str(p) for p in self.agents.values()]


def trial_entry(name: str, method: str, params: dict[str, Any], inputs: SeedInputs, models: Sequence[int]) -> Any:
    from agentmerge.api import TrialEntry

    fisher = [str(inputs.fisher[inputs.trained[i]]) for i in models] if needs_fisher(method) else None
    return TrialEntry(name=name, method=method, params=params, models=list(models), fisher=fisher)


def sweep_of(inputs: SeedInputs, entries: list[Any], threads: int) -> Any:
    """The sweep of ``entries`` over the seed's base and agents (one evaluator, no merged output kept)."""
    from agentmerge.api import SweepConfig

    return SweepConfig(
        base=str(inputs.base),
        models=inputs.models,
        trials=entries,
        evaluate=EVALUATOR,
        objective="trained_avg",
        keep="none",
        resources={"cpus": threads},  # type: ignore[arg-type]
        fingerprint=inputs.fingerprint,
    )


def _write_eval_file(root: Path, split: str, n: int, inputs: SeedInputs, trials: dict[str, list[str]]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {"split": split, "n": n, "cache": str(inputs.cache)}
    data |= {"skills": [*inputs.trained, *HELD_OUT], "trials": trials, "trained": list(inputs.trained)}
    (root / EVAL_FILE).write_text(dumps_json(data, indent=1) + "\n")


def run_trials(
    root: Path,
    inputs: SeedInputs,
    entries: list[Any],
    split: str,
    n: int,
    skills: dict[str, list[str]],
    plan: BenchPlan,
    session: Any,
) -> dict[str, dict[str, Any]]:
    """Run the named trials as one sweep in ``root``, ``plan.concurrent`` at once; their records by name (earlier
    runs' included)."""
    from agentmerge.api import run_sweep

    _write_eval_file(root, split, n, inputs, skills)
    outcome = run_sweep(
        sweep_of(inputs, entries, plan.threads), root, quiet=True, session=session, max_concurrent=plan.concurrent
    )
    wanted = {e.name for e in entries}
    return {r["name"]: r for r in outcome.records if r.get("name") in wanted}


def choose_scale(records: dict[str, dict[str, Any]], method: str, grid: Sequence[float]) -> float | None:
    """The grid value with the best validation mean (ties: nearest 1); None when no trial of it succeeded."""
    best: tuple[float, float, float] | None = None
    for value in grid:
        rec = records.get(tuning_name(method, value))
        if rec is None or rec.get("status") != "ok":
            continue
        key = (rec["metrics"]["trained_avg"], -abs(value - 1.0), value)
        if best is None or key[:2] > best[:2]:
            best = key
    return None if best is None else best[2]


def tuning_name(method: str, value: float) -> str:
    return f"{method}.x{value:g}"


Log = Callable[[str], None]
