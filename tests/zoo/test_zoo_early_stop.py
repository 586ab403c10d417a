"""The zoo evaluator's ``score_early``: the first prompts of each task, then (unless stopped) the whole score."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import agentmerge_zoo.evaluate as zoo_evaluate
from agentmerge_zoo.modeling import ModelShape, new_model, save_checkpoint
from agentmerge_zoo.suite import ZooEvaluator


def test_the_zoo_scores_its_first_prompts_then_everything(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = new_model(ModelShape(hidden=16, layers=1, heads=2, intermediate=32, max_positions=256), seed=0)
    save_checkpoint(model, tmp_path / "m", {}, export="fp32")
    prompts: list[int] = []
    original = zoo_evaluate.complete

    def complete(model: Any, tokenizer: Any, texts: list[str], *args: Any) -> list[str]:
        prompts.append(len(texts))
        return original(model, tokenizer, texts, *args)

    monkeypatch.setattr(zoo_evaluate, "complete", complete)
    evaluator = ZooEvaluator("validation", n=4, tasks=["code", "tool"], batch_size=8)
    early = evaluator.score_early(tmp_path / "m", 3, lambda s: True)  # ceil(3 / 2) = 2 prompts a task
    assert (early.stopped, early.items, early.total, prompts) == (True, 4, 8, [2, 2])
    assert early.score.count["code.exact"] == 2 and "agentic_avg" in early.score.metrics
    whole = evaluator.score_early(tmp_path / "m", 3, lambda s: False)
    assert (whole.stopped, whole.items, prompts[2:]) == (False, 8, [2, 2, 4, 4])
    assert whole.score.metrics == evaluator.score(tmp_path / "m").metrics
