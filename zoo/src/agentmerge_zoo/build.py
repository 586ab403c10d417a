"""Build one seed of the zoo: pretrain the base, then RL-train one agent per domain from it.

Layout under ``OUT/seed{S}/`` (``OUT/six/seed{S}/`` for the six-domain zoo, which has its own base):
``base/`` and ``agent_{domain}/`` (HF folders) for the default bf16 recipes;
agents of other precision regimes live next to them in ``agent_{domain}.{storage}-lr{lr}-s{steps}-{export}/``
(one base per seed serves every regime), and ``rl_state/`` (each training's end state, :func:`state_path`).
Each stage is skipped when its
folder is complete and was built from the same settings (fingerprint in ``zoo_stage.json``), so an interrupted
build resumes where it stopped.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import torch
from transformers import AutoTokenizer

from agentmerge.api import dumps_json, quiet_transformers
from agentmerge_zoo.config import ZooConfig, regime_recipes
from agentmerge_zoo.grpo import EXPORTS, Recipe, TrainState, grpo_run
from agentmerge_zoo.modeling import is_complete, load_model, read_stage, save_checkpoint
from agentmerge_zoo.pretrain import pretrain
from agentmerge_zoo.splits import held_out_prompts
from agentmerge_zoo.tasks import SIX_DOMAINS

Logger = Callable[[str], None]


def stderr_logger(quiet: bool = False) -> Logger:
    """A logger that writes timestamped lines to stderr (or nothing)."""
    start = time.perf_counter()

    def log(msg: str) -> None:
        if not quiet:
            print(f"[zoo {time.perf_counter() - start:7.1f}s] {msg}", file=sys.stderr, flush=True)

    return log


def seed_dir(out: Path, seed: int) -> Path:
    return out / f"seed{seed}"


def agent_dir(out: Path, seed: int, domain: str, recipe: Recipe | None = None) -> Path:
    """``seed{S}/agent_{domain}`` for the default bf16 recipe; other recipes get a folder named by their
    precision, lr and steps, so regimes that share a training (or a whole agent) share its folder."""
    default = next(r for r in regime_recipes("bf16", SIX_DOMAINS) if r.domain == domain)
    if recipe is None or (recipe.storage, recipe.export, recipe.lr) == (default.storage, default.export, default.lr):
        return seed_dir(out, seed) / f"agent_{domain}"
    return seed_dir(out, seed) / f"agent_{domain}.{recipe_tag(recipe)}"


def recipe_tag(recipe: Recipe) -> str:
    """``fp32_master-lr3e-06-s100-fp32``: storage, learning rate, steps and export dtype."""
    return f"{recipe.storage}-lr{recipe.lr:g}-s{recipe.steps}-{recipe.export}"


def base_dir(out: Path, seed: int) -> Path:
    return seed_dir(out, seed) / "base"


def zoo_root(cfg: ZooConfig, out: Path) -> Path:
    """Where a config's seeds live: ``OUT`` for the core zoo, ``OUT/six`` for the six-domain one."""
    return out if cfg.suite == "core" else out / cfg.suite


def _up_to_date(path: Path, fingerprint: str) -> bool:
    return is_complete(path) and read_stage(path).get("fingerprint") == fingerprint


def rl_seed(seed: int, domain: str) -> int:
    """Explicit per-agent RL seed derived from the pipeline seed."""
    return 1000 * seed + 1 + SIX_DOMAINS.index(domain)


def build_base(cfg: ZooConfig, out: Path, seed: int, log: Logger) -> Path:
    """Pretrain and save the base unless an up-to-date one exists."""
    path = base_dir(out, seed)
    fingerprint = cfg.fingerprint("base")
    if _up_to_date(path, fingerprint):
        log(f"seed {seed}: base is up to date, skipping")
        return path
    started = time.perf_counter()
    exclude = held_out_prompts(cfg.n_val, cfg.n_test, cfg.domains)
    model, history = pretrain(cfg.pretrain, cfg.shape, seed, exclude, log)
    meta = {"stage": "base", "seed": seed, "fingerprint": fingerprint, "config": cfg.name}
    meta["seconds"] = round(time.perf_counter() - started, 1)
    meta["pretrain"] = {**asdict(cfg.pretrain), "history": history}
    save_checkpoint(model, path, meta)
    log(f"seed {seed}: base saved to {path} ({meta['seconds']} s)")
    return path


def build_agent(cfg: ZooConfig, out: Path, seed: int, domain: str, log: Logger) -> Path:
    """RL-train one agent from the base unless an up-to-date one exists; writes recipe.json.

    A recipe with float32 master weights is saved in both export dtypes at once (the other export goes to the
    folder of the same recipe with the other ``export``), so the fp32- and bf16-exported regimes share one
    training and differ only by the final rounding.
    """
    recipe = cfg.recipe(domain)
    path = agent_dir(out, seed, domain, recipe)
    fingerprint = cfg.agent_fingerprint(recipe)
    if _up_to_date(path, fingerprint):
        log(f"seed {seed}: {path.name} is up to date, skipping")
        return path
    base = base_dir(out, seed)
    started = time.perf_counter()
    model = load_model(base)
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    exclude = held_out_prompts(cfg.n_val, cfg.n_test, cfg.domains)
    resume = latest_state(cfg, out, seed, recipe)
    if resume is not None:
        log(f"seed {seed}: {domain} continues its training from step {resume.steps} to {recipe.steps}")
    state = grpo_run(model, tokenizer, recipe, rl_seed(seed, domain), exclude, log, resume)
    state.save(state_path(cfg, out, seed, recipe, recipe.steps))
    history = state.history
    seconds = round(time.perf_counter() - started, 1)
    exports = [recipe]
    if recipe.storage == "fp32_master":
        exports += [replace(recipe, export=e) for e in EXPORTS if e != recipe.export]
    for variant in exports:
        folder = agent_dir(out, seed, domain, variant)
        meta = {"stage": f"agent_{domain}", "seed": seed, "fingerprint": cfg.agent_fingerprint(variant)}
        meta.update({"seconds": seconds, "rl_seed": rl_seed(seed, domain), "recipe_tag": recipe_tag(variant)})
        meta["continued_from"] = resume.steps if resume is not None else 0
        save_checkpoint(model, folder, meta, export=variant.export)
        (folder / "recipe.json").write_text(dumps_json(variant.to_dict(), indent=2) + "\n")
        (folder / "train_log.json").write_text(dumps_json(history) + "\n")
    log(f"seed {seed}: {path.name} saved ({seconds} s)")
    return path


def state_path(cfg: ZooConfig, out: Path, seed: int, recipe: Recipe, steps: int) -> Path:
    """``seed{S}/rl_state/{domain}-{key}-s{steps}.pt``: the end state of ``recipe``'s training at ``steps``; the
    key is the recipe's fingerprint without its steps and export, so every length of one training shares it."""
    key = cfg.agent_fingerprint(replace(recipe, steps=0, export="bf16"))
    return seed_dir(out, seed) / "rl_state" / f"{recipe.domain}-{key}-s{steps}.pt"


def latest_state(cfg: ZooConfig, out: Path, seed: int, recipe: Recipe) -> TrainState | None:
    """The saved state of the same training with the most steps not above ``recipe.steps`` (None: train afresh).

    This is how an agent gets more steps (``with_steps``, the convergence loop): its training continues from
    where it stopped, and the result equals training the longer recipe from scratch."""
    stem = state_path(cfg, out, seed, recipe, 0).name.removesuffix("0.pt")  # DOMAIN-KEY-s
    found = []
    for path in state_path(cfg, out, seed, recipe, 0).parent.glob(f"{stem}*.pt"):
        steps = path.name.removeprefix(stem).removesuffix(".pt")
        if steps.isdigit() and int(steps) <= recipe.steps:
            found.append((int(steps), path))
    return TrainState.load(max(found)[1]) if found else None


def build_zoo(
    cfg: ZooConfig, out: Path, seed: int, *, threads: int | None = None, log: Logger | None = None
) -> dict[str, Path]:
    """Build (or resume) every stage of one seed under :func:`zoo_root`; returns name -> checkpoint folder."""
    quiet_transformers()
    log = log or stderr_logger()
    if threads is not None:
        torch.set_num_threads(threads)
    out = zoo_root(cfg, out)
    paths = {"base": build_base(cfg, out, seed, log)}
    for domain in cfg.domains:
        paths[f"agent_{domain}"] = build_agent(cfg, out, seed, domain, log)
    return paths
