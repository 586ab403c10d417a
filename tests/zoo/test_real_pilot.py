"""``zoo real pilot``: stages extend one agent, each scored against the base; a rerun skips measured stages and a
shorter stage than the agent has is refused (it would train again from the base); ``check`` adds the convergence
check of the last stage. On the tiny random Llama."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from agentmerge.cli import build_parser
from agentmerge.errors import ConfigError
from agentmerge_zoo.real.config import smoke_config
from agentmerge_zoo.real.pilot import paired_gain, run_pilot, stage_row
from agentmerge_zoo.real.tiny import make_tiny_base

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_base(tmp_path_factory.mktemp("tiny") / "base")


def test_paired_gain_is_the_mean_and_se_of_per_prompt_differences() -> None:
    gain, se = paired_gain([1.0, 1.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0])
    assert gain == pytest.approx(50.0)
    assert se == pytest.approx(100 * math.sqrt((4 * 0.25 / 3) / 4))  # sample variance 1/3 of the diffs, n = 4


def test_stage_row_clears_the_bar_only_above_two_se() -> None:
    curve = [{"reward": r, "cpu_seconds": 1.0} for r in (0.0, 0.5, 1.0)]
    base = {"strict": 0.25, "strict_se": 0.1, "partial": 0.3, "values": [0.0, 1.0, 0.0, 0.0]}
    agent = {"strict": 0.75, "strict_se": 0.1, "partial": 0.8, "values": [1.0, 1.0, 0.0, 1.0]}
    row = stage_row(curve, agent, base)
    assert (row["steps"], row["cpu_seconds"], row["train_reward_last10"]) == (3, 3.0, 0.5)
    assert (row["base_partial"], row["agent_partial"]) == (0.3, 0.8)
    assert row["paired_gain"] == pytest.approx(50.0) and row["clears_2se"] is False  # 50 < 2 x 28.9
    sure = stage_row(curve, {**agent, "values": [1.0] * 4}, {**base, "values": [0.0] * 4})
    assert sure["clears_2se"] is True


def test_stages_extend_the_agent_and_a_rerun_skips_them(tiny_base: Path, tmp_path: Path) -> None:
    recipe = replace(smoke_config().recipe("tool"), steps=0)
    out = tmp_path / "pilot.json"
    first = run_pilot(tiny_base, tmp_path / "w", recipe, 0, [1], 2, out)
    assert [r["steps"] for r in first["stages"]] == [1]
    agent = tmp_path / "w" / "seed0" / "agent_tool" / "agent.json"
    curve_1 = json.loads(agent.read_text())["curve"]
    second = run_pilot(tiny_base, tmp_path / "w", recipe, 0, [1, 2], 2, out)
    assert [r["steps"] for r in second["stages"]] == [1, 2]
    assert second["stages"][0] == first["stages"][0]  # not measured again
    curve_2 = json.loads(agent.read_text())["curve"]
    assert curve_2[:1] == curve_1  # extended, not trained again
    assert json.loads(out.read_text()) == second
    checked = run_pilot(tiny_base, tmp_path / "w", recipe, 0, [1, 2], 2, out, check=2)
    assert checked["stages"] == second["stages"]  # the stages are not trained or measured again
    assert checked["check"]["steps"] == 2 and set(checked["check"]["scores"]) == {"0.5", "1", "1.5", "2"}
    assert isinstance(checked["check"]["converged"], bool)
    with pytest.raises(ValueError, match="trained to 2 steps already"):
        run_pilot(tiny_base, tmp_path / "w", recipe, 0, [1, 2, 0], 2, out)
    with pytest.raises(ValueError, match="trained to 2 steps already"):  # a fresh record, the same agent
        run_pilot(tiny_base, tmp_path / "w", recipe, 0, [1], 2, tmp_path / "other.json")
    assert len(json.loads(agent.read_text())["curve"]) == 2  # untouched


def test_cli_refuses_an_untrained_skill(tiny_base: Path, tmp_path: Path) -> None:
    argv = ["zoo", "real", "pilot", "--base", str(tiny_base), "--work", str(tmp_path), "--skill", "heldout"]
    args = build_parser().parse_args([*argv, "--steps", "1", "--json", str(tmp_path / "p.json")])
    with pytest.raises(ConfigError, match="trained skills"):
        args.func(args)


def test_float32_trains_without_autocast_and_evaluates_in_float32(
    tiny_base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--float32``: the recipe without bf16 autocast, every evaluation computed in float32 and cached apart from
    the checkpoint's own dtype (its key and its record say so)."""
    from agentmerge_zoo.real import config, evaluate

    seen: list[object] = []
    real = evaluate.score_model

    def spy(model: torch.nn.Module, *args: object, **kwargs: object) -> object:
        seen.append(next(model.parameters()).dtype)
        return real(model, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(evaluate, "score_model", spy)
    monkeypatch.setattr(config, "pilot_recipes", lambda: (replace(smoke_config().recipe("tool"), steps=0),))
    out = tmp_path / "p.json"
    argv = ["zoo", "real", "pilot", "--base", str(tiny_base), "--work", str(tmp_path / "w"), "--skill", "tool"]
    args = build_parser().parse_args([*argv, "--steps", "1", "--n-test", "2", "--json", str(out), "--float32"])
    assert args.func(args) == 0
    record = json.loads(out.read_text())
    assert record["recipe"]["autocast"] is False and record["eval_dtype"] == "float32"
    assert seen and set(seen) == {torch.float32}  # the base and the agent (one, when the step left it equal)
    cached = [json.loads(f.read_text()) for f in (tmp_path / "w" / "evals").glob("*.json")]
    assert len(cached) == len(seen) and {c["dtype"] for c in cached} == {"float32"}
    own = evaluate.evaluate_cached(tiny_base, ["tool"], "test", 2, tmp_path / "w" / "evals")
    assert seen[-1] == torch.bfloat16 and len(list((tmp_path / "w" / "evals").glob("*.json"))) == len(cached) + 1
    assert own["tool"]["n"] == 2
    with pytest.raises(ValueError, match="compute dtype"):
        evaluate.evaluate(tiny_base, ["tool"], "test", 2, dtype="float16")
