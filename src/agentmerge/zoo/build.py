"""Build one seed of the zoo: pretrain the base, then RL-train one agent per domain from it.

Layout under ``OUT/seed{S}/``: ``base/`` and ``agent_{domain}/`` (HF folders). Each stage is skipped when its
folder is complete and was built from the same settings (fingerprint in ``zoo_stage.json``), so an interrupted
build resumes where it stopped.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
from transformers import AutoTokenizer

from agentmerge.zoo.config import DOMAINS, ZooConfig
from agentmerge.zoo.grpo import grpo_train
from agentmerge.zoo.modeling import is_complete, load_model, read_stage, save_checkpoint
from agentmerge.zoo.pretrain import pretrain
from agentmerge.zoo.quiet import quiet_transformers
from agentmerge.zoo.splits import held_out_prompts

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


def agent_dir(out: Path, seed: int, domain: str) -> Path:
    return seed_dir(out, seed) / f"agent_{domain}"


def base_dir(out: Path, seed: int) -> Path:
    return seed_dir(out, seed) / "base"


def _up_to_date(path: Path, fingerprint: str) -> bool:
    return is_complete(path) and read_stage(path).get("fingerprint") == fingerprint


def rl_seed(seed: int, domain: str) -> int:
    """Explicit per-agent RL seed derived from the pipeline seed."""
    return 1000 * seed + 1 + DOMAINS.index(domain)


def build_base(cfg: ZooConfig, out: Path, seed: int, log: Logger) -> Path:
    """Pretrain and save the base unless an up-to-date one exists."""
    path = base_dir(out, seed)
    fingerprint = cfg.fingerprint("base")
    if _up_to_date(path, fingerprint):
        log(f"seed {seed}: base is up to date, skipping")
        return path
    started = time.perf_counter()
    exclude = held_out_prompts(cfg.n_val, cfg.n_test)
    model, history = pretrain(cfg.pretrain, cfg.shape, seed, exclude, log)
    meta = {"stage": "base", "seed": seed, "fingerprint": fingerprint, "config": cfg.name}
    meta["seconds"] = round(time.perf_counter() - started, 1)
    meta["pretrain"] = {**asdict(cfg.pretrain), "history": history}
    save_checkpoint(model, path, meta)
    log(f"seed {seed}: base saved to {path} ({meta['seconds']} s)")
    return path


def build_agent(cfg: ZooConfig, out: Path, seed: int, domain: str, log: Logger) -> Path:
    """RL-train one agent from the base unless an up-to-date one exists; writes recipe.json."""
    path = agent_dir(out, seed, domain)
    fingerprint = cfg.fingerprint(domain)
    if _up_to_date(path, fingerprint):
        log(f"seed {seed}: agent_{domain} is up to date, skipping")
        return path
    base = base_dir(out, seed)
    started = time.perf_counter()
    model = load_model(base)
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    recipe = cfg.recipe(domain)
    exclude = held_out_prompts(cfg.n_val, cfg.n_test)
    history = grpo_train(model, tokenizer, recipe, rl_seed(seed, domain), exclude, log)
    seconds = round(time.perf_counter() - started, 1)
    meta = {"stage": f"agent_{domain}", "seed": seed, "fingerprint": fingerprint, "seconds": seconds}
    meta["rl_seed"] = rl_seed(seed, domain)
    save_checkpoint(model, path, meta)
    (path / "recipe.json").write_text(json.dumps(recipe.to_dict(), indent=2) + "\n")
    (path / "train_log.json").write_text(json.dumps(history) + "\n")
    log(f"seed {seed}: agent_{domain} saved ({seconds} s)")
    return path


def build_zoo(
    cfg: ZooConfig, out: Path, seed: int, *, threads: int | None = None, log: Logger | None = None
) -> dict[str, Path]:
    """Build (or resume) every stage of one seed; returns name -> checkpoint folder."""
    quiet_transformers()
    log = log or stderr_logger()
    if threads is not None:
        torch.set_num_threads(threads)
    paths = {"base": build_base(cfg, out, seed, log)}
    for domain in DOMAINS:
        paths[f"agent_{domain}"] = build_agent(cfg, out, seed, domain, log)
    return paths
