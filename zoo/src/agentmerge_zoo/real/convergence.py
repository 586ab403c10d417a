"""The convergence check: an agent's own-skill score at theta0 + s * tau for s in {0.5, 1, 1.5, 2}, on validation.

``theta0 + s * tau`` is single-agent task arithmetic with lambda = s, written by ``agentmerge.merge`` (s = 1 is
the agent itself). An agent counts as converged when s = 1.5 is not better than s = 1 by more than two standard
errors of the difference, SE = sqrt(SE_1^2 + SE_1.5^2) (the two scores' standard errors over prompts, treated as
independent: a conservative bound for these paired scores). An unconverged agent rewards any merge that
extrapolates; the check says which agents need more steps. The scaled models and the verdict are the library's
(``agentmerge.evaluation.convergence``, ``agentmerge converge``); this module scores them with the real zoo's
cached evaluation.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentmerge.api import AgentCheck, ScalePoint, scaled_model
from agentmerge_zoo.real.evaluate import evaluate_cached

SCALES = (0.5, 1.0, 1.5, 2.0)


def verdict(scores: dict[float, dict[str, float]]) -> dict[str, Any]:
    """Converged, the gain of s = 1.5 over s = 1 and two standard errors of it (the library's check)."""
    points = tuple(ScalePoint(s, v["strict"], v["strict_se"]) for s, v in sorted(scores.items()))
    check = AgentCheck("", "strict", points)
    return {"converged": check.converged, "gain_1.5": check.gain, "two_se": check.two_se}


def check_agent(
    base: Path,
    agent: Path,
    skill: str,
    work: Path,
    n: int,
    cache: Path | None,
    scales: Sequence[float] = SCALES,
    log: Callable[[str], None] = lambda _m: None,
    dtype: str = "auto",
) -> dict[str, Any]:
    """Scores at every scale (validation, the agent's own skill, computed in ``dtype``) and the verdict; merged
    folders removed after."""
    scores: dict[float, dict[str, float]] = {}
    for scale in scales:
        folder = scaled_model(base, agent, scale, work / f"{agent.name}.s{scale:g}")
        scores[scale] = evaluate_cached(folder, [skill], "val", n, cache, dtype)[skill]
        log(f"check {agent.name} s={scale:g}: {100 * scores[scale]['strict']:.1f} %")
        if folder != agent:
            shutil.rmtree(folder, ignore_errors=True)
    result = {"skill": skill, "scores": {f"{s:g}": v for s, v in scores.items()}}
    return result | (verdict(scores) if 1.0 in scores and 1.5 in scores else {})
