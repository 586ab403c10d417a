"""The real zoo's skills: verifiers (tool-call parsing and partial credit, code, memory, capitals) and splits."""

from __future__ import annotations

import random
import re

import pytest

from agentmerge_zoo.real.skill_code import FAMILIES, CodeSkill
from agentmerge_zoo.real.skill_heldout import CapitalsSkill
from agentmerge_zoo.real.skill_memory import MemorySkill
from agentmerge_zoo.real.skill_tool import TOOLS, ToolSkill, parse_call, score_call
from agentmerge_zoo.real.suite import SKILLS
from agentmerge_zoo.real.tasks import Example, eval_set, split_of, train_stream

CALL = {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}',
        'Sure. ```json\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n```',
        '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]</tool_call>',
        '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}',
        '{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\", \\"unit\\": \\"celsius\\"}"}',
        '{"city": 1} then {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}} {"name": "x"}',
    ],
)
def test_parse_call_finds_the_call(text: str) -> None:
    assert parse_call(text) == CALL


@pytest.mark.parametrize("text", ["", "get_weather(Paris)", '{"name": 3}', "[1, 2]", '{"name": "a", "arguments": "x"}'])
def test_parse_call_refuses_what_is_not_a_call(text: str) -> None:
    assert parse_call(text) is None


@pytest.mark.parametrize(
    ("call", "strict", "partial"),
    [
        (None, 0.0, 0.0),  # no call found
        ({"name": "set_alarm", "arguments": {"city": "Paris", "unit": "celsius"}}, 0.0, 0.2),  # wrong tool
        ({"name": "get_weather", "arguments": {}}, 0.0, 0.5),  # right tool, no argument
        ({"name": "get_weather", "arguments": {"city": "paris!"}}, 0.0, 0.75),  # one of two, normalised
        ({"name": "get_weather", "arguments": {"city": "Paris", "unit": "Celsius"}}, 1.0, 1.0),
        ({"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius", "days": 3}}, 0.0, 0.5 + 0.5 * 2 / 3),
        ({"name": "get_weather", "arguments": {"city": "Rome", "unit": "celsius"}}, 0.0, 0.75),
    ],
)
def test_tool_partial_credit_rules(call: dict[str, object] | None, strict: float, partial: float) -> None:
    score = score_call(call, "get_weather", {"city": "Paris", "unit": "celsius"})
    assert score["strict"] == strict
    assert score["partial"] == pytest.approx(partial)


def test_numbers_match_numerically() -> None:
    args = {"amount": 250, "from_currency": "USD", "to_currency": "EUR"}
    got = {"name": "convert_currency", "arguments": {"amount": "250.0", "from_currency": "usd", "to_currency": "EUR"}}
    assert score_call(got, "convert_currency", args)["strict"] == 1.0
    got["arguments"]["amount"] = "two hundred fifty"  # type: ignore[index]
    assert score_call(got, "convert_currency", args)["strict"] == 0.0


def test_tool_prompt_lists_the_right_tool_and_its_gold_call_scores_one() -> None:
    skill, rng = ToolSkill(), random.Random(3)
    for _ in range(50):
        ex = skill.sample(rng)
        assert f"- {ex.data['name']}(" in str(ex.system)
        assert len(ex.shots) == skill.shots
        gold = {"name": ex.data["name"], "arguments": ex.data["arguments"]}
        import json

        assert skill.score(ex, json.dumps(gold)) == {"strict": 1.0, "partial": 1.0}
        assert ex.data["name"] in TOOLS


# One correct solution per code family, keyed by a pattern of its spec (the families must be solvable in the subset).
SOLUTIONS = [
    (r"multiplied by (\d+), plus (\d+), or 0", "def f(x):\n    return {0} * x + {1} if x >= 0 else 0"),
    (r"square of x minus (\d+) when x is even", "def f(x):\n    return x * x - {0} if x % 2 == 0 else x + {0}"),
    (
        r"sum of the numbers in the list xs that are greater than (\d+)",
        "def f(xs):\n    return sum(x for x in xs if x > {0})",
    ),
    (
        r"how many numbers in the list xs are divisible by (\d+)",
        "def f(xs):\n    return len([x for x in xs if x % {0} == 0])",
    ),
    (r"less than (\d+), in order", "def f(xs):\n    return [x for x in xs if x < {0}]"),
    (r'the letter "(\w)" appears', "def f(s):\n    return s.count('{0}')"),
    (r"integers from (\d+) to n inclusive", "def f(n):\n    return sum(range({0}, n + 1))"),
    (r"divisible by (\d+) but not by (\d+)", "def f(n):\n    return n % {0} == 0 and n % {1} != 0"),
    (
        r"squares of the (odd|even) numbers",
        "def f(xs):\n    return sum(x * x for x in xs if x % 2 == (1 if '{0}' == 'odd' else 0))",
    ),
    (
        r"larger than the number just before",
        "def f(xs):\n    return sum(1 for i in range(1, len(xs)) if xs[i] > xs[i - 1])",
    ),
    (
        r"index of the first number in the list xs that is greater than (\d+)",
        "def f(xs):\n    for i, x in enumerate(xs):\n        if x > {0}:\n            return i\n    return -1",
    ),
    (
        r"running totals",
        "def f(xs):\n    out = []\n    t = 0\n    for x in xs:\n        t += x\n        out.append(t)\n    return out",
    ),
    (
        r"decimal digits of the non-negative integer n, plus (\d+)",
        "def f(n):\n    return sum(int(c) for c in str(n)) + {0}",
    ),
    (r"more than (\d+) letters", "def f(s):\n    return len([w for w in s.split() if len(w) > {0}])"),
    (r'replaced by "(.)"', "def f(s):\n    return ''.join('{0}' if c in 'aeiou' else c for c in s)"),
    (
        r"below (-?\d+) replaced by -?\d+ and every number above (\d+)",
        "def f(xs):\n    return [min(max(x, {0}), {1}) for x in xs]",
    ),
]


def test_every_code_family_is_solvable_and_wrong_code_fails() -> None:
    skill, rng = CodeSkill(), random.Random(0)
    solved: set[str] = set()
    for _ in range(600):
        ex = skill.sample(rng)
        pattern, template = next((p, t) for p, t in SOLUTIONS if re.search(p, ex.user))
        source = template.format(*re.search(pattern, ex.user).groups())  # type: ignore[union-attr]
        assert skill.score(ex, f"```python\n{source}\n```") == {"strict": 1.0, "partial": 1.0}, (ex.user, source)
        assert skill.score(ex, "```python\ndef f(x):\n    return None\n```")["strict"] == 0.0
        solved.add(pattern)
    assert len(solved) == len(SOLUTIONS) == len(FAMILIES)


def test_code_partial_credit_counts_hidden_inputs() -> None:
    ex = Example("code", "Write f.", {"tests": [[[1], 2], [[2], 4], [[3], 7], [[4], 9]]})
    assert CodeSkill().score(ex, "def f(x):\n    return 2 * x") == {"strict": 0.0, "partial": 0.5}


def test_memory_answer_must_be_the_asked_value_alone() -> None:
    skill, rng = MemorySkill(), random.Random(1)
    for _ in range(30):
        ex = skill.sample(rng)
        answer, others = ex.data["answer"], ex.data["others"]
        assert "- " in ex.user and ex.user.count("\n- ") + 1 >= skill.n_facts[0]
        assert skill.score(ex, f"It is {answer}.")["strict"] == 1.0
        if others:
            assert skill.score(ex, f"{answer} or {others[0]}")["strict"] == 0.0
            assert skill.score(ex, others[0])["strict"] == 0.0
    assert skill.score(Example("memory", "q", {"answer": "4821", "others": ["4822"]}), "code 48211")["strict"] == 0.0


def test_capitals_verifier() -> None:
    skill = CapitalsSkill()
    assert skill.score(Example("capitals", "q", {"answer": "Mexico City"}), "It is Mexico City.")["strict"] == 1.0
    assert skill.score(Example("capitals", "q", {"answer": "Paris"}), "Paris, not Rome")["strict"] == 0.0
    assert skill.score(Example("capitals", "q", {"answer": "Paris"}), "The capital is paris")["strict"] == 1.0


@pytest.mark.parametrize("name", sorted(SKILLS))
def test_splits_are_disjoint_fixed_and_large_enough(name: str) -> None:
    skill = SKILLS[name]
    val, test = eval_set(skill, "val", 96), eval_set(skill, "test", 128)
    assert {ex.user for ex in val}.isdisjoint(ex.user for ex in test)
    assert all(split_of(ex) == "val" for ex in val)
    fixed = getattr(skill, "fixed_set", None) is not None  # bfcl: the test is BFCL non-live, not a hash bucket
    assert fixed or all(split_of(ex) == "test" for ex in test)
    assert [ex.user for ex in eval_set(skill, "test", 128)] == [ex.user for ex in test]  # fixed
    held = {ex.user for ex in val} | {ex.user for ex in test}
    stream = train_stream(skill, 0, "t")
    drawn = [next(stream) for _ in range(300)]
    assert all(ex.user not in held and split_of(ex) == "train" for ex in drawn)
    other = train_stream(skill, 1, "t")
    assert [ex.user for ex in drawn[:20]] != [next(other).user for _ in range(20)]  # seeded by the pipeline seed


def test_eval_set_refuses_an_impossible_size() -> None:
    with pytest.raises(ValueError):
        eval_set(CapitalsSkill(), "test", 10_000)


def test_seed_cost_adds_up_the_documented_formulas() -> None:
    from agentmerge_zoo.real.budget import seed_cost
    from agentmerge_zoo.real.config import RealConfig

    cfg = RealConfig()
    e = {"tool": 1.0, "code": 2.0, "memory": 3.0, "capitals": 0.5}
    measured = {
        "eval": {k: {"cpu_per_prompt": v} for k, v in e.items()},
        "grpo": {k: {"mean": {"cpu_seconds": 10.0}} for k in ("tool", "code", "memory")},
    }
    cost = seed_cost(cfg, measured, methods=5, scaled=2, merge_seconds=1.0, cores=2, efficiency=0.5)
    p = cfg.bench
    assert cost["agents"] == 10.0 * sum(r.steps for r in cfg.recipes)
    one_test = p.n_test * (1 + 2 + 3 + 0.5)
    assert cost["test"] == (5 + 2) * (one_test + 1.0)
    assert cost["tuning"] == 2 * len(p.grid) * (p.n_val * 6 + 1.0)
    pairs = sum(p.n_test * (a + b + 0.5) + 1.0 for a, b in ((1, 2), (1, 3), (2, 3)))
    assert cost["pairs"] == len(p.pair_methods) * pairs
    stages = ("agents", "check", "tuning", "test", "pairs", "dilution", "fisher")
    assert cost["total"] == sum(cost[s] for s in stages)
    assert cost["wall_hours"] == cost["total"] / 3600
