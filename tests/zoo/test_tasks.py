"""Task generators and verifiers: reference answers score 1, every kind of wrong answer is rejected."""

from __future__ import annotations

import random

import pytest

from agentmerge_zoo.taskbase import Task
from agentmerge_zoo.tasks import (
    SIX_DOMAINS,
    CodeTask,
    MathTask,
    MemoryTask,
    ReverseTask,
    SearchTask,
    SortTask,
    all_tasks,
    domain_tasks,
    metric_columns,
    training_task,
)
from agentmerge_zoo.tooluse import ToolTask, call_f1, parse_calls
from agentmerge_zoo.vocab import ALPHABET

TASKS = [*all_tasks(SIX_DOMAINS).values(), training_task("memory")]


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.name)
def test_reference_answer_scores_one(task: Task) -> None:
    rng = random.Random(0)
    for _ in range(200):
        ex = task.sample(rng)
        assert set(ex.prompt + ex.answer) <= set(ALPHABET), "all text must be in the tokenizer's alphabet"
        assert all(v == 1.0 for v in task.score(ex.prompt, ex.answer).values())
        assert task.reward(ex.prompt, ex.answer) == 1.0


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.name)
def test_wrong_answers_are_rejected(task: Task) -> None:
    rng = random.Random(1)
    for _ in range(200):
        ex = task.sample(rng)
        wrong = {"", ex.answer + "1", ex.answer[:-1], "x" + ex.answer, " " + ex.answer, ex.answer + " "}
        wrong.discard(ex.answer)
        for text in wrong:
            first = task.metrics[0]
            assert task.score(ex.prompt, text)[first] == 0.0, (ex, text)


DISTRACTED = [CodeTask(), ToolTask(), training_task("memory"), MathTask(), SortTask(), SearchTask()]


@pytest.mark.parametrize("task", DISTRACTED, ids=lambda t: t.name)
def test_distractor_is_scored_wrong(task: Task) -> None:
    rng = random.Random(2)
    checked = 0
    for _ in range(300):
        ex = task.sample(rng)
        wrong = task.distractor(task.body(ex.prompt), ex.answer)
        if wrong != ex.answer:
            checked += 1
            assert task.score(ex.prompt, wrong)[task.metrics[0]] == 0.0
    assert checked > 50


def test_code_partial_credit_decreases_with_error() -> None:
    task = CodeTask()
    prompt = "code:a=3;b=a+4;?b>"
    assert task.score(prompt, "7") == {"code.exact": 1.0, "code.partial": 1.0}
    assert task.score(prompt, "8") == {"code.exact": 0.0, "code.partial": 0.5}
    assert task.score(prompt, "17")["code.partial"] == pytest.approx(1 / 11)
    assert task.score(prompt, "seven") == {"code.exact": 0.0, "code.partial": 0.0}


def test_code_verifier_runs_the_program_not_the_stored_answer() -> None:
    assert CodeTask().score("code:a=2;b=a*3;c=b-a;?c>", "4")["code.exact"] == 1.0


def test_tool_parallel_calls_are_order_free_but_complete() -> None:
    task = ToolTask()
    prompt = "tool:call bob and weather rome mon and timer 5 min>"
    assert task.score(prompt, "[weather(rome,mon),timer(5),call(bob)]")["tool.exact"] == 1.0
    partial = task.score(prompt, "[call(bob)]")
    assert partial["tool.exact"] == 0.0
    assert partial["tool.f1"] == pytest.approx(0.5)
    assert task.score(prompt, "[call(bob),call(bob),weather(rome,mon),timer(5)]")["tool.exact"] == 0.0
    assert task.score(prompt, "[weather(mon,rome),timer(5),call(bob)]")["tool.exact"] == 0.0
    assert task.score(prompt, "call(bob),weather(rome,mon),timer(5)") == {"tool.exact": 0.0, "tool.f1": 0.0}


@pytest.mark.parametrize(
    ("phrase", "call"),
    [
        ("mon weather in rome", "weather(rome,mon)"),
        ("forecast oslo on fri", "weather(oslo,fri)"),
        ("send ok to ann", "send(ann,ok)"),
        ("tell eve soon", "send(eve,soon)"),
        ("set a 12 min timer", "timer(12)"),
        ("put on jazz", "play(jazz)"),
    ],
)
def test_tool_phrases_map_to_calls(phrase: str, call: str) -> None:
    assert ToolTask().expected_calls(f"tool:{phrase}>") == [call]


@pytest.mark.parametrize(
    ("text", "calls"),
    [
        ("[]", []),
        ("[call(bob)]", ["call(bob)"]),
        ("[call(bob),timer(5)]", ["call(bob)", "timer(5)"]),
        ("[call()]", ["call()"]),
        ("call(bob)", None),
        ("[call(bob),]", None),
        ("[call(bob)timer(5)]", None),
        ("[call(bob,)]", None),
        ("[call(bob]", None),
        ("[Call(bob)]", None),
    ],
)
def test_parse_calls(text: str, calls: list[str] | None) -> None:
    assert parse_calls(text) == calls


def test_call_f1() -> None:
    assert call_f1([], []) == 1.0
    assert call_f1(["a()"], []) == 0.0
    assert call_f1(["a()", "b()"], ["a()"]) == pytest.approx(2 / 3)


def test_memory_lengths_and_lookup() -> None:
    rng = random.Random(3)
    short, long = all_tasks()["mem_short"], all_tasks()["mem_long"]
    assert isinstance(short, MemoryTask)
    assert isinstance(long, MemoryTask)
    assert len(MemoryTask.parse(short.body(short.sample(rng).prompt))[0]) == 4
    assert len(MemoryTask.parse(long.body(long.sample(rng).prompt))[0]) == 12
    assert short.score("mem:qwkz?1", "z") == {"memory.short": 1.0}
    assert short.score("mem:qwkz?3", "w") == {"memory.short": 1.0}
    assert short.score("mem:qwkz?3", "k") == {"memory.short": 0.0}
    assert short.score("mem:qwkz?3", "W") == {"memory.short": 0.0}
    for bad in ("mem:qwkz?", "mem:qwkz?5", "mem:qwkz?0", "mem:qwkz", "mem:?1", "mem:qw1z?1", "mem:qwkz?a"):
        with pytest.raises(ValueError):
            short.score(bad, "q")


def test_reverse_scores() -> None:
    task = ReverseTask()
    assert task.score("rev:abcd>", "dcba") == {"reverse.exact": 1.0, "reverse.char": 1.0}
    assert task.score("rev:abcd>", "dcbx") == {"reverse.exact": 0.0, "reverse.char": 0.75}
    assert task.score("rev:abcd>", "abcd")["reverse.exact"] == 0.0
    assert task.score("rev:abcd>", "")["reverse.char"] == 0.0


def test_metric_columns_order() -> None:
    assert metric_columns() == [
        "code.exact",
        "code.partial",
        "tool.exact",
        "tool.f1",
        "memory.short",
        "memory.long",
        "reverse.exact",
        "reverse.char",
    ]


def test_body_refuses_foreign_prompts() -> None:
    with pytest.raises(ValueError):
        CodeTask().body("tool:call bob>")


def test_six_domain_suite_extends_the_core_one() -> None:
    core, six = list(all_tasks()), list(all_tasks(SIX_DOMAINS))
    assert core == ["code", "tool", "mem_short", "mem_long", "reverse"]
    assert six == ["code", "tool", "mem_short", "mem_long", "math", "sort", "search", "reverse"]
    assert metric_columns(SIX_DOMAINS)[:6] == metric_columns()[:6]
    assert {t.tag for t in all_tasks(SIX_DOMAINS).values()} == {"code", "tool", "mem", "add", "sort", "max", "rev"}
    assert domain_tasks("memory") == ("mem_short", "mem_long") and domain_tasks("search") == ("search",)
    with pytest.raises(KeyError, match="unknown domain"):
        all_tasks(("code", "poetry"))


def test_math_sort_search_verify_from_the_prompt() -> None:
    assert MathTask().score("add:3+7+2+9>", "21") == {"math.exact": 1.0, "math.partial": 1.0}
    assert MathTask().score("add:3+7+2+9>", "19") == {"math.exact": 0.0, "math.partial": 1.0 / 3.0}
    assert MathTask().distractor("3+7+2+9", "21") == "12"  # the last term dropped
    assert SortTask().score("sort:qdkz>", "dkqz") == {"sort.exact": 1.0, "sort.char": 1.0}
    assert SortTask().score("sort:qdkz>", "dkzq") == {"sort.exact": 0.0, "sort.char": 0.5}
    assert SortTask().distractor("qdka", "adkq") == "dkqa"  # the last letter left at the end
    assert SearchTask().score("max:31,7,58,12>", "58") == {"search.exact": 1.0}
    assert SearchTask().score("max:31,7,58,12>", "31") == {"search.exact": 0.0}
    assert SearchTask().distractor("31,7,58,12", "58") == "31"  # the runner-up
    for task, prompt in ((MathTask(), "add:3+x>"), (SearchTask(), "max:3;4>"), (SortTask(), "sort:ab1>")):
        with pytest.raises(ValueError):
            task.score(prompt, "1")
