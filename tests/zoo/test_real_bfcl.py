"""The BFCL tool skill: its split (never a non-live item in training or validation), its prompt and its credit."""

from __future__ import annotations

import random

import pytest

from agentmerge.errors import ConfigError
from agentmerge.evaluation.bfcl import data as bfcl_data
from agentmerge.evaluation.bfcl.prompt import render_call
from agentmerge_zoo.real.skill_bfcl import TEST_CATEGORIES, BfclSkill
from agentmerge_zoo.real.tasks import eval_set, train_stream


@pytest.fixture(scope="module")
def skill() -> BfclSkill:
    s = BfclSkill()
    try:
        s.live_items()
    except ConfigError as exc:
        pytest.skip(f"the pinned bfcl-eval wheel cannot be had here: {exc}")
    return s


def test_test_is_bfcl_non_live_and_nothing_else_is(skill: BfclSkill) -> None:
    test = eval_set(skill, "test", 40)
    assert [e.data["category"] for e in test] == [c for c in TEST_CATEGORIES for _ in range(10)]
    assert test == eval_set(skill, "test", 40)  # fixed
    non_live = {e.user for c in TEST_CATEGORIES for e in eval_set(skill, "test", 4 * 400) if e.data["category"] == c}
    assert len(non_live) > 800  # 1,000 items, some questions asked in two categories
    stream = train_stream(skill, 0, "agent")
    trained = [next(stream) for _ in range(300)]
    validation = eval_set(skill, "val", 64)
    for ex in trained + validation:
        assert ex.data["category"] not in TEST_CATEGORIES and ex.user not in non_live
        assert all(user not in non_live for user, _ in ex.shots)
    assert {e.data["category"] for e in trained} >= {"gen_simple", "gen_parallel", "live_simple", "live_multiple"}


def test_credit(skill: BfclSkill) -> None:
    examples = eval_set(skill, "test", 8) + eval_set(skill, "val", 8)
    for ex in examples:
        assert skill.score(ex, render_call(ex.data["ground_truth"])) == {"strict": 1.0, "partial": 1.0}
        assert skill.score(ex, "Sorry, I cannot do that.") == {"strict": 0.0, "partial": 0.0}
        assert skill.score(ex, "[no_such_function(x=1)]") == {"strict": 0.0, "partial": 0.2}
    simple = next(e for e in examples if e.data["category"] == "simple_python")
    ((name, _args),) = simple.data["ground_truth"][0].items()
    assert skill.score(simple, f"[{name}()]")["partial"] == pytest.approx(0.5)  # right function, wrong arguments


def test_prompt_is_bfcl_prompt_mode(skill: BfclSkill) -> None:
    ex = skill.sample(random.Random(0))
    messages = ex.messages()
    assert messages[0]["role"] == "system" and "[func_name1(params_name1=params_value1" in messages[0]["content"]
    assert all(f["name"] in messages[0]["content"] for f in ex.data["function"])
    assert [m["role"] for m in messages[1:]] == ["user", "assistant", "user", "assistant", "user"]
    assert messages[2]["content"].startswith("[") and messages[-1]["content"] == ex.user
    assert bfcl_data.NON_LIVE_AST == TEST_CATEGORIES
