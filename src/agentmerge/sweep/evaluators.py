"""How a sweep scores a merged folder: the ``evaluate`` spec of its file, through ``evaluation.evaluator``.

- ``tasks:FILE.jsonl``: the user's own task file (docs/evaluate.md), greedy in the chat template; metrics
  ``tasks.<task>`` (share right) and ``tasks_avg``, their mean (the default objective). A relative FILE is
  looked up in the sweep file's folder first.
- ``lm-eval:T1,T2``: lm-evaluation-harness tasks; metrics named ``task.metric``.
- ``python:MODULE:FUNCTION``: ``FUNCTION(path_to_merged_folder)`` returns ``{metric: float}``; MODULE is
  imported from the sweep file's folder, the current folder or the installed packages.
- a plug-in's kind (``plugins.EVALUATORS``), e.g. the agent zoo's ``zoo`` (``zoo:test``, ``zoo:validation``;
  its options: ``n``, ``tasks``, ``batch_size``, ``cache``; docs/zoo.md).

The spec and ``evaluate_options`` are checked when the sweep file is read; the user's own inputs (a task file)
are read and checked before any trial (``check_before_trials``); the evaluator itself (a task file read, a
module imported) is made in each trial, after its merge.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentmerge.evaluation.evaluator import Context, Early, Score, checked_metrics
from agentmerge.evaluation.kinds import parse

Scorer = Callable[[Path], dict[str, float]]

__all__ = [
    "Scorer",
    "check_before_trials",
    "check_options",
    "default_objective",
    "parse",
    "resolve",
    "resolve_early",
    "resolve_score",
]


def default_objective(spec: str) -> str | None:
    """The metric a sweep ranks by when the file names none (None: the only metric, whatever it is)."""
    return parse(spec)[0].objective


def check_options(spec: str, options: Mapping[str, Any]) -> None:
    """The evaluator's options must be ones it takes, of the right type."""
    parse(spec)[0].check_options(options)


def resolve(
    spec: str, search_path: Sequence[str] = (), threads: int = 1, options: Mapping[str, Any] | None = None
) -> Scorer:
    """The evaluator ``spec`` names with its ``options`` (checked by :func:`check_options`): folder -> metrics."""
    score = resolve_score(spec, search_path, threads, options)
    return lambda folder: score(folder).metrics


def resolve_score(
    spec: str, search_path: Sequence[str] = (), threads: int = 1, options: Mapping[str, Any] | None = None
) -> Callable[[Path], Score]:
    """As :func:`resolve`, but the whole ``Score`` (metrics checked, and their errors and counts where known)."""
    cls, arg = parse(spec)
    evaluator = cls.from_spec(arg, dict(options or {}), Context(tuple(search_path), threads))

    def score(folder: Path) -> Score:
        return _checked(evaluator.score(folder), evaluator.name)

    return score


def resolve_early(
    spec: str, search_path: Sequence[str] = (), threads: int = 1, options: Mapping[str, Any] | None = None
) -> Callable[[Path, int, Callable[[Score], bool]], Early]:
    """As :func:`resolve_score`, for ``Evaluator.score_early``: (folder, first, stop) -> ``Early``, its score's
    metrics checked (a search's ``early_stop``)."""
    cls, arg = parse(spec)
    evaluator = cls.from_spec(arg, dict(options or {}), Context(tuple(search_path), threads))

    def score(folder: Path, first: int, stop: Callable[[Score], bool]) -> Early:
        early = evaluator.score_early(folder, first, stop)
        return replace(early, score=_checked(early.score, evaluator.name))

    return score


def _checked(s: Score, name: str) -> Score:
    stderr = {k: float(v) for k, v in s.stderr.items() if isinstance(v, int | float) and math.isfinite(v)}
    return Score(checked_metrics(s.metrics, f"evaluate: {name}"), stderr, s.count)


def check_before_trials(spec: str, search_path: Sequence[str] = (), cluster: bool = False) -> None:
    """Read and check the evaluator's own inputs (``Evaluator.check_inputs``: a task file) before any trial.

    On a cluster a file this machine lacks is left to the nodes' check (``cluster.check_nodes``).
    """
    cls, arg = parse(spec)
    cls.check_inputs(arg, search_path, required=not cluster)
