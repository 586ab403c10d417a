"""Train one agent by GRPO from the base, resumable, and export it as a Hugging Face folder.

While training, ``OUT.state/`` holds the float32 weights, the AdamW state and the reward curve so far
(``state.json``, with the recipe and seed), rewritten every ``checkpoint_every`` steps and after the last one (a
new folder renamed into place, the old one kept as ``OUT.state.old`` until then). A rerun resumes from it: the
prompt stream skips the prompts already used and each step's sampling generator is seeded by (seed, step), so a
resumed run draws what an uninterrupted one would have. The learning rate is constant, so a finished agent
**extends**: a recipe that differs only in more ``steps`` continues from the kept final state and gives the agent
a fresh run of that many steps would (the convergence check's "more steps", at the cost of the new steps only;
the state takes about 12 bytes per parameter on disk: 1.6 GB for SmolLM2-135M). At the end the agent is written
to ``OUT/`` in the recipe's export dtype with the base's tokenizer and ``agent.json`` (recipe, seed, reward curve,
times) last: ``OUT/agent.json`` marks a finished agent, kept by a rerun with the same recipe and seed, extended by
one with more steps, and trained again from the base with any other.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from agentmerge.api import dumps_json
from agentmerge_zoo.real.grpo_hf import Recipe, grpo_step, make_optimizer
from agentmerge_zoo.real.suite import skill
from agentmerge_zoo.real.tasks import train_stream

MARKER = "agent.json"
EXPORT_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def is_trained(out: Path) -> bool:
    return (out / MARKER).is_file()


def finished(out: Path, recipe: Recipe, seed: int) -> dict[str, Any] | None:
    """The metadata of an agent already finished with this recipe and seed, else None."""
    if not is_trained(out):
        return None
    done: dict[str, Any] = json.loads((out / MARKER).read_text())
    return done if done["recipe"] == recipe.to_dict() and done["seed"] == seed else None


def _state_folder(out: Path) -> Path:
    state = out.with_name(out.name + ".state")
    old = state.with_name(state.name + ".old")
    if not (state / "state.json").is_file() and (old / "state.json").is_file():
        return old
    return state


def continues(saved: dict[str, Any] | None, recipe: Recipe, seed: int) -> bool:
    """Whether a saved state is a prefix of this run: the same seed and recipe but ``steps``, and no more steps."""
    if saved is None or saved.get("seed") != seed or len(saved["curve"]) > recipe.steps:
        return False
    return {**saved["recipe"], "steps": recipe.steps} == recipe.to_dict()


def why_not(saved: dict[str, Any], recipe: Recipe, seed: int) -> str:
    """Why a saved state is not a prefix of this run, in words."""
    if saved.get("seed") != seed:
        return f"seed {saved.get('seed')}, this run's {seed}"
    if len(saved["curve"]) > recipe.steps:
        return f"{len(saved['curve'])} steps saved, this run has {recipe.steps}"
    want = recipe.to_dict()
    diff = [
        f"{k} {saved['recipe'].get(k)!r} -> {v!r}"
        for k, v in want.items()
        if k != "steps" and saved["recipe"].get(k) != v
    ]
    return "recipe differs: " + ", ".join(diff)


def _load(
    base: Path, out: Path, recipe: Recipe, seed: int, log: Callable[[str], None]
) -> tuple[Any, torch.optim.Optimizer, list[dict[str, float]]]:
    """The model, optimiser and curve to continue from: the saved state if it is a prefix of this run, else the base
    (said in ``log`` when a saved state is there but is not: a retrain costs every step again)."""
    from transformers import AutoModelForCausalLM

    state = _state_folder(out)
    saved = json.loads((state / "state.json").read_text()) if (state / "state.json").is_file() else None
    source = state if continues(saved, recipe, seed) else base
    if saved is not None and source == base:
        reason = why_not(saved, recipe, seed)
        log(f"{out.name}: training from the base; the saved state in {state} does not continue this run ({reason})")
    model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32)
    opt = make_optimizer(model, recipe)
    if source == state and saved is not None:
        opt.load_state_dict(torch.load(state / "optim.pt", weights_only=True))
        return model, opt, list(saved["curve"])
    return model, opt, []


def _save_state(out: Path, model: Any, opt: torch.optim.Optimizer, recipe: Recipe, seed: int, curve: list[Any]) -> None:
    state = out.with_name(out.name + ".state")
    tmp, old = state.with_name(state.name + ".tmp"), state.with_name(state.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp))
    torch.save(opt.state_dict(), tmp / "optim.pt")
    (tmp / "state.json").write_text(dumps_json({"recipe": recipe.to_dict(), "seed": seed, "curve": curve}) + "\n")
    shutil.rmtree(old, ignore_errors=True)
    if state.exists():
        state.rename(old)
    tmp.rename(state)
    shutil.rmtree(old, ignore_errors=True)


def _export(model: Any, tokenizer: Any, out: Path, meta: dict[str, Any], dtype: str) -> None:
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.to(EXPORT_DTYPES[dtype]).save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    (tmp / MARKER).write_text(dumps_json(meta, indent=1) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def train_agent(
    base: Path,
    out: Path,
    recipe: Recipe,
    seed: int,
    checkpoint_every: int = 10,
    log: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    """Train (or resume), export, return the agent's metadata; an agent finished with this recipe and seed is kept."""
    done = finished(out, recipe, seed)
    if done is not None:
        return done
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(base))
    model, opt, curve = _load(base, out, recipe, seed, log)
    stream = train_stream(skill(recipe.skill), seed, f"grpo-{recipe.skill}")
    for _ in range(len(curve) * recipe.prompts_per_step):
        next(stream)
    for step in range(len(curve), recipe.steps):
        generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
        examples = [next(stream) for _ in range(recipe.prompts_per_step)]
        wall, cpu = time.perf_counter(), time.process_time()
        row = {"step": step + 1, **grpo_step(model, tokenizer, opt, recipe, examples, generator)}
        row |= {"seconds": time.perf_counter() - wall, "cpu_seconds": time.process_time() - cpu}
        curve.append(row)
        log(f"{out.name} step {step + 1}/{recipe.steps} reward {row['reward']:.3f} signal {row['signal']:.2f}")
        if (step + 1) % checkpoint_every == 0 or step + 1 == recipe.steps:
            _save_state(out, model, opt, recipe, seed, curve)  # the last one is kept: more steps extend it
    meta = {"recipe": recipe.to_dict(), "seed": seed, "base": str(base), "curve": curve}
    meta["seconds"] = sum(r["seconds"] for r in curve)
    _export(model, tokenizer, out, meta, recipe.export)
    return meta
