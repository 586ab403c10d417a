"""Measurements that size the real zoo's budget: base accuracy per skill, evaluation cost, GRPO step cost.

Times are reported both as wall seconds and as this process's CPU seconds (``time.process_time``): on a machine
shared with other jobs the wall time says little, while the CPU seconds divided by the cores (times their
parallel efficiency) estimate the wall time on idle cores. A few GRPO steps per skill, from a fresh copy of
the base each, double as a pilot: their rewards show whether the recipe moves anything.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentmerge_zoo.real.config import RealConfig
from agentmerge_zoo.real.suite import HELD_OUT, SKILLS


def _timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    value = fn()
    return value, time.perf_counter() - wall, time.process_time() - cpu


def measure_eval(model: Any, tokenizer: Any, names: Sequence[str], n: int) -> dict[str, Any]:
    """Greedy validation scores of ``names`` and their cost per prompt."""
    from agentmerge_zoo.real.evaluate import score_model
    from agentmerge_zoo.real.sampling import prompt_ids
    from agentmerge_zoo.real.tasks import eval_set

    out = {}
    for name in names:
        scored = functools.partial(score_model, model, tokenizer, [name], "val", n, samples=4)
        (report, shown), wall, cpu = _timed(scored)
        row = {k: v for k, v in report[name].items() if k != "values"}
        lengths = [len(prompt_ids(tokenizer, ex.messages())) for ex in eval_set(SKILLS[name], "val", n)]
        row |= {"wall_per_prompt": wall / n, "cpu_per_prompt": cpu / n, "prompt_tokens": sum(lengths) / n}
        out[name] = row | {"samples": shown[name]}
    return out


def measure_grpo(
    base: Path, name: str, steps: int, lr_scale: float, log: Callable[[str], None], cfg: RealConfig
) -> dict[str, Any]:
    """``steps`` GRPO steps of ``cfg``'s recipe from a fresh copy of the base (nothing saved)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentmerge_zoo.real.grpo_hf import grpo_step, make_optimizer
    from agentmerge_zoo.real.tasks import train_stream

    recipe = cfg.recipe(name)
    recipe = replace(recipe, steps=steps, lr=recipe.lr * lr_scale)
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    opt = make_optimizer(model, recipe)
    stream = train_stream(SKILLS[name], 0, "measure")
    rows = []
    for step in range(steps):
        examples = [next(stream) for _ in range(recipe.prompts_per_step)]
        generator = torch.Generator().manual_seed(step)
        row, wall, cpu = _timed(functools.partial(grpo_step, model, tokenizer, opt, recipe, examples, generator))
        rows.append({"step": step + 1, **row, "seconds": wall, "cpu_seconds": cpu})
        log(f"measure {name} step {step + 1}: reward {row['reward']:.3f} cpu {cpu:.1f} s wall {wall:.1f} s")
    mean = {k: sum(r[k] for r in rows) / len(rows) for k in ("seconds", "cpu_seconds", "tokens")}
    return {"recipe": recipe.to_dict(), "steps": rows, "mean": mean}


def measure(
    base: Path,
    n: int,
    steps: int,
    skills: Sequence[str] | None,
    lr_scale: float,
    log: Callable[[str], None],
    cfg: RealConfig | None = None,
) -> dict[str, Any]:
    """Base scores and costs of ``skills`` (default: all), GRPO steps of the lineup's (``cfg``: default zoo's)."""
    cfg = cfg or RealConfig()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    names = list(skills or SKILLS)
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    model: Any = AutoModelForCausalLM.from_pretrained(str(base), dtype="auto")  # as the evaluation runs it
    model.eval()
    out: dict[str, Any] = {"base": str(base), "n": n, "eval": {}, "grpo": {}}
    if n > 0:  # n = 0: GRPO steps only (a pilot)
        out["eval"] = measure_eval(model, tokenizer, names, n)
    for name in out["eval"]:
        log(f"measure {name}: base {100 * out['eval'][name]['strict']:.1f} % strict")
    del model
    for name in (s for s in names if s in cfg.trained and steps > 0):
        out["grpo"][name] = measure_grpo(base, name, steps, lr_scale, log, cfg)
    if set(out["eval"]) >= {*cfg.trained, *HELD_OUT} and set(out["grpo"]) == set(cfg.trained):
        out["budget"] = budget(out, cfg)
    return out


def budget(measured: dict[str, Any], cfg: RealConfig) -> dict[str, Any]:
    """``cfg``'s seed cost from these measurements (``budget.seed_cost``), with the method counts."""
    from agentmerge_zoo.fair import output_scale
    from agentmerge_zoo.real.bench import bench_methods, needs_fisher
    from agentmerge_zoo.real.budget import seed_cost

    methods = bench_methods(cfg.bench)
    scaled = sum(output_scale(m) is not None for m in methods)
    cost = seed_cost(cfg, measured, len(methods), scaled)
    return {"methods": len(methods), "scaled": scaled, "fisher": sum(map(needs_fisher, methods)), "cpu": cost}
