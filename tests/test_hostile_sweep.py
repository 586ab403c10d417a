"""Hostile sweep files, output folders and ``results.jsonl`` (issue 23).

Each case failed before its fix: data loss (a resumed sweep with ``keep: best`` removed ``trials/<name>`` for
names read back from ``results.jsonl``: ``../../somewhere`` deleted a folder outside the sweep; a failed
named trial removed a folder the user had put there), a silent miss (``evaluate: tasks:FILE`` not checked
before the trials), a hang (a grid of 10^9 trials expanded in memory; ``results.jsonl`` that is
``/dev/zero``) or a traceback (metrics that are strings or lists, deep nesting, ``--out`` an existing file).
None of these needs Ray: every trial is already recorded, or the sweep stops before the first one.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.hostile import bounded_python, cli, one_line_error, within

from agentmerge.errors import AgentMergeError, ConfigError
from agentmerge.sweep.run import run_sweep
from agentmerge.sweep.sweepfile import choose, load_sweep, trials


def sweep_file(tmp_path: Path, **extra: Any) -> Path:
    data = {
        "base": str(tmp_path / "base"),
        "models": [str(tmp_path / "a1"), str(tmp_path / "a2")],
        "methods": {"task_arithmetic": {"lambda": [0.5, 1.0]}},
        "evaluate": "python:nowhere:score",
        "objective": "score",
        "keep": "best",
        **extra,
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def recorded(path: Path, out: Path, *extra: dict[str, Any], score: float = 1.0) -> list[dict[str, Any]]:
    """``out/results.jsonl`` with every trial of the sweep done (so Ray is never needed), then ``extra``."""
    cfg = load_sweep(path)
    out.mkdir(parents=True, exist_ok=True)
    records = []
    for i, t in enumerate(trials(cfg, choose(cfg))):
        s = t.setting
        records.append(
            {"trial": t.id, "method": s.method, "params": dict(s.params), "models": ["a1", "a2"], "seed": t.seed,
             "status": "ok", "metrics": {"score": score + i}, "seconds": 1.0}
        )  # fmt: skip
        folder = out / "trials" / t.id
        folder.mkdir(parents=True)
        (folder / "merge.json").write_text("{}")
    records += list(extra)
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


def _record(**fields: Any) -> dict[str, Any]:
    base = {"trial": "f" * 16, "method": "ram", "params": {}, "models": ["a1"], "seed": 0, "status": "ok",
            "metrics": {"score": 0.0}}  # fmt: skip
    return {**base, **fields}


@pytest.mark.parametrize(
    "bad",
    [
        {"name": "../../../victim"},
        {"trial": "../../../victim"},
        {"name": "VICTIM"},  # an absolute path, filled in below
        {"trial": "x" * 16},
        {"name": "a/b"},
    ],
)
def test_resume_never_removes_a_folder_named_by_results_jsonl(tmp_path: Path, bad: dict[str, Any]) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.txt").write_text("keep me")
    (victim / "merge.json").write_text("{}")  # even one that looks like a merge output
    bad = {k: (str(victim) if v == "VICTIM" else v) for k, v in bad.items()}
    path = sweep_file(tmp_path)
    out = tmp_path / "sw" / "out"
    recorded(path, out, _record(**bad))
    with pytest.raises(ConfigError, match=r"results\.jsonl:3: field"):
        run_sweep(load_sweep(path), out, source=path, quiet=True)
    assert (victim / "precious.txt").read_text() == "keep me"


def test_keep_best_removes_only_merge_outputs_it_wrote(tmp_path: Path) -> None:
    path = sweep_file(tmp_path)
    out = tmp_path / "out"
    records = recorded(path, out)
    mine = out / "trials" / records[0]["trial"]  # the worse trial's folder: the user's own files, no merge.json
    (mine / "merge.json").unlink()
    (mine / "notes.txt").write_text("mine")
    run_sweep(load_sweep(path), out, source=path, quiet=True)
    assert (mine / "notes.txt").read_text() == "mine"
    assert (out / "trials" / records[1]["trial"]).is_dir()  # the best one kept


def test_a_failed_named_trial_never_removes_the_users_folder(tmp_path: Path) -> None:
    from agentmerge.sweep.run import run_trial
    from agentmerge.sweep.sweepfile import sweep_from_dict, trial_of

    data = {"base": str(tmp_path / "nope"), "models": [str(tmp_path / "nope2")], "evaluate": "zoo",
            "trials": [{"name": "mine", "method": "ram"}]}  # fmt: skip
    cfg = sweep_from_dict(data)
    folder = tmp_path / "trials" / "mine"
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("mine")
    record = run_trial(cfg.model_dump(mode="json"), trial_of(cfg, choose(cfg)[0], 0), str(folder), [])
    assert record["status"] == "failed" and (folder / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"metrics": {"score": "high"}}, "metrics"),
        ({"metrics": {"score": [1, 2]}}, "metrics"),
        ({"metrics": {"score": float("nan")}}, "metrics"),
        ({"metrics": ["score"]}, "metrics"),
        ({"params": [1]}, "params"),
        ({"models": "a1"}, "models"),
        ({"models": [1]}, "models"),
        ({"seed": "0"}, "seed"),
        ({"status": "great"}, "status"),
        ({"error": ["x"], "status": "failed"}, "error"),
        ({"method": {"x": 1}}, "method"),
        ({"seconds": "fast"}, "seconds"),
        ({"params": {"r": [[[[1]]]]}}, "params"),
    ],
)
def test_results_jsonl_fields_are_validated_one_line(
    tmp_path: Path, bad: dict[str, Any], field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = sweep_file(tmp_path)
    out = tmp_path / "out"
    recorded(path, out, _record(**bad))
    one_line_error(["sweep", str(path), "--out", str(out), "--quiet"], capsys, "results.jsonl:3", field)


def test_a_deeply_nested_results_line_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = sweep_file(tmp_path)
    out = tmp_path / "out"
    recorded(path, out)
    with open(out / "results.jsonl", "a") as f:
        f.write('{"trial": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    one_line_error(["sweep", str(path), "--out", str(out), "--quiet"], capsys, "results.jsonl:3")


def test_a_torn_last_line_is_skipped_and_the_next_record_starts_a_new_line(tmp_path: Path) -> None:
    from agentmerge.sweep.run import Results

    path = sweep_file(tmp_path)
    out = tmp_path / "out"
    recorded(path, out)
    with open(out / "results.jsonl", "a") as f:
        f.write('{"trial": "abc')  # a kill mid-write
    results = Results(out / "results.jsonl")
    assert len(results.records()) == 2
    results.append(_record())
    assert [r["trial"] for r in results.records()][-1] == "f" * 16


@pytest.mark.parametrize("kind", ["file", "dev-zero"])
def test_bad_out_folders_are_one_line(tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = sweep_file(tmp_path)
    out = tmp_path / "out"
    if kind == "file":
        out.write_text("not a folder")
        one_line_error(["sweep", str(path), "--out", str(out), "--quiet"], capsys, str(out), "not a folder")
        return
    out.mkdir()
    (out / "results.jsonl").symlink_to("/dev/zero")
    text = bounded_python(
        "from agentmerge.cli import main\n"
        f"print('status', main(['sweep', {str(path)!r}, '--out', {str(out)!r}, '--quiet']))\n",
        timeout=120,
    )
    assert "status 2" in text and "not a regular file" in text and "Traceback" not in text, text


@pytest.mark.parametrize(
    "grid",
    [
        {
            "methods": {
                "ties": {p: list(range(1, 11)) for p in ("density", "lambda", "a", "b", "c", "d", "e", "f", "g")}
            }
        },
        {"seeds": list(range(150_000))},
        {"subsets": "pairs", "models": [f"m{i}" for i in range(2000)]},
    ],
)
def test_a_huge_grid_is_refused_before_it_is_expanded(tmp_path: Path, grid: dict[str, Any]) -> None:
    path = sweep_file(tmp_path, **grid)
    out = bounded_python(
        "from agentmerge.sweep.sweepfile import load_sweep\n"
        "from agentmerge.errors import ConfigError\n"
        f"try:\n    load_sweep({str(path)!r})\nexcept ConfigError as e:\n    print('refused:', e)\n",
        timeout=120,
    )
    assert "refused:" in out and "trials" in out and "at most" in out, out


def test_a_task_file_evaluator_is_checked_before_any_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # the check must come before Ray is even needed
    path = sweep_file(tmp_path, evaluate="tasks:missing.jsonl")
    one_line_error(["sweep", str(path), "--out", str(tmp_path / "o1"), "--quiet"], capsys, "missing.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "p", "reference": "r", "match": "fuzzy"}\n')
    path = sweep_file(tmp_path, evaluate="tasks:bad.jsonl")
    one_line_error(["sweep", str(path), "--out", str(tmp_path / "o2"), "--quiet"], capsys, "bad.jsonl:1")


def test_good_resume_still_works(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = sweep_file(tmp_path)
    out = tmp_path / "out"
    recorded(path, out, _record(name="a-named.trial+1", status="failed", error="boom | it\nbroke", metrics={}))
    with within(60):
        status, err = cli(["sweep", str(path), "--out", str(out), "--quiet"], capsys)
    assert status == 0, err
    assert "2 already done" in err or "3 already done" in err
    md = (out / "results.md").read_text()
    assert "boom \\| it broke" in md
    os.stat(out / "results.md")
    with pytest.raises(AgentMergeError):
        load_sweep(tmp_path / "missing.yaml")
