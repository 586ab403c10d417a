"""Train / validation / test data of the zoo, drawn from disjoint random streams.

Validation and test sets are fixed per task (they do not depend on the pipeline seed, so every seed is scored on
the same prompts). Training examples come from a stream seeded by the pipeline seed and the stage, and skip any
prompt that occurs in a validation or test set, so no evaluated prompt is ever trained on.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from agentmerge.zoo.tasks import Example, Task, all_tasks, training_task

EVAL_SPLITS = ("val", "test")


def split_rng(split: str, task: str, seed: int = 0) -> random.Random:
    """A random stream that is unique to (split, task, seed); string seeds are hashed stably by Python."""
    return random.Random(f"agentmerge-zoo/{split}/{task}/{seed}")


def eval_set(task: Task, split: str, n: int) -> list[Example]:
    """The first ``n`` distinct prompts of a task's fixed validation or test stream."""
    if split not in EVAL_SPLITS:
        raise ValueError(f"split must be one of {EVAL_SPLITS}, got {split!r}")
    rng = split_rng(split, task.name)
    seen: set[str] = set()
    out: list[Example] = []
    for _ in range(n * 50):
        ex = task.sample(rng)
        if ex.prompt not in seen:
            seen.add(ex.prompt)
            out.append(ex)
            if len(out) == n:
                return out
    return out  # small prompt spaces (tiny smoke configs) may give fewer distinct prompts


def held_out_prompts(n_val: int, n_test: int) -> frozenset[str]:
    """Every validation and test prompt of the suite: training streams must never emit one."""
    prompts: set[str] = set()
    for task in all_tasks().values():
        prompts.update(ex.prompt for ex in eval_set(task, "val", n_val))
        prompts.update(ex.prompt for ex in eval_set(task, "test", n_test))
    return frozenset(prompts)


def train_stream(
    domains: dict[str, float], seed: int, stage: str, exclude: frozenset[str]
) -> Iterator[Example]:
    """Endless training examples from a weighted mixture of domains, skipping excluded prompts."""
    rng = split_rng("train", stage, seed)
    tasks = [training_task(domain) for domain in domains]
    weights = list(domains.values())
    while True:
        task = rng.choices(tasks, weights=weights, k=1)[0]
        ex = task.sample(rng)
        if ex.prompt not in exclude:
            yield ex
