"""The real zoo's evaluator plug-in (``evaluate: real``): its scores are the zoo's own evaluation of a checkpoint,
and a sweep or search file naming it is checked before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentmerge.errors import ConfigError
from agentmerge.sweep.sweepfile import load_sweep
from agentmerge_zoo.real.plugin import RealEvaluator
from agentmerge_zoo.real.tiny import make_tiny_base

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_base(tmp_path_factory.mktemp("real-plugin") / "base")


def test_scores_are_the_zoos_own_evaluation(base: Path, tmp_path: Path) -> None:
    from agentmerge_zoo.real.evaluate import evaluate

    ev = RealEvaluator("test", n=2, skills=["memory", "capitals"], trained=["memory"], cache=tmp_path / "evals")
    score = ev.score(base)
    report = evaluate(base, ["memory", "capitals"], "test", 2)
    assert score.metrics == {
        "memory": report["memory"]["strict"],
        "capitals": report["capitals"]["strict"],
        "trained_avg": report["memory"]["strict"],
    }
    assert score.count == {"memory": 2, "capitals": 2} and ev.name == "real:test"
    assert list((tmp_path / "evals").glob("*.json"))  # cached by the weights' digest
    assert ev.score(base).metrics == score.metrics
    val = RealEvaluator(skills=["memory"], trained=["memory"], n=1)
    assert val.split == "validation" and val.skills == ["memory"]
    wide = RealEvaluator("test", n=2, skills=["memory"], trained=["memory"], cache=tmp_path / "evals", dtype="float32")
    assert wide.score(base).record["dtype"] == "float32" and len(list((tmp_path / "evals").glob("*.json"))) == 2


def _sweep(tmp_path: Path, base: Path, evaluate: str, options: str) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(
        f"base: {base}\nmodels: [{base}, {base}]\nmethods: {{task_arithmetic: {{}}}}\n"
        f"evaluate: {evaluate}\nevaluate_options: {options}\n"
    )
    return path


def test_a_sweep_file_names_it(base: Path, tmp_path: Path) -> None:
    sweep = load_sweep(_sweep(tmp_path, base, "real", "{n: 4, trained: [tool, memory]}"))
    assert sweep.evaluate == "real"
    for spec, options, match in (
        ("real:train", "{}", "splits are validation and test"),
        ("real", "{skills: [tool, poetry]}", "unknown: poetry"),
        ("real", "{skills: [tool], trained: [tool, code]}", "every trained skill must be scored"),
        ("real", "{n: 0}", "n must be"),
        ("real", "{tasks: [tool]}", "unknown option 'tasks'"),
        ("real", "{dtype: float16}", "dtype must be one of auto, float32"),
    ):
        with pytest.raises(ConfigError, match=match):
            load_sweep(_sweep(tmp_path, base, spec, options))
