"""Batched greedy or sampled completion of prompts with any causal-LM checkpoint."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from agentmerge_zoo.batching import decode_completions, prompt_batch


def generate_ids(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    max_new_tokens: int,
    *,
    sample: bool = False,
    temperature: float = 1.0,
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Generate for a batch; returns the prompt batch and the generated ids (padded after the end token)."""
    batch = prompt_batch(tokenizer, prompts)
    eos = tokenizer.eos_token_id
    kwargs: dict[str, Any] = {"do_sample": False}
    if sample:
        kwargs = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
    with torch.no_grad():
        out = model.generate(
            **batch,
            max_new_tokens=max_new_tokens,
            eos_token_id=eos,
            pad_token_id=tokenizer.pad_token_id,
            **kwargs,
        )
    return batch, out[:, batch["input_ids"].shape[1] :]


def complete(
    model: Any, tokenizer: Any, prompts: Sequence[str], max_new_tokens: int, batch_size: int = 250
) -> list[str]:
    """Greedy completions, batched over prompts sorted by length (less padding), in input order."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    texts: list[str] = [""] * len(prompts)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        _, ids = generate_ids(model, tokenizer, [prompts[i] for i in chunk], max_new_tokens)
        for i, text in zip(chunk, decode_completions(tokenizer, ids, tokenizer.eos_token_id), strict=True):
            texts[i] = text
    return texts
