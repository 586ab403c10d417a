"""The convergence check: has an agent finished training, or would a merge be rewarded for extrapolating it?

For an agent theta with task vector tau = theta - theta0 and its own-domain metric m (higher is better, on
validation), score single-agent task arithmetic at several scales s:

    theta(s) = theta0 + s * tau,   s in S = {0.5, 1, 1.5, 2}   (s = 1 is the agent itself)

The agent counts as **converged** when going further along its own direction does not help by more than two
standard errors:

    m(1.5) - m(1) <= 2 * sqrt(SE(1)^2 + SE(1.5)^2)

(the two scores' standard errors treated as independent; for scores paired on the same prompts that is a
conservative bound). A metric that keeps rising past s = 1 means training stopped short of where the agent's
own direction leads. A merge benchmark on such an agent rewards any method that extrapolates (task arithmetic
with lambda > 1, RAM+'s unique-region scale-up) for that, not for choosing elements well: retrain it (more
steps, a higher learning rate) until the check passes, then compare merges.

Without a standard error for the metric (an evaluator that reports none) the verdict is None (unknown).
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentmerge.errors import AgentMergeError, ConfigError, one_line
from agentmerge.evaluation.evaluator import Evaluator, Score
from agentmerge.methods.arithmetic import TASK_ARITHMETIC

SCALES = (0.5, 1.0, 1.5, 2.0)
REFERENCE, FURTHER = 1.0, 1.5  # the verdict compares these two scales


@dataclass(frozen=True)
class ScalePoint:
    """The agent's own metric at theta0 + scale * tau, with its standard error and count where known."""

    scale: float
    value: float
    se: float | None = None
    n: int | None = None


@dataclass(frozen=True)
class AgentCheck:
    """One agent's scores over the scales and the verdict (see the module docstring)."""

    agent: str
    metric: str
    points: tuple[ScalePoint, ...]

    def at(self, scale: float) -> ScalePoint | None:
        return next((p for p in self.points if p.scale == scale), None)

    @property
    def gain(self) -> float | None:
        """m(1.5) - m(1), when both were scored."""
        one, more = self.at(REFERENCE), self.at(FURTHER)
        return None if one is None or more is None else more.value - one.value

    @property
    def two_se(self) -> float | None:
        """Two standard errors of the gain (None without both standard errors)."""
        one, more = self.at(REFERENCE), self.at(FURTHER)
        if one is None or more is None or one.se is None or more.se is None:
            return None
        return 2.0 * math.sqrt(one.se**2 + more.se**2)

    @property
    def converged(self) -> bool | None:
        """The verdict: True, False, or None when it cannot be told (a scale or a standard error missing)."""
        gain, two_se = self.gain, self.two_se
        return None if gain is None or two_se is None else gain <= two_se

    @property
    def best_scale(self) -> float:
        return max(self.points, key=lambda p: p.value).scale

    def as_dict(self) -> dict[str, Any]:
        return {
            "agent": self.agent,
            "metric": self.metric,
            "scores": {f"{p.scale:g}": {"value": p.value, "se": p.se, "n": p.n} for p in self.points},
            "gain_1.5": self.gain,
            "two_se": self.two_se,
            "converged": self.converged,
            "best_scale": self.best_scale,
        }


def check_scales(scales: Sequence[float]) -> tuple[float, ...]:
    """Distinct positive scales in increasing order that include 1 and 1.5 (the verdict's two)."""
    out = tuple(sorted({float(s) for s in scales}))
    if not out or out[0] <= 0 or not all(math.isfinite(s) for s in out):
        raise ConfigError(f"converge: scales must be positive numbers (got {list(scales)})")
    if REFERENCE not in out or FURTHER not in out:
        raise ConfigError(f"converge: scales must include 1 and 1.5, the two the verdict compares (got {list(out)})")
    return out


def scaled_model(base: Path, agent: Path, scale: float, out: Path, threads: int | None = None) -> Path:
    """``theta0 + scale * (agent - theta0)`` written to ``out`` in the base's dtype (``agent`` itself at scale 1)."""
    if scale == REFERENCE:
        return agent
    from agentmerge.config.schema import config_from_dict
    from agentmerge.engine.merge import merge

    one_model = {"base": str(base), "models": [{"path": str(agent)}], "params": {"scale": scale}}
    data = {"method": TASK_ARITHMETIC.name, **one_model}  # task arithmetic of one model is theta0 + scale * tau
    cfg = config_from_dict({**data, "threads": threads}, "converge")  # a bad value is one ConfigError line
    merge(cfg, out, force=True, quiet=True)
    return out


def metric_point(score: Score, metric: str, scale: float, source: str) -> ScalePoint:
    """The point of ``metric`` in ``score``, or a ``ConfigError`` naming the metrics there are."""
    if metric not in score.metrics:
        known = ", ".join(sorted(score.metrics))
        raise ConfigError(f"converge: {source} reports no metric {metric!r} (it reports: {known}); pass --metric")
    return ScalePoint(scale, score.metrics[metric], score.stderr.get(metric), score.count.get(metric))


def check_agent(
    base: Path,
    agent: Path,
    metric: str,
    evaluator: Evaluator,
    work: Path,
    scales: Sequence[float] = SCALES,
    threads: int | None = None,
    log: Callable[[str], None] = lambda _m: None,
) -> AgentCheck:
    """Score ``agent`` at every scale on ``metric``; each scaled copy is removed once scored."""
    points = []
    for scale in check_scales(scales):
        folder = scaled_model(base, agent, scale, work / f"{agent.name}.s{scale:g}", threads)
        try:
            point = metric_point(
                _score(evaluator, folder, f"{agent.name} at s = {scale:g}"), metric, scale, evaluator.name
            )
        finally:
            if folder != agent:
                shutil.rmtree(folder, ignore_errors=True)
        se = f" ± {point.se:.4g}" if point.se is not None else ""
        log(f"{agent.name} s={scale:g}: {metric} = {point.value:.4g}{se}")
        points.append(point)
    return AgentCheck(str(agent), metric, tuple(points))


def _score(evaluator: Evaluator, folder: Path, what: str) -> Score:
    """The evaluator's score of ``folder``; whatever it raises is one ``ConfigError`` line naming it and ``what``."""
    try:
        return evaluator.score(folder)
    except AgentMergeError:
        raise
    except Exception as e:
        raise ConfigError(
            f"converge: the evaluator {evaluator.name} failed on {what} ({one_line(e)}); fix it and rerun"
        ) from None


def markdown(checks: Sequence[AgentCheck]) -> str:
    """One row per agent: the metric at each scale (± SE), m(1.5) - m(1) against 2 SE, the verdict."""
    scales = sorted({p.scale for c in checks for p in c.points})
    head = ["agent", "metric", *(f"s = {s:g}" for s in scales), "m(1.5) − m(1)", "2 SE", "converged"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in checks:
        cells = [Path(c.agent).name, c.metric]
        for s in scales:
            p = c.at(s)
            cells.append("" if p is None else f"{p.value:.4g}" + (f" ± {p.se:.2g}" if p.se is not None else ""))
        two_se = "" if c.two_se is None else f"{c.two_se:.2g}"
        cells += [_num(c.gain), two_se, {True: "yes", False: "**no**", None: "unknown"}[c.converged]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:+.2g}"
