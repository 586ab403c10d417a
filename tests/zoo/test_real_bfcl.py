"""The BFCL tool skill: its split (never a non-live item in training or validation), its prompt and its credit."""

from __future__ import annotations

import random
import re

import pytest

from agentmerge.errors import ConfigError
from agentmerge.evaluation.bfcl import data as bfcl_data
from agentmerge.evaluation.bfcl.prompt import render_call
from agentmerge_zoo.real.bfcl_credit import (
    argument_share,
    called_names,
    credit,
    key_share,
    name_overlap,
    positional,
    scanned,
)
from agentmerge_zoo.real.skill_bfcl import HINT, TEST_CATEGORIES, BfclSkill, hinted, signature
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
    tests = eval_set(skill, "test", 4 * 400)
    non_live = {e.data["question"] for c in TEST_CATEGORIES for e in tests if e.data["category"] == c}
    assert len(non_live) > 800  # 1,000 items, some questions asked in two categories
    stream = train_stream(skill, 0, "agent")
    trained = [next(stream) for _ in range(300)]
    validation = eval_set(skill, "val", 64)
    for ex in trained + validation:
        assert ex.data["category"] not in TEST_CATEGORIES and ex.data["question"] not in non_live
        assert all(user.split("\n\n", 1)[1] not in non_live for user, _ in ex.shots)
    assert {e.data["category"] for e in trained} >= {"gen_simple", "gen_parallel", "live_simple", "live_multiple"}


def test_credit(skill: BfclSkill) -> None:
    examples = eval_set(skill, "test", 8) + eval_set(skill, "val", 8)
    for ex in examples:
        assert skill.score(ex, render_call(ex.data["ground_truth"])) == {"strict": 1.0, "partial": 1.0}
        assert skill.score(ex, "Sorry, I cannot do that.") == {"strict": 0.0, "partial": 0.0}
        assert skill.score(ex, "[no_such_function(x=1)]") == {"strict": 0.0, "partial": 0.1}
    simple = next(e for e in examples if e.data["category"] == "simple_python")
    ((name, args),) = simple.data["ground_truth"][0].items()
    assert skill.score(simple, f"[{name}()]")["partial"] == pytest.approx(0.1)  # right function, no arguments
    given = [k for k, v in args.items() if "" not in v]
    assert len(given) >= 2  # the first simple_python item has two arguments or more to give
    half = {k: (v[0] if k in given[: len(given) // 2] else "wrong") for k, v in args.items() if k in given}
    text = f"[{name}(" + ", ".join(f"{k}={v!r}" for k, v in half.items()) + ")]"
    assert skill.score(simple, text)["partial"] == pytest.approx(0.4 + 0.2 * (len(given) // 2) / len(given))


def test_credit_parts() -> None:
    assert name_overlap([{"f": {}}, {"g": {}}], [{"f": {}}]) == 0.5
    assert name_overlap([{"f": {}}, {"f": {}}], [{"f": {}}, {"f": {}}, {"h": {}}]) == pytest.approx(2 / 3)
    accepted = {"city": ["Paris", "paris"], "days": [3], "unit": ["", "celsius"]}
    assert argument_share({"city": "PARIS", "days": 3}, accepted) == 1.0  # BFCL's normalisation; unit optional
    assert argument_share({"city": "Rome", "days": 3, "unit": "kelvin"}, accepted) == 0.5
    assert argument_share({}, {"unit": [""]}) == 1.0
    assert key_share({"city": "Rome", "unit": "kelvin"}, accepted) == 0.5  # named: city; days missing
    assert key_share({}, {"unit": [""]}) == 1.0 and key_share({}, accepted) == 0.0
    schema = {"type": "dict", "required": [], "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    functions = [{"name": "f", "parameters": schema}, {"name": "g", "parameters": schema}]
    answer = [{"f": {"a": [1]}}, {"g": {"b": [2]}}]
    # parseable, both offered, names right, arguments a right and b wrong, not accepted
    assert credit("[f(a=1), g(b=3)]", functions, answer, "parallel") == pytest.approx(0.1 + 0.1 + 0.1 + 0.1 + 0.1)
    assert credit("[f(a=1)]", functions, answer, "parallel") == pytest.approx(0.1 + 0.1 + 0.05 + 0.05 + 0.1)
    # an empty call of the right function earns the parse alone (a positional argument is none to BFCL); one that
    # names its arguments earns the names too, even with wrong values
    simple = [{"f": {"a": [1]}}]
    assert credit("[f()]", functions, simple, "simple") == pytest.approx(0.1)
    for copied in ("[f(a)]", "[f(1)]", "[f(a, a=1)]", "[g(b=2), f(a)]", "f(a)"):  # positional: BFCL drops it
        assert positional(copied) and credit(copied, functions, simple, "simple") == 0.0
    for keyword in ("[f(a=g(1, 2))]", "[f(a=[h(1)])]", "[f(a=1)] as asked.", "not python (1"):
        assert not positional(keyword)
    assert credit("[f()]", functions, [{"f": {"a": ["", 1]}}], "simple") == pytest.approx(1.0)  # nothing to give
    assert credit("[f(a=2)]", functions, simple, "simple") == pytest.approx(0.4)
    assert credit("[f(a=1)]", functions, simple, "simple") == pytest.approx(1.0)
    # an answer that does not decode keeps the credit of its names and arguments (read by pattern), not the 0.1
    # of parseable nor BFCL's 0.4: writing arguments risks 0.5 at most, not everything
    assert credit("[f(a=1)] as asked.", functions, simple, "simple") == pytest.approx(0.1 + 0.1 + 0.1 + 0.2)
    assert credit("[f(a=1, b=2x)]", functions, answer, "parallel") == pytest.approx(0.1 + 0.05 + 0.05 + 0.1)
    assert credit("[f(a=1", functions, simple, "simple") == pytest.approx(0.1 + 0.1 + 0.1 + 0.2)  # cut off
    assert credit("[f(a=", functions, simple, "simple") == 0.0  # no value: not named, so no names either
    assert credit("I cannot help with that.", functions, simple, "simple") == 0.0
    assert scanned("[f(a=1, b='x, y'), g(c=[1, 2])] and more") == [{"f": {"a": 1, "b": "x, y"}}, {"g": {"c": [1, 2]}}]
    assert credit("[h(a=1)]", functions, answer, "parallel") == pytest.approx(0.1)
    assert credit("no call", functions, answer, "parallel") == 0.0
    # a call of a demonstration's function (never offered) earns nothing; an offered one shown too still counts
    assert credit("[h(a=1)]", functions, answer, "parallel", shown={"h"}) == 0.0
    assert credit("[f(a=1), h(b=2)]", functions, answer, "parallel", shown={"h"}) == 0.0
    assert credit("[f(a=1)]", functions, answer, "parallel", shown={"f", "h"}) == pytest.approx(0.4)


def test_copying_a_demonstration_earns_nothing(skill: BfclSkill) -> None:
    for ex in eval_set(skill, "test", 8):
        copied = ex.shots[0][1]  # the first demonstration's answer, word for word
        assert skill.score(ex, copied) == {"strict": 0.0, "partial": 0.0}


def test_prompt_is_bfcl_prompt_mode(skill: BfclSkill) -> None:
    ex = skill.sample(random.Random(0))
    messages = ex.messages()
    assert messages[0]["role"] == "system" and "[func_name1(params_name1=params_value1" in messages[0]["content"]
    assert all(f["name"] in messages[0]["content"] for f in ex.data["function"])
    assert [m["role"] for m in messages[1:]] == ["user", "assistant", "user", "assistant", "user"]
    assert messages[2]["content"].startswith("[") and messages[-1]["content"] == ex.user
    hint, question = ex.user.split("\n\n", 1)
    signatures = [f"{f['name']}({', '.join(f['parameters']['required'])})" for f in ex.data["function"]]
    assert hint == HINT + ", ".join(signatures) and question == ex.data["question"]
    for user, answer in ex.shots:  # each demonstration's hint names the functions its answer calls
        names = re.findall(r"([\w.]+)\(", user.split("\n\n", 1)[0].removeprefix(HINT))
        assert user.startswith(HINT) and called_names(answer) <= set(names)


def test_signature_lists_required_arguments_in_order() -> None:
    doc = {"name": "geo.area", "parameters": {"type": "dict", "properties": {}, "required": ["radius", "unit"]}}
    assert signature(doc) == "geo.area(radius, unit)"
    assert signature({"name": "now", "parameters": {"type": "dict", "properties": {}}}) == "now()"
    assert (
        hinted("Q?", [doc, {"name": "f", "parameters": {"required": ["x"]}}])
        == f"{HINT}geo.area(radius, unit), f(x)\n\nQ?"
    )
    assert bfcl_data.NON_LIVE_AST == TEST_CATEGORIES
