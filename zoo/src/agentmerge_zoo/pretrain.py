"""Pretraining of the zoo's base model: next-token training on a weighted mixture of generated tasks.

The loss covers the answer and end token of each example (the prompts are random strings with nothing to
predict). Training runs in float32 with AdamW, linear warm-up and cosine decay; the result is saved in bfloat16.
The mixture and the step count are chosen so that the base solves each trained task sometimes but not reliably,
which leaves a learning signal for RL.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from agentmerge_zoo.batching import IGNORE, sft_batch
from agentmerge_zoo.modeling import ModelShape, new_model
from agentmerge_zoo.splits import train_stream
from agentmerge_zoo.taskbase import Example


def _default_mixture() -> dict[str, float]:
    return {"code": 1.0, "tool": 1.5, "memory": 0.8, "heldout": 0.5}


def _default_distractors() -> dict[str, float]:
    return {"code": 0.5, "tool": 0.5, "memory": 0.5}


@dataclass(frozen=True)
class PretrainConfig:
    """Budget and optimiser of base pretraining."""

    steps: int = 700
    batch_size: int = 64
    lr: float = 2e-3
    warmup: int = 60
    weight_decay: float = 0.01
    micro_batches: int = 4
    mixture: dict[str, float] = field(default_factory=_default_mixture)
    distractor_rate: dict[str, float] = field(default_factory=_default_distractors)


def _accumulate(model: Any, examples: list[Example], parts: int) -> float:
    """Backward over length-sorted micro-batches (less padding); returns the mean token loss."""
    examples = sorted(examples, key=lambda ex: len(ex.prompt) + len(ex.answer))
    size = -(-len(examples) // parts)
    chunks = [sft_batch(examples[i : i + size]) for i in range(0, len(examples), size)]
    total = sum(int((c["labels"] != IGNORE).sum()) for c in chunks)
    value = 0.0
    for chunk in chunks:
        share = int((chunk["labels"] != IGNORE).sum()) / total
        loss = model(**chunk).loss * share
        loss.backward()
        value += loss.item()
    return value


def lr_at(step: int, cfg: PretrainConfig) -> float:
    """Linear warm-up then cosine decay to 10 % of the peak."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def pretrain(
    cfg: PretrainConfig,
    shape: ModelShape,
    seed: int,
    exclude: frozenset[str],
    log: Callable[[str], None] = lambda _msg: None,
) -> tuple[Any, list[dict[str, float]]]:
    """Train a fresh model; returns it (float32) and a per-interval loss log."""
    model = new_model(shape, seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=cfg.weight_decay)
    stream = train_stream(cfg.mixture, seed, "pretrain", exclude, cfg.distractor_rate)
    history: list[dict[str, float]] = []
    started, running = time.perf_counter(), 0.0
    for step in range(cfg.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        opt.zero_grad(set_to_none=True)
        loss = _accumulate(model, [next(stream) for _ in range(cfg.batch_size)], cfg.micro_batches)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        running += loss
        if (step + 1) % 100 == 0 or step + 1 == cfg.steps:
            span = (step % 100) + 1
            history.append({"step": step + 1, "loss": running / span, "seconds": time.perf_counter() - started})
            log(f"pretrain step {step + 1}/{cfg.steps} loss {running / span:.4f}")
            running = 0.0
    model.eval()
    return model, history
