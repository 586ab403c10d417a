"""Score any checkpoint folder on the zoo suite: greedy decoding, batched, one metric per table column."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm
from transformers import AutoTokenizer

from agentmerge.errors import ConfigError
from agentmerge.userinput import did_you_mean
from agentmerge.zoo.generation import complete
from agentmerge.zoo.modeling import load_model
from agentmerge.zoo.quiet import quiet_transformers
from agentmerge.zoo.splits import eval_set
from agentmerge.zoo.tasks import all_tasks
from agentmerge.zoo.vocab import char_vocab

DEFAULT_N = 1000


@dataclass
class EvalReport:
    """Mean, standard error (over prompts) and count for each metric."""

    checkpoint: str
    split: str
    metrics: dict[str, float] = field(default_factory=dict)
    stderr: dict[str, float] = field(default_factory=dict)
    count: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "checkpoint": self.checkpoint,
            "split": self.split,
            "metrics": self.metrics,
            "stderr": self.stderr,
            "count": self.count,
            "seconds": round(self.seconds, 2),
        }


def mean_and_se(values: Sequence[float]) -> tuple[float, float]:
    """Sample mean and its standard error (0 for fewer than two values)."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def evaluate(
    checkpoint: str | Path,
    *,
    split: str = "test",
    n: int = DEFAULT_N,
    tasks: Sequence[str] | None = None,
    batch_size: int = 250,
    quiet: bool = False,
) -> EvalReport:
    """Greedy-decode every prompt of the chosen tasks and score the completions with the task verifiers."""
    quiet_transformers()
    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    if tokenizer.get_vocab() != char_vocab():
        raise ConfigError(
            f"{checkpoint}: not a zoo model (its tokenizer is not the zoo's character tokenizer), so the zoo suite "
            "would score it zero; evaluate it on your own tasks with --tasks FILE.jsonl (docs/evaluate.md)"
        )
    suite = all_tasks()
    names = list(tasks) if tasks is not None else list(suite)
    for name in names:
        if name not in suite:
            raise ConfigError(f"unknown zoo task {name!r}{did_you_mean(name, tuple(suite))}")
    model = load_model(checkpoint)
    report = EvalReport(str(checkpoint), split)
    for name in tqdm(names, desc=f"eval {Path(checkpoint).name}", disable=quiet, leave=False):
        task = suite[name]
        examples = eval_set(task, split, n)
        prompts = [ex.prompt for ex in examples]
        completions = complete(model, tokenizer, prompts, task.max_new_tokens, batch_size)
        scores = [task.score(p, c) for p, c in zip(prompts, completions, strict=True)]
        for metric in task.metrics:
            mean, se = mean_and_se([s[metric] for s in scores])
            report.metrics[metric], report.stderr[metric], report.count[metric] = mean, se, len(scores)
    report.seconds = time.perf_counter() - started
    return report
