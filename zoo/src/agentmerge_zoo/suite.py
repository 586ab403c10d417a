"""The zoo suite as an agentmerge evaluator plug-in (entry point ``agentmerge.evaluators: zoo``).

``evaluate: zoo`` (or ``zoo:test``, ``zoo:validation``; default validation, the split to tune on) in a sweep
file, ``agentmerge eval CKPT ... --suite zoo`` on the command line: every checkpoint greedy-decoded on the
zoo's held-out prompts (``evaluate.evaluate``). The metrics are the suite's columns and ``agentic_avg``, their
mean over the trained domains (the default objective). Options (a sweep's ``evaluate_options``): ``n``
prompts per task (default 1000), ``tasks`` (default all), ``batch_size`` (default 250), and ``cache``, a
folder of evaluations keyed by the weights' sha256 (the bench's).

It stops early (a search's ``early_stop``, docs/search.md): the first ``first`` items are the first
``ceil(first / tasks)`` prompts of each task; a trial that goes on is then scored in full (``score``, cached when
``cache`` is set), so its first prompts are generated twice: the cost of going on is ``first / (n x tasks)`` of an
evaluation more.

This module is imported when a sweep file is read, so it imports nothing heavy; torch and transformers load
when a checkpoint is scored.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from agentmerge import ConfigError
from agentmerge.api import Context, Early, Evaluator, Score, check_report_path, set_threads

SPLITS = {"test": "test", "validation": "val"}  # a spec's split -> the suite's own name of it


class ZooEvaluator(Evaluator):
    """The zoo's held-out suite on one split; see the module docstring."""

    kind = "zoo"
    usage = "zoo"
    objective = "agentic_avg"
    options: ClassVar[Mapping[str, type]] = {"n": int, "tasks": list, "batch_size": int, "cache": str}
    stops_early = True

    def __init__(
        self,
        split: str = "validation",
        *,
        n: int | None = None,
        tasks: Sequence[str] | None = None,
        batch_size: int = 250,
        cache: str | Path | None = None,
        threads: int | None = None,
        quiet: bool = True,
    ) -> None:
        if split not in SPLITS:
            raise ConfigError(f"the zoo's splits are {' and '.join(SPLITS)} (got {split!r})")
        self.split, self.n, self.tasks, self.batch_size = split, n, list(tasks) if tasks else None, batch_size
        self.cache = Path(cache) if cache else None
        self.threads, self.quiet = threads, quiet

    @property
    def name(self) -> str:
        return f"zoo:{self.split}"

    def score(self, checkpoint: Path) -> Score:
        from agentmerge_zoo.evaluate import DEFAULT_N, agentic_average, evaluate, evaluate_cached

        set_threads(self.threads)
        split, n = SPLITS[self.split], self.n or DEFAULT_N
        if self.cache is not None:
            report = evaluate_cached(
                Path(checkpoint), split=split, n=n, tasks=self.tasks, batch_size=self.batch_size, cache=self.cache
            )[0]
        else:
            report = evaluate(
                checkpoint, split=split, n=n, tasks=self.tasks, batch_size=self.batch_size, quiet=self.quiet
            )
        metrics = {**report.metrics, "agentic_avg": agentic_average(report.metrics)}
        return Score(metrics, report.stderr, report.count, report.to_dict())

    def score_early(self, checkpoint: Path, first: int, stop: Callable[[Score], bool]) -> Early:
        """The first ``ceil(first / tasks)`` prompts of each task; unless ``stop``, the whole ``score``."""
        from agentmerge_zoo.evaluate import DEFAULT_N, agentic_average, evaluate
        from agentmerge_zoo.tasks import all_tasks

        names, n = self.tasks or list(all_tasks()), self.n or DEFAULT_N
        per_task, total = -(-first // len(names)), n * len(names)
        if per_task < n:
            set_threads(self.threads)
            report = evaluate(
                checkpoint, split=SPLITS[self.split], n=per_task, tasks=names, batch_size=self.batch_size, quiet=True
            )
            metrics = {**report.metrics, "agentic_avg": agentic_average(report.metrics)}
            prefix = Score(metrics, report.stderr, report.count, report.to_dict())
            if stop(prefix):
                return Early(prefix, True, per_task * len(names), total)
        return Early(self.score(checkpoint), False, total, total)

    @classmethod
    def check_spec(cls, spec: str, arg: str) -> None:
        if arg not in ("", *SPLITS):
            raise ConfigError(f"evaluate: {spec!r}: the zoo's splits are test and validation")

    @classmethod
    def from_spec(cls, arg: str, options: Mapping[str, Any], context: Context) -> ZooEvaluator:
        return cls(arg or "validation", **options, threads=context.threads, quiet=context.quiet)

    @classmethod
    def from_command(cls, args: argparse.Namespace) -> ZooEvaluator:
        """``eval --suite zoo``: ``--split`` (val, test), ``--n`` (default 1000 test, 300 val), ``--tasks`` (names),
        ``--batch-size``, ``--threads``; each checkpoint is checked to be a loadable causal LM first."""
        check_command(args)
        split = "validation" if args.split == "val" else args.split
        return cls(
            split,
            n=args.n or (1000 if split == "test" else 300),
            tasks=[t for t in args.tasks.split(",") if t] if args.tasks else None,
            batch_size=args.batch_size or 250,
            threads=args.threads or os.cpu_count() or 1,
            quiet=args.quiet,
        )


def check_command(args: argparse.Namespace) -> None:
    """Counts must be positive, and each checkpoint a loadable causal LM with a tokenizer (one-line errors)."""
    from agentmerge.api import check_causal_lm_folder, transformers_step

    for flag, value in (("--n", args.n), ("--batch-size", args.batch_size), ("--threads", args.threads)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} must be at least 1 (got {value})")
    if args.json_out:
        check_report_path(Path(args.json_out), "--json")
    for ckpt in args.checkpoints:
        check_causal_lm_folder(ckpt)

        def tokenizer(folder: str = ckpt) -> object:
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(str(folder))

        transformers_step(ckpt, "load its tokenizer", tokenizer)
