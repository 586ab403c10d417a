"""Splits: fixed evaluation sets, seeded training streams that never emit an evaluation prompt."""

from __future__ import annotations

from itertools import islice

from agentmerge_zoo.splits import eval_set, held_out_prompts, train_stream
from agentmerge_zoo.tasks import all_tasks


def test_eval_sets_are_fixed_distinct_and_disjoint() -> None:
    for task in all_tasks().values():
        val = eval_set(task, "val", 200)
        test = eval_set(task, "test", 1000)
        assert len(test) == 1000, task.name
        assert len({ex.prompt for ex in test}) == 1000
        assert [ex.prompt for ex in test] == [ex.prompt for ex in eval_set(task, "test", 1000)]
        assert not {ex.prompt for ex in val} & {ex.prompt for ex in test}, task.name


def test_train_stream_is_seeded_and_excludes_eval_prompts() -> None:
    code = all_tasks()["code"]
    exclude = frozenset(ex.prompt for ex in eval_set(code, "test", 1000))
    mix = {"code": 1.0}
    first = [ex.prompt for ex in islice(train_stream(mix, 0, "t", exclude), 2000)]
    again = [ex.prompt for ex in islice(train_stream(mix, 0, "t", exclude), 2000)]
    other = [ex.prompt for ex in islice(train_stream(mix, 1, "t", exclude), 2000)]
    assert first == again
    assert first != other
    assert not set(first) & exclude


def test_distractor_rate_corrupts_about_that_share() -> None:
    code = all_tasks()["code"]
    stream = train_stream({"code": 1.0}, 0, "t", frozenset(), {"code": 0.5})
    examples = list(islice(stream, 1000))
    wrong = sum(code.score(ex.prompt, ex.answer)["code.exact"] == 0.0 for ex in examples)
    assert 400 < wrong < 600


def test_held_out_prompts_cover_every_task() -> None:
    prompts = held_out_prompts(10, 20)
    tags = {p.split(":", 1)[0] for p in prompts}
    assert tags == {"code", "tool", "mem", "rev"}
