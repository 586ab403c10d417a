"""The real zoo's verifiers on hostile completions (issue 42): no quadratic regex, no RecursionError.

The code checker's fence regex took 3-12 s on a fence followed by 60 k spaces (two ``[ \\t]*`` around an
optional word split the run every way); the tool-call parser let ``RecursionError`` out of the reward function
on ~1,000 nested brackets (the JSON decoder recurses once per bracket).
"""

from __future__ import annotations

import random
import re
import time

import pytest

from agentmerge_zoo.real.pysafe import extract_code
from agentmerge_zoo.real.skill_tool import ToolSkill, parse_call

OLD_FENCE = re.compile(r"```[ \t]*(?:python|py|Python)?[ \t]*\n(.*?)(?:```|\Z)", re.S)  # the reference semantics


@pytest.mark.parametrize("tail", ["x", "\t", "python", "py" + " " * 10, "\u00a0x"])
def test_a_fence_followed_by_a_long_run_of_spaces_is_linear(tail: str) -> None:
    text = "Sure:\n```" + " \t" * 30_000 + tail
    t0 = time.perf_counter()
    assert extract_code(text) == text  # no code block: the whole text
    assert time.perf_counter() - t0 < 0.2  # before: 3-12 s


def test_the_fence_regex_finds_what_it_found_before() -> None:
    """Against the old pattern (reference) on random texts of fences, language words, spaces and newlines."""
    rng = random.Random(0)
    parts = ["```", " ", "\t", "\n", "python", "py", "Python", "def f(x):", "return x", "`", "js"]
    for _ in range(3000):
        text = "".join(rng.choice(parts) for _ in range(rng.randrange(1, 14)))
        old = OLD_FENCE.search(text)
        assert extract_code(text) == (old.group(1) if old else text), repr(text)


@pytest.mark.parametrize("depth", [1_000, 5_000, 100_000])
@pytest.mark.parametrize("bracket", ["[", '{"a": ', '{"name": "x", "arguments": "'])
def test_deeply_nested_brackets_are_no_call(depth: int, bracket: str) -> None:
    if bracket.endswith('"'):  # the arguments string holds the deep JSON, decoded by a second json.loads
        text = bracket + "[" * depth + "]" * depth + '"}'
    else:
        text = bracket * depth
    t0 = time.perf_counter()
    assert parse_call(text) is None
    assert time.perf_counter() - t0 < 5


def test_the_reward_of_a_deeply_nested_completion_is_zero() -> None:
    skill = ToolSkill()
    example = skill.sample(random.Random(0))
    score = skill.score(example, "[" * 1_000 + "]" * 1_000)
    assert score["partial"] == 0.0 and score["strict"] == 0.0
