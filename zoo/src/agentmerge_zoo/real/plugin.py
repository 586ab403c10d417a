"""The real zoo's skills as an agentmerge evaluator plug-in (entry point ``agentmerge.evaluators: real``).

``evaluate: real`` (or ``real:validation``, the split to tune and search on; ``real:test`` for a search's test) in
a sweep or search file: every checkpoint greedy-decoded on the real zoo's prompts of each skill
(``evaluate.evaluate_cached``). Options (``evaluate_options`` / ``test_options``): ``skills`` (default the
zoo's three trained skills and capitals), ``trained`` (the skills whose strict scores ``trained_avg`` averages,
the default objective; default the zoo's three), ``n`` prompts per skill (default 32 validation, 64 test: the
bench's), ``cache`` (a folder of evaluations keyed by the weights' sha256, shared with the bench).

The metrics are each skill's strict score under its own name (``tool``, ``code``, ...), with their SEs, and
``trained_avg``. This module is imported when a sweep file is read, so it imports nothing heavy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from agentmerge import ConfigError
from agentmerge.api import Context, Evaluator, Score, set_threads

SPLITS = {"validation": "val", "test": "test"}  # a spec's split -> the real zoo's own name of it
DEFAULT_N = {"validation": 32, "test": 64}


class RealEvaluator(Evaluator):
    """The real zoo's skills on one split; see the module docstring."""

    kind = "real"
    usage = "real[:validation|test]"
    objective = "trained_avg"
    options: ClassVar[Mapping[str, type]] = {"n": int, "skills": list, "trained": list, "cache": str, "dtype": str}

    def __init__(
        self,
        split: str = "validation",
        *,
        n: int | None = None,
        skills: Sequence[str] | None = None,
        trained: Sequence[str] | None = None,
        cache: str | Path | None = None,
        dtype: str = "auto",
        threads: int | None = None,
    ) -> None:
        if split not in SPLITS:
            raise ConfigError(f"the real zoo's splits are {' and '.join(SPLITS)} (got {split!r})")
        self.skills, self.trained = chosen_skills(skills, trained)
        self.split, self.n = split, n or DEFAULT_N[split]
        self.cache, self.threads = (Path(cache) if cache else None), threads
        self.dtype = checked_dtype(dtype)

    @property
    def name(self) -> str:
        return f"real:{self.split}"

    def score(self, checkpoint: Path) -> Score:
        from agentmerge_zoo.real.bench import skill_metrics
        from agentmerge_zoo.real.evaluate import evaluate_cached

        set_threads(self.threads)
        report = evaluate_cached(Path(checkpoint), self.skills, SPLITS[self.split], self.n, self.cache, self.dtype)
        metrics = skill_metrics(report, self.trained)
        stderr = {s: float(report[s]["strict_se"]) for s in self.skills}
        count = {s: int(report[s]["n"]) for s in self.skills}
        return Score(metrics, stderr, count, {"split": self.split, "n": self.n, "dtype": self.dtype, "report": report})

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        super().check_options(options)
        chosen_skills(options.get("skills"), options.get("trained"))
        checked_dtype(options.get("dtype", "auto"))

    @classmethod
    def check_spec(cls, spec: str, arg: str) -> None:
        if arg not in ("", *SPLITS):
            raise ConfigError(f"evaluate: {spec!r}: the real zoo's splits are validation and test")

    @classmethod
    def from_spec(cls, arg: str, options: Mapping[str, Any], context: Context) -> RealEvaluator:
        return cls(arg or "validation", **options, threads=context.threads)


def chosen_skills(skills: Sequence[str] | None, trained: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """The skills scored and the trained ones (defaults: the zoo's lineup and capitals); a ``ConfigError`` for an
    unknown skill or a trained skill that is not scored."""
    from agentmerge_zoo.real.suite import HELD_OUT, SKILLS, TRAINED

    train = list(trained or TRAINED)
    scored = list(skills or [*train, *HELD_OUT])
    unknown = sorted(set(scored + train) - set(SKILLS))
    if unknown or not set(train) <= set(scored):
        raise ConfigError(
            f"evaluate_options: skills {scored} and trained {train}: the real zoo's skills are {', '.join(SKILLS)}, "
            "and every trained skill must be scored" + (f" (unknown: {', '.join(unknown)})" if unknown else "")
        )
    return scored, train


def checked_dtype(dtype: str) -> str:
    """The compute dtype, one of ``evaluate.DTYPES``; else a ``ConfigError``."""
    from agentmerge_zoo.real.evaluate import DTYPES

    if dtype not in DTYPES:
        raise ConfigError(f"evaluate_options: dtype must be one of {', '.join(DTYPES)} (got {dtype!r})")
    return dtype
