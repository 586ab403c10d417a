"""How a sweep scores a merged folder: ``{metric: float}`` from the zoo, lm-eval, or the user's own function.

- ``zoo`` (``zoo:test``, ``zoo:validation``; default validation, the split to tune on): the zoo suite's
  metrics and ``agentic_avg``, their mean over the trained domains (the default objective). Its options
  (``evaluate_options``): ``n`` prompts per task (default 1000), ``tasks`` (default all), ``batch_size``, and
  ``cache``, a folder of evaluations keyed by the merged weights' sha256 (the zoo bench's).
- ``lm-eval:T1,T2``: lm-evaluation-harness tasks; metrics named ``task.metric``.
- ``tasks:FILE.jsonl``: the user's own task file (docs/evaluate.md), greedy in the chat template; metrics
  ``tasks.<task>`` (share right) and ``tasks_avg``, their mean (the default objective). A relative FILE is
  looked up in the sweep file's folder first.
- ``python:MODULE:FUNCTION``: ``FUNCTION(path_to_merged_folder)`` returns ``{metric: float}``; MODULE is
  imported from the sweep file's folder, the current folder or the installed packages.
"""

from __future__ import annotations

import importlib
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentmerge.config.userinput import did_you_mean
from agentmerge.errors import ConfigError

Evaluator = Callable[[Path], dict[str, float]]
KINDS = ("zoo", "lm-eval", "python", "tasks")
ZOO_OPTIONS = {"n": int, "tasks": list, "batch_size": int, "cache": str}
_WHAT = {int: "a positive integer", list: "a non-empty list of task names", str: "a folder path"}


def parse(spec: str) -> tuple[str, str]:
    """``"lm-eval:hellaswag"`` -> ``("lm-eval", "hellaswag")``; a ``ConfigError`` for anything else."""
    kind, _, arg = spec.partition(":")
    if kind not in KINDS:
        raise ConfigError(
            f"evaluate: {spec!r} is not one of zoo, lm-eval:TASKS, python:MODULE:FUNCTION, tasks:FILE.jsonl"
        )
    if kind == "python" and arg.count(":") != 1:
        raise ConfigError(f"evaluate: {spec!r}: write python:MODULE:FUNCTION")
    if kind == "lm-eval" and not arg:
        raise ConfigError(f"evaluate: {spec!r}: name the tasks, e.g. lm-eval:hellaswag,arc_easy")
    if kind == "tasks" and not arg:
        raise ConfigError(f"evaluate: {spec!r}: name the task file, e.g. tasks:my-tasks.jsonl")
    if kind == "zoo" and arg not in ("", "test", "validation"):
        raise ConfigError(f"evaluate: {spec!r}: the zoo's splits are test and validation")
    return kind, arg


def default_objective(spec: str) -> str | None:
    """The metric a sweep ranks by when the file names none (None: the only metric, whatever it is)."""
    kind = parse(spec)[0]
    return "agentic_avg" if kind == "zoo" else "tasks_avg" if kind == "tasks" else None


def check_options(spec: str, options: Mapping[str, Any]) -> None:
    """The evaluator's options must be ones it takes, of the right type (only the zoo's take any)."""
    kind = parse(spec)[0]
    allowed = ZOO_OPTIONS if kind == "zoo" else {}
    for key, value in options.items():
        if key not in allowed:
            known = tuple(allowed)
            hint = did_you_mean(key, known) if known else f" (the {kind} evaluator takes none)"
            raise ConfigError(f"evaluate_options: unknown option {key!r}{hint}")
        kind_ok = isinstance(value, allowed[key]) and not isinstance(value, bool)
        if key == "tasks":
            kind_ok = kind_ok and bool(value) and all(isinstance(t, str) for t in value)
        if not kind_ok or (allowed[key] is int and value < 1):
            raise ConfigError(f"evaluate_options: {key} must be {_WHAT[allowed[key]]} (got {value!r})")


def resolve(
    spec: str, search_path: Sequence[str] = (), threads: int = 1, options: Mapping[str, Any] | None = None
) -> Evaluator:
    """The evaluator ``spec`` names with its ``options`` (checked by :func:`check_options`), ready to call."""
    kind, arg = parse(spec)
    if kind == "zoo":
        opts = dict(options or {})
        return lambda folder: _zoo(folder, arg or "validation", threads, opts)
    if kind == "lm-eval":
        tasks = [t for t in arg.split(",") if t]
        return lambda folder: _lm_eval(folder, tasks)
    if kind == "tasks":
        return _own_tasks(arg, search_path, threads)
    return _python(arg, search_path)


def checked(metrics: object, source: str) -> dict[str, float]:
    """An evaluator's result as ``{str: finite float}``, or a ``ConfigError`` saying what is wrong."""
    if not isinstance(metrics, Mapping) or not metrics:
        raise ConfigError(f"{source} must return a non-empty {{metric: number}} mapping (got {type(metrics).__name__})")
    out = {}
    for k, v in metrics.items():
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(float(v)):
            raise ConfigError(f"{source}: metric {k!r} must be a finite number (got {v!r})")
        out[str(k)] = float(v)
    return out


def _python(target: str, search_path: Sequence[str]) -> Evaluator:
    module_name, _, function = target.partition(":")
    try:
        module = _import(module_name, search_path)
    except ImportError as e:
        raise ConfigError(f"evaluate: cannot import {module_name!r} ({e})") from None
    fn = getattr(module, function, None)
    if not callable(fn):
        raise ConfigError(f"evaluate: {module_name!r} has no function {function!r}")
    return lambda folder: checked(fn(folder), f"evaluate: {target}")


def _import(name: str, search_path: Sequence[str]) -> Any:
    """Import ``name`` with ``search_path`` first on ``sys.path``.

    A long-lived worker (Ray reuses them) may hold a module of that name from another sweep's folder:
    it is imported afresh when the search path has a file of that name elsewhere.
    """
    for folder in reversed(search_path):
        if folder in sys.path:
            sys.path.remove(folder)
        sys.path.insert(0, folder)
    wanted = next((p for f in search_path if (p := Path(f) / f"{name}.py").is_file()), None)
    held = sys.modules.get(name)
    if (
        held is not None
        and wanted is not None
        and Path(getattr(held, "__file__", "") or "").resolve() != wanted.resolve()
    ):
        del sys.modules[name]
    importlib.invalidate_caches()
    return importlib.import_module(name)


def _zoo(folder: Path, split: str, threads: int, options: dict[str, Any]) -> dict[str, float]:
    import torch

    from agentmerge_zoo.evaluate import DEFAULT_N, agentic_average, evaluate_cached

    torch.set_num_threads(threads)
    cache = options.get("cache")
    report, _ = evaluate_cached(
        folder,
        split="val" if split == "validation" else split,  # the suite's own name of the split
        n=options.get("n", DEFAULT_N),
        tasks=options.get("tasks"),
        batch_size=options.get("batch_size", 250),
        cache=Path(cache) if cache else None,
    )
    metrics = dict(report.metrics)
    return {**metrics, "agentic_avg": agentic_average(metrics)}


def _lm_eval(folder: Path, tasks: list[str]) -> dict[str, float]:
    from agentmerge.evaluation.lmeval import run_lm_eval

    results: dict[str, Any] = run_lm_eval(folder, tasks).get("results", {})
    out = {}
    for task, values in results.items():
        for name, value in values.items():
            if isinstance(value, int | float) and not isinstance(value, bool) and "stderr" not in name:
                out[f"{task}.{name.split(',')[0]}"] = float(value)
    return checked(out, f"evaluate: lm-eval:{','.join(tasks)}")


def check_before_trials(spec: str, search_path: Sequence[str] = ()) -> None:
    """What can be checked of the evaluator before any trial runs: a ``tasks:FILE`` is read and checked whole."""
    kind, arg = parse(spec)
    if kind == "tasks":
        from agentmerge.evaluation.taskfile import load_tasks

        load_tasks(_task_file(arg, search_path))


def _task_file(file: str, search_path: Sequence[str]) -> Path:
    """``file`` in the first folder of ``search_path`` that has it, else as given."""
    return next((p for f in search_path if (p := Path(f) / file).is_file()), Path(file))


def _own_tasks(file: str, search_path: Sequence[str], threads: int) -> Evaluator:
    """Score on the user's task file (read and checked now, so a mistake stops the sweep before any trial)."""
    from agentmerge.evaluation.taskfile import load_tasks

    examples = load_tasks(_task_file(file, search_path))

    def run(folder: Path) -> dict[str, float]:
        import torch

        from agentmerge.evaluation.scoring import evaluate

        torch.set_num_threads(threads)
        scores = evaluate([folder], examples, quiet=True).checkpoints[0]
        metrics = {f"tasks.{t}": v for t, v in scores.mean.items()}
        return checked(
            {**metrics, "tasks_avg": sum(scores.mean.values()) / len(scores.mean)}, f"evaluate: tasks:{file}"
        )

    return run
