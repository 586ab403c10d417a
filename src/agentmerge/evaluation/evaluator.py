"""One interface for every way of scoring a checkpoint: ``Evaluator``.

An evaluator turns a model folder into a ``Score``: named metrics, each a number where **higher is better**
(a share of correct answers, an accuracy), with their standard errors and counts where it knows them, and its
own full record (JSON) for reports. A sweep ranks trials by one metric (``objective``, the kind's default
unless the sweep file names one; ``direction: min`` there for a metric where lower is better).

A kind of evaluator is a subclass with a ``kind`` word; a sweep file names it as ``KIND`` or ``KIND:ARG``
(``evaluate: tasks:my.jsonl``). Its checks run in two steps before any model is loaded:

- ``check_spec`` and ``check_options`` (class methods, cheap, no heavy import): the spec and
  ``evaluate_options`` are well formed; the sweep file is refused at once otherwise.
- ``reads``: the files or modules it will read where it scores (a sweep on a cluster checks each node).
- the constructor (``from_spec`` for a sweep, the typed ``__init__`` from Python, ``from_command`` for
  ``agentmerge eval --suite``): reads and checks its inputs (a task file, a module, the plug-in's flags).

Then ``score(checkpoint)`` once per checkpoint. A kind with ``stops_early`` can also score a checkpoint in two
steps, ``score_early(checkpoint, first, stop)``: its first ``first`` items, then the rest only when
``stop(prefix_score)`` is False (a search's early stopping of bad trials, docs/search.md).

The kinds: ``tasks`` (``scoring.TaskFileEvaluator``, the user's task file, which stops early), ``lm-eval``
(``lmeval.LmEvalEvaluator``), ``python`` (``pyfunction.PythonEvaluator``, a function of the user's) and any plug-in's
(``plugins.EVALUATORS``; the agent zoo's ``zoo``); ``kinds`` finds them.
"""

from __future__ import annotations

import argparse
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

from agentmerge.config.userinput import did_you_mean
from agentmerge.errors import ConfigError

_WHAT = {int: "a positive integer", list: "a non-empty list of task names", str: "a folder path"}


@dataclass(frozen=True)
class Score:
    """What an evaluator says of one checkpoint: metrics (higher is better), their errors and counts, its record."""

    metrics: dict[str, float]
    stderr: dict[str, float] = field(default_factory=dict)
    count: dict[str, int] = field(default_factory=dict)
    record: dict[str, Any] = field(default_factory=dict)  # the evaluator's full result, JSON-ready


@dataclass(frozen=True)
class Early:
    """``Evaluator.score_early``'s answer: the score of the items scored, whether it stopped after the first
    ones, how many items it scored and how many there are in all."""

    score: Score
    stopped: bool
    items: int
    total: int


class Reads(NamedTuple):
    """An input scoring reads where it runs: a file or folder (``kind`` ``path``) or an importable ``module``."""

    what: str  # "task file", "evaluator module", ...
    ref: str
    kind: str = "path"


@dataclass(frozen=True)
class Context:
    """Where an evaluator runs: folders a relative file or module is looked up in first, torch threads, progress."""

    search_path: Sequence[str] = ()
    threads: int | None = None
    quiet: bool = True


class Evaluator(ABC):
    """A way to score a checkpoint; see the module docstring."""

    kind: ClassVar[str]  # the word a sweep file names it by: KIND or KIND:ARG
    usage: ClassVar[str]  # how its spec is written, for messages: "tasks:FILE.jsonl"
    objective: ClassVar[str | None] = None  # the metric a sweep ranks by by default (None: the only one)
    options: ClassVar[Mapping[str, type]] = {}  # the evaluate_options it takes: name -> int, list or str
    stops_early: ClassVar[bool] = False  # whether ``score_early`` can stop after the first items

    @property
    @abstractmethod
    def name(self) -> str:
        """The spec that names this evaluator, e.g. ``tasks:my.jsonl`` (for messages and records)."""

    @abstractmethod
    def score(self, checkpoint: Path) -> Score:
        """Score one model folder."""

    def score_early(self, checkpoint: Path, first: int, stop: Callable[[Score], bool]) -> Early:
        """Score the first ``first`` items; when ``stop`` says so of their score, return it (``stopped``), else
        score the rest too and return the whole score (the same metrics as ``score``). Kinds with
        ``stops_early`` only."""
        raise ConfigError(f"search: early_stop: the {self.kind} evaluator cannot score its first items alone")

    @classmethod
    def check_spec(cls, spec: str, arg: str) -> None:
        """Refuse (``ConfigError``) a malformed ``ARG`` of ``spec`` without loading anything heavy (default: any)."""
        return None

    @classmethod
    @abstractmethod
    def from_spec(cls, arg: str, options: Mapping[str, Any], context: Context) -> Evaluator:
        """The evaluator ``KIND:ARG`` names in a sweep file, with its checked ``evaluate_options``."""

    @classmethod
    def reads(cls, arg: str, search_path: Sequence[str]) -> list[Reads]:
        """What ``KIND:ARG`` reads on the machine that scores (a sweep on a cluster checks every node for it)."""
        return []

    @classmethod
    def check_inputs(cls, arg: str, search_path: Sequence[str], required: bool = True) -> None:
        """Read and check, before any trial, the inputs of ``KIND:ARG`` that are the user's own files (a task
        file), so that a mistake stops a sweep at once; ``required`` False: only those present here (default:
        nothing; modules are imported in the trials)."""
        return None

    @classmethod
    def from_command(cls, args: argparse.Namespace) -> Evaluator:
        """The evaluator of ``agentmerge eval CKPT ... --suite KIND`` (the eval command's flags in ``args``)."""
        raise ConfigError(f"eval: --suite {cls.kind}: this evaluator is not a suite; name it in a sweep file")

    def score_outputs(self, outputs: Path) -> Score:
        """Score generations made elsewhere (``agentmerge eval --suite KIND --outputs FILE``), no model loaded."""
        raise ConfigError(f"eval: --outputs: the {self.kind} suite cannot score generations made elsewhere")

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        """The options must be ones this kind takes, of the right type."""
        for key, value in options.items():
            if key not in cls.options:
                known = tuple(cls.options)
                hint = did_you_mean(key, known) if known else f" (the {cls.kind} evaluator takes none)"
                raise ConfigError(f"evaluate_options: unknown option {key!r}{hint}")
            want = cls.options[key]
            ok = isinstance(value, want) and not isinstance(value, bool)
            if key == "tasks":
                ok = ok and bool(value) and all(isinstance(t, str) for t in value)
            if not ok or (want is int and value < 1):
                raise ConfigError(f"evaluate_options: {key} must be {_WHAT[want]} (got {value!r})")


def checked_metrics(metrics: object, source: str) -> dict[str, float]:
    """Metrics as ``{str: finite float}``, or a ``ConfigError`` saying what is wrong (``source`` names who)."""
    if not isinstance(metrics, Mapping) or not metrics:
        raise ConfigError(f"{source} must return a non-empty {{metric: number}} mapping (got {type(metrics).__name__})")
    out = {}
    for k, v in metrics.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(float(v)):
            raise ConfigError(f"{source}: metric {k!r} must be a finite number (got {v!r})")
        out[str(k)] = float(v)
    return out


def set_threads(threads: int | None) -> None:
    """torch's intra-op threads, when given (an evaluator in a sweep trial gets the trial's CPUs)."""
    if threads:
        import torch

        torch.set_num_threads(threads)
