"""The zoo's convergence check and loop: the own-domain standard error, the verdict's table, an exact continuation
of an RL training, and the loop giving a failing agent more steps (tiny sizes)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from agentmerge.evaluation.evaluator import Score
from agentmerge_zoo import converge as converge_module
from agentmerge_zoo import grpo
from agentmerge_zoo.build import build_base, build_zoo, state_path
from agentmerge_zoo.config import parse_steps, smoke_config, with_steps
from agentmerge_zoo.converge import converge, failing, longer, own_point, steps_text
from agentmerge_zoo.converge_report import aggregate_checks, check_table, rounds_lines
from agentmerge_zoo.grpo import TrainState, grpo_run
from agentmerge_zoo.modeling import load_model


def test_own_domain_se_adds_within_a_task_and_in_quadrature_across_tasks() -> None:
    metrics = {"memory.short": 0.8, "memory.long": 0.6, "code.exact": 0.3, "code.partial": 0.5}
    stderr = {"memory.short": 0.03, "memory.long": 0.04, "code.exact": 0.01, "code.partial": 0.02}
    score = Score(metrics, stderr, dict.fromkeys(metrics, 100))
    value, se, n = own_point(score, "memory")  # two tasks: independent prompts
    assert value == pytest.approx(0.7) and se == pytest.approx(0.05 / 2) and n == 100
    value, se, _ = own_point(score, "code")  # one task, two metrics on the same prompts
    assert value == pytest.approx(0.4) and se == pytest.approx(0.03 / 2)


def _check(gain: float, se: float, steps: int = 50) -> dict[str, Any]:
    scores = {f"{s:g}": {"value": 0.5 + (s - 1) * gain * 2, "se": se, "n": 1000} for s in (0.5, 1.0, 1.5, 2.0)}
    two_se = 2 * math.sqrt(2) * se
    return {"metric": "x.own", "scores": scores, "gain_1.5": gain, "two_se": two_se, "converged": gain <= two_se} | {
        "steps": steps
    }


def test_failing_domains_and_longer_steps() -> None:
    checks = {0: {"code": _check(0.0, 0.01), "memory": _check(0.01, 0.01)}, 1: {"code": _check(0.0, 0.01)}}
    checks[1]["memory"] = _check(0.05, 0.01)  # fails in one seed: more steps for every seed
    assert failing(checks, ["code", "memory"]) == ["memory"]
    checks[1]["memory"]["converged"] = None  # unknown is not a failure
    assert failing(checks, ["code", "memory"]) == []
    assert longer(50) == 100 and longer(50, 0.5) == 75 and longer(1, 0.1) == 2


def test_check_table_per_agent_with_verdicts_per_seed() -> None:
    records = [{"convergence": {"memory": _check(0.05, 0.01, 100)}}, {"convergence": {"memory": _check(0.0, 0.01)}}]
    conv = aggregate_checks(records)
    assert conv["memory"]["converged"] == [False, True]
    assert conv["memory"]["scores"]["1.5"]["mean"] == pytest.approx(0.525)
    lines = check_table(conv)
    assert lines[0].startswith("| agent | steps | s = 0.5 | s = 1 | s = 1.5 | s = 2 |")
    assert lines[2].startswith("| agent_memory | 50 / 100 | 47.5 ± 2.5 | 50.0 ± 0.0 | 52.5 ± 2.5 |")
    assert lines[2].endswith("| +5.0 (2.8) / +0.0 (2.8) | **no** / yes |")


def test_steps_option_changes_only_the_named_agents() -> None:
    cfg = with_steps(smoke_config(), parse_steps("memory=7, code=3"))
    assert [(r.domain, r.steps) for r in cfg.recipes] == [("code", 3), ("tool", 2), ("memory", 7)]
    assert steps_text(cfg) == "code=3,tool=2,memory=7"
    with pytest.raises(ValueError, match="DOMAIN=STEPS"):
        parse_steps("memory:7")
    with pytest.raises(ValueError, match="unknown domain"):
        with_steps(cfg, {"math": 3})


def test_a_continued_training_equals_the_longer_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def alternating(_domain: str, _reward: str, prompts: list[str], _texts: list[str]) -> torch.Tensor:
        return torch.tensor([float(i % 2) for i in range(len(prompts))])  # every group has spread: every step updates

    monkeypatch.setattr(grpo, "_rewards", alternating)
    cfg = smoke_config()
    base = build_base(cfg, tmp_path, 0, lambda _m: None)
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    recipe = replace(cfg.recipe("memory"), steps=3, prompts_per_step=2, group_size=4, lr=1e-2)

    def train(steps: int, resume: TrainState | None = None) -> TrainState:
        return grpo_run(load_model(base), tokenizer, replace(recipe, steps=steps), 5, frozenset(), resume=resume)

    whole = train(3)
    path = tmp_path / "state.pt"
    train(1).save(path)
    continued = train(3, TrainState.load(path))
    assert continued.steps == 3 and [r["reward"] for r in continued.history] == [r["reward"] for r in whole.history]
    for name, tensor in whole.weights.items():
        assert torch.equal(tensor, continued.weights[name]), name
    shorter = train(1).weights
    assert any(not torch.equal(t, shorter[k]) for k, t in whole.weights.items())  # the later steps moved weights
    with pytest.raises(ValueError, match="cannot continue"):
        train(2, whole)


def test_the_loop_gives_a_failing_agent_more_steps_continuing_its_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict[str, int]] = []

    def fake_check(cfg: Any, zoo: dict[str, Path], *args: Any, **kwargs: Any) -> dict[str, Any]:
        calls.append({r.domain: r.steps for r in cfg.recipes})
        memory_ok = cfg.recipe("memory").steps >= 4  # memory fails until it has 4 steps
        return {d: _check(0.0 if d != "memory" or memory_ok else 0.1, 0.01, cfg.recipe(d).steps) for d in cfg.domains}

    monkeypatch.setattr(converge_module, "check_seed", fake_check)
    messages: list[str] = []
    cfg = smoke_config()
    final, history = converge(cfg, [0], tmp_path / "zoo", tmp_path / "work", messages.append, rounds=3)
    assert calls == [{"code": 2, "tool": 2, "memory": 2}, {"code": 2, "tool": 2, "memory": 4}]
    assert [h["failing"] for h in history] == [["memory"], []]
    assert steps_text(final) == "code=2,tool=2,memory=4"
    assert any("memory continues its training from step 2 to 4" in m for m in messages), "\n".join(messages)
    assert state_path(cfg, tmp_path / "zoo", 0, final.recipe("memory"), 4).is_file()
    fresh = build_zoo(final, tmp_path / "fresh", 0, threads=1, log=lambda _m: None)["agent_memory"]
    longer_agent = tmp_path / "zoo" / "seed0" / "agent_memory"
    assert (
        load_file(str(fresh / "model.safetensors")).keys() == load_file(str(longer_agent / "model.safetensors")).keys()
    )
    for name, tensor in load_file(str(fresh / "model.safetensors")).items():
        assert torch.equal(tensor, load_file(str(longer_agent / "model.safetensors"))[name]), name
    text = "\n".join(rounds_lines("bf16", history))
    assert "| 0 | agent_memory | 2 |" in text and "| 1 | agent_memory | 4 |" in text and "every agent passes" in text
