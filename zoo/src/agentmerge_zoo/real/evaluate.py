"""Score a checkpoint on the real zoo's skills: greedy completions in the chat template, mean ± SE per skill.

A checkpoint is run in its own dtype (bf16 here): what a user who loads it gets, and about a third cheaper than
upcasting to float32 on a CPU with native bfloat16 (measured: 0.82 vs 1.28 CPU seconds per memory prompt). On a CPU
without it (AVX2 only, e.g. the AMD EPYC of session 15) bfloat16 is emulated and a forward pass costs 7.9 times
float32's (``benchmarks/bf16_cpu_cost.py``), so ``dtype="float32"`` computes in float32 instead (a different
rounding, so greedy answers can differ: its reports are cached apart, and only reports of one dtype are ever
compared).

:func:`evaluate_cached` keeps each report under a key of the weights' sha256, the split, the prompt count, the
skills and ``SKILLS_VERSION``, so a checkpoint is scored once whoever asks (the runner, the convergence check or
a sweep trial).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentmerge.api import dumps_json
from agentmerge_zoo.evaluate import cache_key, file_digest
from agentmerge_zoo.real.sampling import greedy, prompt_ids
from agentmerge_zoo.real.suite import skill
from agentmerge_zoo.real.tasks import SKILLS_VERSION, eval_set

Report = dict[str, dict[str, Any]]  # skill -> {strict, strict_se, partial, n, values: per-prompt strict}
DTYPES = ("auto", "float32")  # the compute dtype: the checkpoint's own, or float32


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (0 for fewer than two values)."""
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    return mean, math.sqrt(var / n)


def score_model(
    model: Any, tokenizer: Any, skills: Sequence[str], split: str, n: int, batch: int = 16, samples: int = 0
) -> tuple[Report, dict[str, list[str]]]:
    """Scores per skill and the first ``samples`` completions of each."""
    report: Report = {}
    shown: dict[str, list[str]] = {}
    for name in skills:
        task = skill(name)
        examples = eval_set(task, split, n)
        ids = [prompt_ids(tokenizer, ex.messages()) for ex in examples]
        texts = greedy(model, tokenizer, ids, task.max_new_tokens, batch)
        scores = [task.score(ex, text) for ex, text in zip(examples, texts, strict=True)]
        strict, se = mean_se([s["strict"] for s in scores])
        partial, _ = mean_se([s["partial"] for s in scores])
        values = [s["strict"] for s in scores]
        report[name] = {"strict": strict, "strict_se": se, "partial": partial, "n": len(scores), "values": values}
        shown[name] = texts[:samples]
    return report, shown


def evaluate(folder: Path, skills: Sequence[str], split: str, n: int, batch: int = 16, dtype: str = "auto") -> Report:
    """Scores of a checkpoint folder, computed in its own dtype (bf16 for the zoo's agents and merges) or in
    ``dtype``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype not in DTYPES:
        raise ValueError(f"compute dtype {dtype!r}: one of {', '.join(DTYPES)}")
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model: Any = AutoModelForCausalLM.from_pretrained(str(folder), dtype=getattr(torch, dtype, "auto"))
    model.eval()
    return score_model(model, tokenizer, skills, split, n, batch)[0]


def evaluate_cached(
    folder: Path, skills: Sequence[str], split: str, n: int, cache: Path | None, dtype: str = "auto"
) -> Report:
    """:func:`evaluate`, or its report from ``cache`` (written whole: a temporary file renamed)."""
    if cache is None:
        return evaluate(folder, skills, split, n, dtype=dtype)
    computed = () if dtype == "auto" else (dtype,)  # the checkpoint's own dtype keeps the keys it always had
    key = cache_key(file_digest(folder), split, n, sorted(skills), SKILLS_VERSION, *computed)
    target = cache / f"{key}.json"
    if target.is_file():
        data: Report = json.loads(target.read_text())["report"]
        return data
    started = time.perf_counter()
    report = evaluate(folder, skills, split, n, dtype=dtype)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    record = {"checkpoint": str(folder), "split": split, "n": n, "dtype": dtype}
    record["seconds"] = time.perf_counter() - started
    tmp.write_text(dumps_json(record | {"report": report}, indent=1) + "\n")
    tmp.replace(target)
    return report
