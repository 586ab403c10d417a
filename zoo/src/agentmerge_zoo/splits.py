"""Train / validation / test data of the zoo, drawn from disjoint random streams.

Validation and test sets are fixed per task (they do not depend on the pipeline seed, so every seed is scored on
the same prompts). Training examples come from a stream seeded by the pipeline seed and the stage, and skip any
prompt that occurs in a validation or test set, so no evaluated prompt is ever trained on.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from agentmerge_zoo.taskbase import Example, Task
from agentmerge_zoo.tasks import CORE_DOMAINS, all_tasks, training_task

EVAL_SPLITS = ("val", "test")
TEST_RESERVE = 1000  # validation never uses one of the first TEST_RESERVE test prompts


def split_rng(split: str, task: str, seed: int = 0) -> random.Random:
    """A random stream that is unique to (split, task, seed); string seeds are hashed stably by Python."""
    return random.Random(f"agentmerge-zoo/{split}/{task}/{seed}")


def eval_set(task: Task, split: str, n: int) -> list[Example]:
    """The first ``n`` distinct prompts of a task's fixed validation or test stream.

    Validation skips the task's first ``TEST_RESERVE`` test prompts, so the two sets are disjoint.
    """
    if split not in EVAL_SPLITS:
        raise ValueError(f"split must be one of {EVAL_SPLITS}, got {split!r}")
    avoid = _reserved_test_prompts(task) if split == "val" else frozenset()
    return _draw(task, split, n, avoid)


_RESERVED: dict[str, frozenset[str]] = {}


def _reserved_test_prompts(task: Task) -> frozenset[str]:
    if task.name not in _RESERVED:
        _RESERVED[task.name] = frozenset(ex.prompt for ex in _draw(task, "test", TEST_RESERVE, frozenset()))
    return _RESERVED[task.name]


def _draw(task: Task, split: str, n: int, avoid: frozenset[str]) -> list[Example]:
    rng = split_rng(split, task.name)
    seen: set[str] = set()
    out: list[Example] = []
    for _ in range(n * 50):
        ex = task.sample(rng)
        if ex.prompt not in seen and ex.prompt not in avoid:
            seen.add(ex.prompt)
            out.append(ex)
            if len(out) == n:
                break
    return out


def held_out_prompts(n_val: int, n_test: int, domains: tuple[str, ...] = CORE_DOMAINS) -> frozenset[str]:
    """Every validation and test prompt of the suite: training streams must never emit one."""
    prompts: set[str] = set()
    for task in all_tasks(domains).values():
        prompts.update(ex.prompt for ex in eval_set(task, "val", n_val))
        prompts.update(ex.prompt for ex in eval_set(task, "test", n_test))
    return frozenset(prompts)


def train_stream(
    domains: dict[str, float],
    seed: int,
    stage: str,
    exclude: frozenset[str],
    distractor_rate: dict[str, float] | None = None,
) -> Iterator[Example]:
    """Endless training examples from a weighted mixture of domains, skipping excluded prompts.

    With ``distractor_rate[domain] = q`` a fraction q of that domain's answers is replaced by the task's
    distractor (a plausible wrong habit), so a model trained on the stream knows the right behaviour but does
    not reliably prefer it.
    """
    rng = split_rng("train", stage, seed)
    tasks = [training_task(domain) for domain in domains]
    weights = list(domains.values())
    rates = distractor_rate or {}
    while True:
        index = rng.choices(range(len(tasks)), weights=weights, k=1)[0]
        task, rate = tasks[index], rates.get(list(domains)[index], 0.0)
        ex = task.sample(rng)
        if ex.prompt in exclude:
            continue
        if rate > 0 and rng.random() < rate:
            ex = Example(ex.task, ex.prompt, task.distractor(task.body(ex.prompt), ex.answer))
        yield ex
