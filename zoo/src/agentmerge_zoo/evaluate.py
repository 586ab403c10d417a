"""Score any checkpoint folder on the zoo suite: greedy decoding, batched, one metric per table column.

:func:`evaluate_cached` keeps each report in a cache folder under a key of the weights' sha256, the split, the
prompt count, the tasks and the suite version, so a checkpoint scored once (by the bench, or by a sweep's
trial wherever its folder lies) is not scored again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm
from transformers import AutoTokenizer

from agentmerge import ConfigError
from agentmerge.api import did_you_mean, dumps_json, quiet_transformers, transformers_step
from agentmerge_zoo.generation import complete
from agentmerge_zoo.modeling import load_model
from agentmerge_zoo.splits import eval_set
from agentmerge_zoo.tasks import SIX_DOMAINS, SUITE_VERSION, all_tasks
from agentmerge_zoo.vocab import char_vocab

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

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvalReport:
        return cls(data["checkpoint"], data["split"], data["metrics"], data["stderr"], data["count"], data["seconds"])

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
    tokenizer = transformers_step(
        checkpoint, "load its tokenizer", lambda: AutoTokenizer.from_pretrained(str(checkpoint))
    )
    if tokenizer.get_vocab() != char_vocab():
        raise ConfigError(
            f"{checkpoint}: not a zoo model (its tokenizer is not the zoo's character tokenizer), so the zoo suite "
            "would score it zero; evaluate it on your own tasks with --tasks FILE.jsonl (docs/evaluate.md)"
        )
    suite = all_tasks(SIX_DOMAINS)  # every task can be asked for by name; the default is the core suite
    names = list(tasks) if tasks is not None else list(all_tasks())
    for name in names:
        if name not in suite:
            raise ConfigError(f"unknown zoo task {name!r}{did_you_mean(name, tuple(suite))}")
    model = transformers_step(checkpoint, "load it as a zoo model", lambda: load_model(checkpoint))
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


def agentic_average(metrics: dict[str, float]) -> float:
    """Mean of the trained-domain metrics (code, tool, memory); held-out columns are not in it."""
    values = [v for k, v in metrics.items() if not k.startswith("reverse.")]
    return sum(values) / len(values)


def file_digest(path: Path) -> str:
    """sha256 of a checkpoint's weight files, in name order (cache key of everything computed from it)."""
    digest = hashlib.sha256()
    files = sorted(path.glob("*.safetensors")) or [path / "model.safetensors"]
    for file in files:
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def cache_key(*parts: Any) -> str:
    return hashlib.sha256(dumps_json(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def evaluate_cached(
    checkpoint: Path,
    *,
    split: str,
    n: int,
    tasks: Sequence[str] | None,
    batch_size: int,
    cache: Path | None,
    label: str | None = None,
) -> tuple[EvalReport, bool]:
    """:func:`evaluate`, or its report from ``cache`` (``LABEL.SPLIT.KEY.json``, any label); True if cached.

    The report is written whole (a temporary file renamed), so a process killed meanwhile leaves no torn file.
    """
    names = list(tasks) if tasks else list(all_tasks())
    if cache is None:
        report = evaluate(checkpoint, split=split, n=n, tasks=names, batch_size=batch_size, quiet=True)
        return report, False
    key = cache_key(file_digest(checkpoint), split, n, names, SUITE_VERSION)
    for hit in sorted(cache.glob(f"*.{split}.{key}.json")):
        with contextlib.suppress(ValueError, KeyError, TypeError):
            return EvalReport.from_dict(json.loads(hit.read_text())), True
    report = evaluate(checkpoint, split=split, n=n, tasks=names, batch_size=batch_size, quiet=True)
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / f"{label or checkpoint.name}.{split}.{key}.json"
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(dumps_json(report.to_dict(), indent=1) + "\n")
    tmp.replace(target)
    return report, False
