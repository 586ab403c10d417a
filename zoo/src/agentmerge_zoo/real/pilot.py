"""A pilot for one agent's recipe: train it in stages of more steps, score it on test after each stage.

``zoo real pilot`` answers "how many steps (or which learning rate, prompts per step, group size) does this agent
need to beat the base?" before a whole seed is run with it. The recipe is ``config.full_recipes()``'s for the skill
with the options given; the agent trains as the zoo trains it (``train.train_agent``), so each stage **extends**
the agent of the stage before it and costs only its new steps. After each stage the agent and the base answer the
same test prompts of the skill, greedy as the bench scores them, and the row gives both scores (strict, and the mean
partial credit where the skill gives it) and the paired gain: mean ± SE over prompts of agent - base (strict), the
bar of the real-zoo issue being a gain above 2 SE.

With ``check`` the agent of the last stage also takes the zoo's convergence check (``convergence.check_agent``:
its own skill on validation at theta0 + s tau, s = 0.5 / 1 / 1.5 / 2), recorded as ``check`` with its steps.

The record (``--json``) is rewritten after each stage, so a cut-off pilot keeps what it measured, and a rerun with
more stages and the same options skips the stages already in it. A stage with fewer steps than the agent in
``work`` already has (same recipe otherwise, same seed) is refused: ``train_agent`` would train that shorter
recipe again from the base.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentmerge.api import dumps_json
from agentmerge_zoo.real.evaluate import evaluate_cached, mean_se
from agentmerge_zoo.real.grpo_hf import Recipe
from agentmerge_zoo.real.train import MARKER, continues, train_agent


def paired_gain(agent: Sequence[float], base: Sequence[float]) -> tuple[float, float]:
    """Mean ± SE, in points, of the per-prompt differences agent - base (the same prompts, in order)."""
    mean, se = mean_se([a - b for a, b in zip(agent, base, strict=True)])
    return 100 * mean, 100 * se


def stage_row(curve: Sequence[dict[str, Any]], agent: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """One stage's row from the agent's reward curve and the two reports of its skill (``evaluate``'s)."""
    gain, se = paired_gain(agent["values"], base["values"])
    head, tail = curve[:10], curve[-10:]
    return {
        "steps": len(curve),
        "base": 100 * base["strict"],
        "agent": 100 * agent["strict"],
        "agent_se": 100 * agent["strict_se"],
        "base_partial": base.get("partial"),  # mean partial credit on test: progress that strict cannot see yet
        "agent_partial": agent.get("partial"),
        "paired_gain": gain,
        "paired_se": se,
        "clears_2se": gain > 2 * se,
        "train_reward_first10": sum(r["reward"] for r in head) / max(1, len(head)),
        "train_reward_last10": sum(r["reward"] for r in tail) / max(1, len(tail)),
        "cpu_seconds": sum(r["cpu_seconds"] for r in curve),
    }


def _resumed(record: dict[str, Any], saved_at: Path) -> dict[str, Any]:
    """The saved record when it was made with the same recipe, seed and test size; else ``record``."""
    if not saved_at.is_file():
        return record
    saved: dict[str, Any] = json.loads(saved_at.read_text())
    same = all(saved.get(k) == v for k, v in record.items() if k not in ("stages", "check"))
    return saved if same else record


def run_pilot(
    base: Path,
    work: Path,
    recipe: Recipe,
    seed: int,
    stages: Sequence[int],
    n_test: int,
    out_json: Path,
    check: int = 0,
    log: Callable[[str], None] = lambda _m: None,
    dtype: str = "auto",
) -> dict[str, Any]:
    """Train ``recipe``'s agent to each of ``stages`` steps in turn under ``work``, scoring it after each (computed
    in ``dtype``, ``evaluate.DTYPES``); with ``check`` > 0, the convergence check of the last stage's agent on
    ``check`` validation prompts."""
    cache = work / "evals"
    base_report = evaluate_cached(base, [recipe.skill], "test", n_test, cache, dtype)[recipe.skill]
    agent_dir = work / f"seed{seed}" / f"agent_{recipe.skill}"
    fresh = {"recipe": recipe.to_dict(), "seed": seed, "n_test": n_test, "stages": []}
    fresh |= {"eval_dtype": dtype} if dtype != "auto" else {}
    record = _resumed(fresh, out_json)
    done = {row["steps"] for row in record["stages"]}
    for steps in sorted(set(stages) - done):
        trained = _trained_steps(agent_dir, recipe, seed)
        if steps < trained:
            raise ValueError(f"{agent_dir}: trained to {trained} steps already; a stage of {steps} would start over")
        started = time.perf_counter()
        meta = train_agent(base, agent_dir, replace(recipe, steps=steps), seed, log=log)
        report = evaluate_cached(agent_dir, [recipe.skill], "test", n_test, cache, dtype)[recipe.skill]
        row = stage_row(meta["curve"], report, base_report) | {"wall_seconds": time.perf_counter() - started}
        record["stages"].append(row)
        done.add(steps)
        log(dumps_json(row))
        _write(record, out_json)
    last = max(done)
    if check and record.get("check", {}).get("steps") != last:
        from agentmerge_zoo.real.convergence import check_agent

        verdict = check_agent(base, agent_dir, recipe.skill, work / "check", check, cache, log=log, dtype=dtype)
        record["check"] = {"steps": last, "n": check} | verdict
        _write(record, out_json)
    return record


def _trained_steps(agent_dir: Path, recipe: Recipe, seed: int) -> int:
    """Steps of the finished agent in ``agent_dir`` that ``recipe`` (any steps) would extend; 0 when there is none."""
    marker = agent_dir / MARKER
    if not marker.is_file():
        return 0
    meta = json.loads(marker.read_text())
    steps = len(meta["curve"])
    return steps if continues(meta, replace(recipe, steps=steps), seed) else 0


def _write(record: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(dumps_json(record, indent=1) + "\n")
    tmp.replace(path)
