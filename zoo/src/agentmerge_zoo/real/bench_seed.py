"""One seed's merges: the validation sweep that tunes every output scale, then the test sweep (see ``bench``)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from agentmerge_zoo.fair import output_scale
from agentmerge_zoo.real.bench import (
    BenchPlan,
    Log,
    SeedInputs,
    bench_methods,
    choose_scale,
    needs_fisher,
    read_report,
    run_trials,
    trial_entry,
    tuning_name,
)
from agentmerge_zoo.real.suite import HELD_OUT, TRAINED

ALL_SKILLS = [*TRAINED, *HELD_OUT]  # the default lineup's


def _every(inputs: SeedInputs) -> tuple[int, ...]:
    """Every agent of the seed, by index."""
    return tuple(range(len(inputs.trained)))


def _default(method: str, param: str) -> Any:
    from agentmerge import METHODS

    spec = METHODS[method].param(param)
    return None if spec is None else spec.default


def tune(inputs: SeedInputs, plan: BenchPlan, methods: list[str], work: Path, session: Any) -> dict[str, Any]:
    """Validation scores of every scaled method over the grid, and the chosen value of each."""
    entries, skills = [], {}
    for method in methods:
        param = output_scale(method)
        for value in plan.grid if param is not None else ():
            entries.append(trial_entry(tuning_name(method, value), method, {str(param): value}, inputs, _every(inputs)))
            skills[tuning_name(method, value)] = list(inputs.trained)
    records = run_trials(work / "val", inputs, entries, "val", plan.n_val, skills, plan, session)
    out: dict[str, Any] = {}
    for method in methods:
        param = output_scale(method)
        if param is None:
            continue
        grid = {
            f"{v:g}": records[tuning_name(method, v)]["metrics"].get("trained_avg")
            for v in plan.grid
            if records.get(tuning_name(method, v), {}).get("status") == "ok"
        }
        out[method] = {"param": param, "value": choose_scale(records, method, plan.grid), "val": grid}
    return out


def test_entries(
    inputs: SeedInputs, plan: BenchPlan, methods: list[str], tuned: dict[str, Any]
) -> tuple[list[Any], dict[str, list[str]]]:
    """The test sweep's trials (defaults, tuned, pairs, dilution) and the skills each is scored on."""
    entries, skills = [], {}
    every, lineup = _every(inputs), inputs.trained
    everything = [*lineup, *HELD_OUT]
    for method in methods:
        entries.append(trial_entry(method, method, {}, inputs, every))
        skills[method] = everything
        choice = tuned.get(method, {})
        if choice.get("value") is not None and choice["value"] != _default(method, choice["param"]):
            entries.append(trial_entry(f"{method}.tuned", method, {choice["param"]: choice["value"]}, inputs, every))
            skills[f"{method}.tuned"] = everything
    for i, j in itertools.combinations(every, 2) if plan.pairs else ():
        pair = f"{lineup[i]}+{lineup[j]}"
        for method in (m for m in plan.pair_methods if m in methods):
            entries.append(trial_entry(f"{pair}.{method}", method, {}, inputs, (i, j)))
            skills[f"{pair}.{method}"] = [lineup[i], lineup[j], *HELD_OUT]
    for i, name in enumerate(lineup) if plan.dilution else ():
        for tag, scale in (("s1", 1.0), ("s1_over_n", 1 / len(lineup))):
            entries.append(
                trial_entry(f"dilution.{name}.{tag}", "unique_only", {"agent": i, "scale": scale}, inputs, every)
            )
            skills[f"dilution.{name}.{tag}"] = [name]
    return entries, skills


def bench_seed(inputs: SeedInputs, plan: BenchPlan, work: Path, session: Any, log: Log) -> dict[str, Any]:
    """Tune on validation, score everything on test; the seed's merge results (reports by trial name)."""
    methods = [m for m in bench_methods(plan) if inputs.fisher or not needs_fisher(m)]
    log(f"bench: {len(methods)} methods, tuning {sum(output_scale(m) is not None for m in methods)} on validation")
    tuned = tune(inputs, plan, methods, work, session)
    entries, skills = test_entries(inputs, plan, methods, tuned)
    log(f"bench: {len(entries)} test trials")
    records = run_trials(work / "test", inputs, entries, "test", plan.n_test, skills, plan, session)
    reports: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for name, record in records.items():
        if record.get("status") == "ok":
            reports[name] = read_report(work / "test", name)
        else:
            failed[name] = str(record.get("error", "failed"))
    for method, _choice in tuned.items():  # a tuned value equal to the default is the defaults row
        if f"{method}.tuned" not in records and method in reports:
            reports[f"{method}.tuned"] = reports[method]
    kept = measure_kept(inputs, [m for m in methods if m in reports], work, plan.threads, failed, log)
    return {"methods": methods, "tuning": tuned, "reports": reports, "failed": failed, "kept": kept}


def measure_kept(
    inputs: SeedInputs, methods: list[str], work: Path, threads: int, failed: dict[str, str], log: Log
) -> dict[str, Any]:
    """``kept.kept_of`` of each method's default merge; a method whose measurement fails is named in ``failed``
    (as ``kept.METHOD``) and the bench's scores stand."""
    from agentmerge_zoo.real.kept import kept_of

    log(f"bench: what {len(methods)} default merges kept of each agent")
    out: dict[str, Any] = {}
    for method in methods:
        try:
            out[method] = kept_of(inputs, method, work / "kept", threads)
        except Exception as e:  # an analysis after the scores: it must not lose them
            failed[f"kept.{method}"] = f"{type(e).__name__}: {e}"
    return out
