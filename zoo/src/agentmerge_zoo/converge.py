"""The convergence check on the zoo's agents, and the loop that gives the agents that fail it more steps.

**The check** (the library's, ``agentmerge.evaluation.convergence``): each agent's own-domain score at
theta0 + s * tau for s in {0.5, 1, 1.5, 2}, on the validation split; the agent counts as converged when
m(1.5) - m(1) <= 2 * sqrt(SE(1)^2 + SE(1.5)^2). The own-domain score is the mean of the domain's K metric
columns, D = (1/K) sum_m x_m. Its standard error: metrics of one task are scored on the same prompts, so their
errors add (an upper bound, |corr| <= 1); different tasks have independent prompts, so theirs add in quadrature:

    SE(D) = sqrt( sum_tasks ( sum_{m in task} SE_m )^2 ) / K

The check scores ``n`` prompts per task (default 3000; the bench's ``n_val`` is 300). At 1,000 the rule lacked the
power to see the fp32_bf16 memory agent still rising (seed 0: +2.7 points against 2 SE 2.9, although +5.2 at
s = 2); at 3,000 it fails clearly (+3.7 against 1.6; docs/zoo.md). Training streams skip only the first ``n_val``
validation prompts, so the check's later prompts may include a training prompt (seed 0: 7 % of code's 3,000,
14 % of tool's, none of memory's): it is a diagnostic of the agent's training, not a score of the benchmark.

**The loop** (:func:`converge`): check every seed's agents; a domain whose agent fails in any seed gets
``growth`` times more steps (every seed alike: the steps are part of the regime's recipe), its training
continuing from its saved end state (``build.latest_state``); check again, up to ``rounds`` extensions.
Every stage is cached (agents by fingerprint, evaluations by the weights' sha256), so a rerun replays the
finished rounds from the caches and resumes where it stopped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentmerge.api import CONVERGENCE_SCALES as SCALES
from agentmerge.api import Score, check_agent
from agentmerge_zoo.build import Logger, build_zoo
from agentmerge_zoo.checksizes import CHECK_N, GROWTH, ROUNDS
from agentmerge_zoo.config import ZooConfig, seed_dirs, with_steps
from agentmerge_zoo.suite import ZooEvaluator
from agentmerge_zoo.tasks import SIX_DOMAINS, all_tasks, domain_tasks


def own_metric(domain: str) -> str:
    """The check's metric: the mean of the domain's columns (``memory.own``)."""
    return f"{domain}.own"


def own_point(score: Score, domain: str) -> tuple[float, float, int]:
    """The own-domain score of ``score``, its standard error (module docstring) and its prompt count."""
    tasks = all_tasks(SIX_DOMAINS)
    metrics = [m for t in domain_tasks(domain) for m in tasks[t].metrics]
    value = sum(score.metrics[m] for m in metrics) / len(metrics)
    per_task = [sum(score.stderr[m] for m in tasks[t].metrics) for t in domain_tasks(domain)]
    se = math.sqrt(sum(s * s for s in per_task)) / len(metrics)
    return value, se, min(score.count[m] for m in metrics)


class OwnDomainEvaluator(ZooEvaluator):
    """The zoo evaluator on one domain's tasks, adding the own-domain score ``DOMAIN.own`` with its SE."""

    def __init__(self, domain: str, n: int, cache: Path | None, batch_size: int = 250) -> None:
        super().__init__("validation", n=n, tasks=list(domain_tasks(domain)), batch_size=batch_size, cache=cache)
        self.domain = domain

    def score(self, checkpoint: Path) -> Score:
        score = super().score(checkpoint)
        value, se, count = own_point(score, self.domain)
        metric = own_metric(self.domain)
        return Score({**score.metrics, metric: value}, {**score.stderr, metric: se}, {**score.count, metric: count})


def check_seed(
    cfg: ZooConfig,
    zoo: dict[str, Path],
    evals: Path,
    scratch: Path,
    n: int = CHECK_N,
    log: Logger = lambda _m: None,
    scales: Sequence[float] = SCALES,
) -> dict[str, Any]:
    """Every agent of one seed's zoo: its check (``AgentCheck.as_dict``) and its recipe's steps, by domain."""
    out: dict[str, Any] = {}
    for domain in cfg.domains:
        evaluator = OwnDomainEvaluator(domain, n, evals, cfg.eval_batch)
        agent, metric = zoo[f"agent_{domain}"], own_metric(domain)
        check = check_agent(zoo["base"], agent, metric, evaluator, scratch, scales, log=log)
        out[domain] = check.as_dict() | {"steps": cfg.recipe(domain).steps}
    return out


def failing(checks: dict[int, dict[str, Any]], domains: Sequence[str]) -> list[str]:
    """The domains whose agent failed the check in some seed (an unknown verdict is not a failure)."""
    return [d for d in domains if any(seed[d]["converged"] is False for seed in checks.values())]


def longer(steps: int, growth: float = GROWTH) -> int:
    """The steps of the next round: ``ceil(steps * (1 + growth))``, at least one more."""
    return max(steps + 1, math.ceil(steps * (1.0 + growth)))


def converge(
    cfg: ZooConfig,
    seeds: Sequence[int],
    zoo_out: Path,
    work: Path,
    log: Logger,
    *,
    n: int = CHECK_N,
    rounds: int = ROUNDS,
    growth: float = GROWTH,
    threads: int | None = None,
) -> tuple[ZooConfig, list[dict[str, Any]]]:
    """Check, give the failing domains more steps, check again (module docstring); the final config and the
    rounds (each: the steps, every seed's checks, the failing domains)."""
    history: list[dict[str, Any]] = []
    for round_ in range(rounds + 1):
        checks: dict[int, dict[str, Any]] = {}
        for seed in seeds:
            zoo = build_zoo(cfg, zoo_out, seed, threads=threads, log=log)
            root, evals = seed_dirs(cfg, work, seed)
            checks[seed] = check_seed(cfg, zoo, evals, root / "check-scratch", n, log)
        bad = failing(checks, cfg.domains)
        steps = {d: cfg.recipe(d).steps for d in cfg.domains}
        history.append({"round": round_, "steps": steps, "checks": checks, "failing": bad})
        log(f"[{cfg.regime}] convergence round {round_}: steps {steps}; failing: {', '.join(bad) or 'none'}")
        if not bad or round_ == rounds:
            break
        cfg = with_steps(cfg, {d: longer(steps[d], growth) for d in bad})
    return cfg, history


def steps_text(cfg: ZooConfig) -> str:
    """The recipe steps as ``--steps`` takes them: ``code=160,tool=100,memory=200``."""
    return ",".join(f"{r.domain}={r.steps}" for r in cfg.recipes)
