"""The convergence check (``evaluation.convergence``, ``agentmerge converge``): its verdict, its scaled models
against a per-element reference, and the command on a Python evaluator."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from agentmerge.cli import main
from agentmerge.errors import ConfigError
from agentmerge.evaluation.convergence import (
    AgentCheck,
    ScalePoint,
    check_agent,
    check_scales,
    markdown,
    scaled_model,
)
from agentmerge.evaluation.evaluator import Context, Evaluator, Score
from fieldrefs import tensors


def check(values: dict[float, tuple[float, float | None]]) -> AgentCheck:
    return AgentCheck("a", "m", tuple(ScalePoint(s, v, se) for s, (v, se) in values.items()))


def test_verdict_compares_one_and_a_half_against_two_standard_errors() -> None:
    flat = check({0.5: (0.40, 0.01), 1.0: (0.50, 0.01), 1.5: (0.52, 0.01), 2.0: (0.49, 0.01)})
    assert flat.converged is True and flat.gain == pytest.approx(0.02)
    assert flat.two_se == pytest.approx(2 * (2 * 0.01**2) ** 0.5)
    rising = check({1.0: (0.50, 0.01), 1.5: (0.56, 0.01)})
    assert rising.converged is False and rising.best_scale == 1.5
    assert check({1.0: (0.50, None), 1.5: (0.56, 0.01)}).converged is None  # no SE: cannot tell
    assert check({1.0: (0.50, 0.01)}).converged is None
    table = markdown([flat, rising])
    assert "| a | m |" in table and "**no**" in table and "yes" in table


def test_scales_must_include_the_verdicts_two() -> None:
    assert check_scales([2, 1.5, 1, 0.5, 1]) == (0.5, 1.0, 1.5, 2.0)
    for bad in ([1.0, 2.0], [0.0, 1.0, 1.5], [], [1.0, 1.5, float("nan")]):
        with pytest.raises(ConfigError):
            check_scales(bad)


def test_scaled_model_is_base_plus_s_tau_cast_once(tiny_family: tuple[Path, list[Path]], tmp_path: Path) -> None:
    base, agents = tiny_family
    assert scaled_model(base, agents[1], 1.0, tmp_path / "one") == agents[1]  # s = 1: the agent itself
    out = scaled_model(base, agents[1], 1.5, tmp_path / "s15")
    b, a, got = tensors(base), tensors(agents[1]), tensors(out)
    assert set(got) == set(b)
    for name, theta0 in b.items():
        want = (theta0.float() + 1.5 * (a[name].float() - theta0.float())).to(theta0.dtype)
        assert got[name].dtype == theta0.dtype and torch.equal(got[name], want), name


class DistanceEvaluator(Evaluator):
    """Higher is better: minus the distance of the checkpoint from base + target * tau, with a made-up SE."""

    kind = "distance-test"
    usage = "distance-test"

    def __init__(self, base: Path, agent: Path, target: float) -> None:
        b, a = tensors(base), tensors(agent)
        self.goal = {k: b[k].float() + target * (a[k].float() - b[k].float()) for k in b}
        self.scored: list[Path] = []

    @property
    def name(self) -> str:
        return "distance-test"

    def score(self, checkpoint: Path) -> Score:
        self.scored.append(checkpoint)
        assert checkpoint.is_dir()  # the scaled copy exists while it is scored
        got = tensors(checkpoint)
        dist = sum(float((got[k].float() - g).norm()) for k, g in self.goal.items())
        return Score({"closeness": -dist}, {"closeness": 1e-6}, {"closeness": 100})

    @classmethod
    def from_spec(cls, arg: str, options: Any, context: Context) -> Evaluator:
        raise NotImplementedError


@pytest.mark.parametrize(("target", "converged"), [(1.0, True), (1.9, False)])
def test_check_agent_finds_an_agent_that_stopped_short(
    tiny_family: tuple[Path, list[Path]], tmp_path: Path, target: float, converged: bool
) -> None:
    base, agents = tiny_family
    evaluator = DistanceEvaluator(base, agents[2], target)
    result = check_agent(base, agents[2], "closeness", evaluator, tmp_path)
    assert [p.scale for p in result.points] == [0.5, 1.0, 1.5, 2.0]
    assert result.converged is converged
    assert result.best_scale == (1.0 if target == 1.0 else 2.0)
    assert evaluator.scored[1] == agents[2]  # s = 1 scores the agent itself, no copy
    assert list(tmp_path.iterdir()) == []  # every scaled copy removed once scored


EVALUATOR = """
from pathlib import Path
from safetensors.torch import load_file

def score(folder):
    total = sum(float(t.float().abs().sum()) for f in Path(folder).glob("*.safetensors") for t in load_file(f).values())
    return {"mass": total, "other": 1.0}
"""


def test_command_on_a_python_evaluator(
    tiny_family: tuple[Path, list[Path]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    base, agents = tiny_family
    (tmp_path / "massmod.py").write_text(EVALUATOR)
    monkeypatch.chdir(tmp_path)
    argv = ["converge", str(base), str(agents[0]), str(agents[1]), "--evaluate", "python:massmod:score", "--quiet"]
    assert main([*argv, "--metric", "mass", "--scales", "1,1.5", "--json", str(tmp_path / "c.json")]) == 0
    records = json.loads((tmp_path / "c.json").read_text())
    assert [Path(r["agent"]).name for r in records] == [agents[0].name, agents[1].name]
    for r in records:
        assert list(r["scores"]) == ["1", "1.5"] and r["converged"] is None  # a Python function gives no SE
        assert r["gain_1.5"] == pytest.approx(r["scores"]["1.5"]["value"] - r["scores"]["1"]["value"])
    bad = {
        "no metric 'nope' (it reports: mass, other)": ["--metric", "nope"],
        "no agent folder named 'ghost'": ["--metric", "ghost=mass"],
        "no default metric": [],
        "include 1 and 1.5": ["--metric", "mass", "--scales", "1,2"],
    }
    for message, extra in bad.items():
        capsys.readouterr()
        assert main([*argv, *extra]) != 0
        assert message in capsys.readouterr().err
