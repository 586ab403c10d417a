"""Score checkpoints on the user's own tasks (``taskfile``): greedy, batched generation with transformers.

    run = evaluate(["base", "agent-a", "agent-b", "merged"], "tasks.jsonl")
    print(agentmerge.evaluation.eval_report.eval_markdown(run))     # or run.to_dict()

Each prompt goes through the checkpoint's chat template (a system prompt first when one is given) unless
``chat_template=False`` or the tokenizer has none; without the template a system prompt is put on its
own line before the prompt. Outputs are cut at the first end token and scored by the example's rule.

With several checkpoints, the first is the *base*, folders with a ``merge.json`` are *merges* and the
others *specialists*. A specialist's tasks are those where its gain over the base is positive and the
largest among the specialists. The share of gain a merge M keeps of specialist A is

    (mean over A's tasks of M  -  the same mean of the base) / (the same mean of A  -  the same mean of the base)

(1 = all of A's gain, 0 = none, negative = worse than the base); it is left out where A has no tasks.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentmerge.errors import CheckpointError, ConfigError
from agentmerge.evaluation.evaluator import Context, Early, Evaluator, Reads, Score, set_threads
from agentmerge.evaluation.generation import Generator
from agentmerge.evaluation.taskfile import Example, load_tasks
from agentmerge.io.guards.strict_json import read_json_object

MAX_NEW_TOKENS = 100_000  # as a task file's max_new_tokens


@dataclass(frozen=True)
class Sample:
    task: str
    prompt: str
    output: str
    reference: Any
    correct: bool


@dataclass
class Scores:
    """One checkpoint: per task the share of correct outputs, its standard error and count."""

    label: str
    path: str
    role: str  # base, specialist, merge (or "model" when evaluated alone)
    chat_template: bool
    mean: dict[str, float] = field(default_factory=dict)
    se: dict[str, float] = field(default_factory=dict)
    count: dict[str, int] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class EvalRun:
    """Every checkpoint's scores on the same tasks, and the share of gain each merge keeps."""

    tasks: list[str]
    checkpoints: list[Scores]
    task_file: str = ""

    def shares(self) -> list[dict[str, Any]]:
        """Per merge and specialist: the specialist's tasks and the share of its gain the merge keeps."""
        base = next((c for c in self.checkpoints if c.role == "base"), None)
        specialists = [c for c in self.checkpoints if c.role == "specialist"]
        merges = [c for c in self.checkpoints if c.role == "merge"]
        out: list[dict[str, Any]] = []
        if base is None:
            return out
        for spec in specialists:
            own = specialist_tasks(base, specialists, spec, self.tasks)
            if not own:
                continue
            b, a = _macro(base, own), _macro(spec, own)
            for merge in merges:
                share = (_macro(merge, own) - b) / (a - b)
                out.append({"merge": merge.label, "specialist": spec.label, "tasks": own, "share": share})
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "task_file": self.task_file,
            "tasks": self.tasks,
            "checkpoints": [
                {
                    "label": c.label,
                    "path": c.path,
                    "role": c.role,
                    "chat_template": c.chat_template,
                    "accuracy": c.mean,
                    "stderr": c.se,
                    "count": c.count,
                    "seconds": round(c.seconds, 2),
                    "samples": [s.__dict__ for s in c.samples],
                }
                for c in self.checkpoints
            ],
            "share_of_gain_kept": self.shares(),
        }


def specialist_tasks(base: Scores, specialists: Sequence[Scores], spec: Scores, tasks: Sequence[str]) -> list[str]:
    """The tasks where ``spec`` gains over the base, more than any other specialist does."""
    own = []
    for t in tasks:
        gain = spec.mean[t] - base.mean[t]
        if gain > 0 and all(gain >= s.mean[t] - base.mean[t] for s in specialists):
            own.append(t)
    return own


def _macro(scores: Scores, tasks: Sequence[str]) -> float:
    return sum(scores.mean[t] for t in tasks) / len(tasks)


def mean_se(values: Sequence[bool]) -> tuple[float, float]:
    """Share of True and its standard error (sample standard deviation / sqrt(n); 0 for one value)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def roles(paths: Sequence[str]) -> list[str]:
    """First: base; a folder with merge.json: merge; others: specialist (one checkpoint alone: model)."""
    if len(paths) == 1:
        return ["model"]
    return ["base"] + ["merge" if (Path(p) / "merge.json").is_file() else "specialist" for p in paths[1:]]


def labels(paths: Sequence[str]) -> list[str]:
    """Folder names, or the paths as given when two folders share a name."""
    names = [Path(p).name or p for p in paths]
    return names if len(set(names)) == len(names) else list(paths)


def evaluate(
    checkpoints: Sequence[str | Path],
    tasks: str | Path | Sequence[Example],
    *,
    chat_template: bool = True,
    system: str | None = None,
    batch_size: int = 16,
    samples: int = 0,
    limit: int | None = None,
    max_new_tokens: int | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    quiet: bool = False,
) -> EvalRun:
    """Score every checkpoint on every example; see the module docstring for roles and shares."""
    check_counts(limit=limit, samples=samples, batch_size=batch_size, max_new_tokens=max_new_tokens)
    examples = list(load_tasks(tasks) if isinstance(tasks, str | Path) else tasks)
    examples = prepared(examples, limit, max_new_tokens, system)
    paths = [str(c) for c in checkpoints]
    for p in paths:
        config = Path(p).expanduser() / "config.json"
        if not config.is_file():
            raise CheckpointError(f"{p}: not a model folder (no config.json)")
        read_json_object(config, "model config")  # a list, a damaged or a deeply nested file: one line
    names = labels(paths)
    run = EvalRun(
        list(dict.fromkeys(ex.task for ex in examples)), [], "" if not isinstance(tasks, str | Path) else str(tasks)
    )
    for path, label, role in zip(paths, names, roles(paths), strict=True):
        run.checkpoints.append(
            _score_one(path, label, role, examples, chat_template, batch_size, samples, device, dtype, quiet)
        )
    return run


COUNTS = {  # option: (least value, whether None is allowed, its flag)
    "limit": (1, True, "--limit"),
    "samples": (0, False, "--samples"),
    "batch_size": (1, False, "--batch-size"),
    "max_new_tokens": (1, True, "--max-new-tokens"),
    "threads": (1, True, "--threads"),
}


def check_counts(**values: object) -> None:
    """Each count a whole number of at least its least value (``COUNTS``), else one ``ConfigError`` line."""
    for option, value in values.items():
        least, optional, flag = COUNTS[option]
        if value is None and optional:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ConfigError(f"eval: {flag} ({option}) must be a whole number >= {least} (got {value})")
        if option == "max_new_tokens" and value > MAX_NEW_TOKENS:
            raise ConfigError(f"eval: {flag} ({option}) must be at most {MAX_NEW_TOKENS} (got {value})")


class TaskFileEvaluator(Evaluator):
    """The user's task file (``evaluate: tasks:FILE.jsonl``, ``agentmerge eval --tasks FILE``).

    The file is read and checked when the evaluator is made, so a mistake stops before any model loads.
    ``score`` gives ``tasks.<task>`` (share right) and ``tasks_avg`` (their mean, the default objective);
    ``run`` scores several checkpoints together (roles, shares of gain kept). ``settings`` are
    :func:`evaluate`'s keywords (``chat_template``, ``system``, ``batch_size``, ``limit``, ...).
    """

    kind = "tasks"
    usage = "tasks:FILE.jsonl"
    objective = "tasks_avg"
    stops_early = True

    def __init__(self, file: str | Path, *, threads: int | None = None, **settings: Any) -> None:
        self.file = str(file)
        self.examples = load_tasks(file)
        self.threads = threads
        self.settings = {"quiet": True, **settings}

    @property
    def name(self) -> str:
        return f"tasks:{self.file}"

    def run(self, checkpoints: Sequence[str | Path]) -> EvalRun:
        """Every checkpoint on the task file (the first the base, see the module docstring)."""
        set_threads(self.threads)
        run = evaluate(checkpoints, self.examples, **self.settings)
        run.task_file = self.file
        return run

    def score(self, checkpoint: Path) -> Score:
        return self._as_score(self.run([checkpoint]).checkpoints[0])

    def _as_score(self, scores: Scores) -> Score:
        metrics = {f"tasks.{t}": v for t, v in scores.mean.items()}
        metrics["tasks_avg"] = sum(scores.mean.values()) / len(scores.mean)
        stderr = {f"tasks.{t}": v for t, v in scores.se.items()}
        count = {f"tasks.{t}": v for t, v in scores.count.items()}
        record: dict[str, Any] = EvalRun(list(scores.mean), [scores], self.file).to_dict()
        return Score(metrics, stderr, count, record)

    def score_early(self, checkpoint: Path, first: int, stop: Callable[[Score], bool]) -> Early:
        """The first ``first`` examples in :func:`interleaved` order, then (unless ``stop``) the rest, one model
        load; the whole score has :meth:`score`'s metrics (its outputs come in two rounds of batches)."""
        set_threads(self.threads)
        opts = {**inspect_defaults(evaluate), **self.settings}
        check_counts(batch_size=opts["batch_size"], limit=opts["limit"], max_new_tokens=opts["max_new_tokens"])
        examples = interleaved(prepared(self.examples, opts["limit"], opts["max_new_tokens"], opts["system"]))
        path, total = str(checkpoint), len(examples)
        gen = Generator.load(path, opts["device"], opts["dtype"], opts["chat_template"])
        gen.check_alphabet(examples)
        outputs: list[str] = []
        for part in (examples[:first], examples[first:]):
            outputs += gen.complete(part, opts["batch_size"], f"eval {Path(path).name}", opts["quiet"])
            done = examples[: len(outputs)]
            score = self._as_score(marked(Scores(Path(path).name, path, "model", gen.chat), done, outputs))
            if len(outputs) == total or stop(score):
                return Early(score, len(outputs) < total, len(outputs), total)
        raise AssertionError("unreachable: the second part ends the examples")

    @classmethod
    def check_spec(cls, spec: str, arg: str) -> None:
        if not arg:
            raise ConfigError(f"evaluate: {spec!r}: name the task file, e.g. tasks:my-tasks.jsonl")

    @classmethod
    def reads(cls, arg: str, search_path: Sequence[str]) -> list[Reads]:
        return [Reads("task file", str(cls.located(arg, search_path)))]

    @classmethod
    def check_inputs(cls, arg: str, search_path: Sequence[str], required: bool = True) -> None:
        path = cls.located(arg, search_path)
        if required or path.exists():
            load_tasks(path)

    @classmethod
    def from_spec(cls, arg: str, options: Mapping[str, Any], context: Context) -> TaskFileEvaluator:
        return cls(cls.located(arg, context.search_path), threads=context.threads, quiet=context.quiet)

    @staticmethod
    def located(file: str, search_path: Sequence[str]) -> Path:
        """A relative FILE is looked up in ``search_path`` (the sweep file's folder) first."""
        return next((p for f in search_path if (p := Path(f) / file).is_file()), Path(file))


def prepared(
    examples: list[Example], limit: int | None, max_new_tokens: int | None, system: str | None
) -> list[Example]:
    """The examples :func:`evaluate` scores: at most ``limit`` per task, the settings it overrides applied."""
    examples = _limited(examples, limit)
    if max_new_tokens is not None:
        examples = [_with(ex, max_new_tokens=max_new_tokens) for ex in examples]
    if system is not None:
        examples = [_with(ex, system=system) for ex in examples]
    return examples


def interleaved(examples: Sequence[Example]) -> list[Example]:
    """The examples task by task in turn (the first of each task, then the second, ...): any first items of this
    order hold every task in about its share, so their score is a fair early look at the whole."""
    by_task: dict[str, list[Example]] = {}
    for ex in examples:
        by_task.setdefault(ex.task, []).append(ex)
    rounds = itertools.zip_longest(*by_task.values())
    return [ex for row in rounds for ex in row if ex is not None]


def _with(ex: Example, **changes: Any) -> Example:
    from dataclasses import replace

    return replace(ex, **changes)


def inspect_defaults(function: Callable[..., Any]) -> dict[str, Any]:
    """A function's keyword defaults (``evaluate``'s settings, for a scoring that does not call it)."""
    import inspect

    params = inspect.signature(function).parameters.values()
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


def _limited(examples: list[Example], limit: int | None) -> list[Example]:
    if limit is None:
        return examples
    seen: dict[str, int] = {}
    kept = []
    for ex in examples:
        seen[ex.task] = seen.get(ex.task, 0) + 1
        if seen[ex.task] <= limit:
            kept.append(ex)
    return kept


def _score_one(
    path: str,
    label: str,
    role: str,
    examples: Sequence[Example],
    chat: bool,
    batch_size: int,
    samples: int,
    device: str,
    dtype: str,
    quiet: bool,
) -> Scores:
    started = time.perf_counter()
    gen = Generator.load(path, device, dtype, chat)
    gen.check_alphabet(examples)
    outputs = gen.complete(examples, batch_size, f"eval {label}", quiet)
    scores = marked(Scores(label, path, role, gen.chat), examples, outputs, samples)
    scores.seconds = time.perf_counter() - started
    return scores


def marked(scores: Scores, examples: Sequence[Example], outputs: Sequence[str], samples: int = 0) -> Scores:
    """``scores`` filled in from each example's output: per task the share right, its error and count."""
    shown: dict[str, int] = {}
    for task in dict.fromkeys(ex.task for ex in examples):
        marks = [ex.score(out) for ex, out in zip(examples, outputs, strict=True) if ex.task == task]
        scores.mean[task], scores.se[task] = mean_se(marks)
        scores.count[task] = len(marks)
    for ex, out in zip(examples, outputs, strict=True):
        if shown.get(ex.task, 0) < samples:
            shown[ex.task] = shown.get(ex.task, 0) + 1
            scores.samples.append(Sample(ex.task, ex.prompt, out, ex.reference, ex.score(out)))
    return scores
