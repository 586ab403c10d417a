"""A search's ``early_stop``: a trial far worse than the best stops after its first items (counted), one near the
best scores them all, ``direction: min`` alike; bad values get one line; a resumed search records a stopped trial
once, never takes it for the best, and its report counts the stopped trials.

The family: a base that always answers "1" and two agents that answer "7" and "3" (``tinylm.constant_lm``); task
arithmetic with weights (a, b) on the head answers "7" when a wins, "3" when b wins and "1" when neither does, so a
point's score on a task file of sevens and threes is known: 0.5 when an agent wins, 0 when the base does.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from agentmerge.errors import ConfigError
from agentmerge.evaluation.evaluator import Score
from agentmerge.evaluation.generation import Generator
from agentmerge.evaluation.scoring import TaskFileEvaluator
from agentmerge.sweep.run import run_trial
from agentmerge.sweep.sweepfile import point_setting, sweep_from_dict, trial_of
from tinylm import constant_lm

PER_TASK = 10


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("answers")
    rows: list[dict[str, Any]] = [{"task": t, "defaults": {"max_new_tokens": 1}} for t in ("sevens", "threes")]
    for i in range(PER_TASK):  # task by task in the file: the early items must still hold both tasks
        rows.append({"task": "sevens", "prompt": f"Say seven {i}", "reference": "7"})
    rows += [{"task": "threes", "prompt": f"Say three {i}", "reference": "3"} for i in range(PER_TASK)]
    (root / "val.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    names = {"base": "1", "seven": "7", "three": "3"}
    return {name: constant_lm(root / name, answer) for name, answer in names.items()} | {"root": root}


def search_data(family: dict[str, Path], **extra: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "base": str(family["base"]),
        "models": [str(family["seven"]), str(family["three"])],
        "space": {"method": "task_arithmetic", "groups": ["head"], "per_agent": {"weight": [0, 0.6]}},
        "search": {"kind": "random", "n_trials": 6, "seed": 3, "early_stop": {"first": 4, "margin": 0.1}},
        "evaluate": f"tasks:{family['root'] / 'val.jsonl'}",
        "merge": {"dtype": "float32"},
        "keep": "best",
    }
    return data | extra


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of prompts each call of ``Generator.complete`` generates for."""
    calls: list[int] = []
    original = Generator.complete

    def complete(self: Generator, examples: Any, *args: Any, **kwargs: Any) -> list[str]:
        calls.append(len(examples))
        return original(self, examples, *args, **kwargs)

    monkeypatch.setattr(Generator, "complete", complete)
    return calls


def test_the_task_file_scores_its_first_items_then_the_rest(family: dict[str, Path], counted: list[int]) -> None:
    evaluator = TaskFileEvaluator(family["root"] / "val.jsonl")
    early = evaluator.score_early(family["seven"], 5, lambda s: True)
    assert (early.stopped, early.items, early.total, counted) == (True, 5, 2 * PER_TASK, [5])
    assert early.score.count == {"tasks.sevens": 3, "tasks.threes": 2}  # both tasks, in turn
    assert early.score.metrics == {"tasks.sevens": 1.0, "tasks.threes": 0.0, "tasks_avg": 0.5}
    seen: list[Score] = []
    whole = evaluator.score_early(family["seven"], 5, lambda s: seen.append(s) is not None)
    assert (whole.stopped, whole.items, counted[1:]) == (False, 2 * PER_TASK, [5, 2 * PER_TASK - 5])
    assert len(seen) == 1 and whole.score.metrics == evaluator.score(family["seven"]).metrics
    assert whole.score.count == {"tasks.sevens": PER_TASK, "tasks.threes": PER_TASK}


def _trial(family: dict[str, Path], tmp_path: Path, point: tuple[float, float], best: float, **extra: Any) -> Any:
    cfg = sweep_from_dict(search_data(family, **extra), "search.yaml")
    setting = point_setting(cfg, {"weight.0.head": point[0], "weight.1.head": point[1]})
    trial = trial_of(cfg, setting, 0)
    return run_trial(cfg.model_dump(mode="json"), trial, str(tmp_path / "trials" / trial.id), [], best)


def test_a_trial_far_below_the_best_stops_and_one_near_it_does_not(
    family: dict[str, Path], tmp_path: Path, counted: list[int]
) -> None:
    bad = _trial(family, tmp_path, (0.05, 0.05), best=0.5)  # the base's answer: 0 on both tasks
    assert bad["status"] == "ok", bad.get("error")
    assert bad["stopped_early"] is True and bad["best_at_start"] == 0.5
    assert (bad["items"], bad["items_total"], counted) == (4, 2 * PER_TASK, [4])
    assert bad["metrics"]["tasks_avg"] == 0.0 and bad["metrics"]["tasks.sevens"] == 0.0
    near = _trial(family, tmp_path, (0.6, 0.05), best=0.55)  # 0.5: within the margin of 0.1
    assert "stopped_early" not in near and near["items"] == near["items_total"] == 2 * PER_TASK
    assert near["metrics"]["tasks_avg"] == 0.5 and counted[1:] == [4, 2 * PER_TASK - 4]
    first = _trial(family, tmp_path, (0.05, 0.05), best=None)  # nothing to beat yet: every item
    assert "stopped_early" not in first and first["items"] == 20 and first["metrics"]["tasks_avg"] == 0.0


def test_direction_min_stops_a_trial_far_above_the_best(family: dict[str, Path], tmp_path: Path) -> None:
    high = _trial(family, tmp_path, (0.6, 0.05), best=0.0, direction="min")
    assert high.get("stopped_early") is True and high["items"] == 4
    low = _trial(family, tmp_path, (0.05, 0.05), best=0.05, direction="min")
    assert "stopped_early" not in low and low["items"] == 2 * PER_TASK


@pytest.mark.parametrize(
    ("early_stop", "message"),
    [
        ({"first": 0, "margin": 0.1}, "search.early_stop.first: Input should be greater than or equal to 1"),
        ({"first": 4, "margin": -0.1}, "search.early_stop.margin: Input should be greater than or equal to 0"),
        ({"first": 4, "margin": float("nan")}, "search.early_stop.margin: Input should be a finite number"),
        ({"first": 4}, "search.early_stop.margin: Field required"),
        ({"first": 4, "margin": 0.1, "after": 2}, "search.early_stop.after: Extra inputs are not permitted"),
    ],
)
def test_bad_early_stop_values_get_one_line(family: dict[str, Path], early_stop: Any, message: str) -> None:
    data = search_data(family, search={"kind": "random", "n_trials": 6, "early_stop": early_stop})
    with pytest.raises(ConfigError) as err:
        sweep_from_dict(data, "search.yaml")
    assert str(err.value) == f"search.yaml: {message}"


def test_early_stop_needs_an_evaluator_that_scores_first_items_and_a_search(family: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match=r"^search.yaml: search.early_stop: the evaluator 'python:m:f' cannot"):
        sweep_from_dict(search_data(family, evaluate="python:m:f"), "search.yaml")
    grid = {k: v for k, v in search_data(family).items() if k != "space"}
    grid |= {"methods": {"task_arithmetic": {}}, "search": {"kind": "grid", "early_stop": {"first": 1, "margin": 0}}}
    with pytest.raises(ConfigError, match="test, baseline and early_stop belong to a search"):
        sweep_from_dict(grid, "sweep.yaml")


def test_a_resumed_search_records_each_stopped_trial_once(family: dict[str, Path], tmp_path: Path) -> None:
    pytest.importorskip("ray")
    from agentmerge.sweep.finish import read_summary
    from agentmerge.sweep.run import Results, run_sweep

    out = tmp_path / "out"
    first = run_sweep(sweep_from_dict(search_data(family)), out, quiet=True, max_concurrent=1)
    more = search_data(family, search={**search_data(family)["search"], "n_trials": 10})
    second = run_sweep(sweep_from_dict(more), out, quiet=True, max_concurrent=1)
    records = Results(out / "results.jsonl").records()
    assert first.ran == 6 and second.ran == 4 and len({r["trial"] for r in records}) == len(records) == 10
    assert records[:6] == first.records
    stopped = [r for r in records if r.get("stopped_early")]
    assert stopped and all(r["items"] == 4 and r["metrics"]["tasks_avg"] == 0.0 for r in stopped)
    assert all(r["best_at_start"] == 0.5 for r in stopped)
    best = second.best
    assert best is not None and not best.get("stopped_early") and best["metrics"]["tasks_avg"] == 0.5
    summary = read_summary(out)["early_stop"]
    assert summary["stopped"] == len(stopped) and summary["items_unscored"] == 16 * len(stopped)
    assert all(r["items_total"] == 20 and r["items"] == (4 if r in stopped else 20) for r in records)
    evals = [(bool(r.get("stopped_early")), r["seconds"] - r["merge_seconds"]) for r in records]
    want = len(stopped) * statistics.median(e for stop, e in evals if not stop) - sum(e for stop, e in evals if stop)
    assert summary["seconds_saved"] == pytest.approx(max(0.0, want))
    assert f"{len(stopped)} trials stopped early" in (out / "results.md").read_text()
    assert "stopped early (4 of 20 items)" in (out / "results.md").read_text()
