"""Diagonal Fisher information of a zoo agent on its own domain (input of Fisher merging).

F[p] = mean over prompts of (d/dθ_p log p(y | prompt))², with y a completion sampled from the model itself
(the true Fisher, not the empirical one on reference answers). Saved as float32 safetensors with the model's
tensor names; the tied output embedding is stored once, as in the checkpoint.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoTokenizer

from agentmerge.zoo.batching import completion_mask, position_ids
from agentmerge.zoo.generation import generate_ids
from agentmerge.zoo.modeling import load_model
from agentmerge.zoo.splits import split_rng
from agentmerge.zoo.tasks import training_task


def _sample_prompts(domain: str, n: int, seed: int) -> list[str]:
    rng: random.Random = split_rng("fisher", domain, seed)
    task = training_task(domain)
    return [task.sample(rng).prompt for _ in range(n)]


def diagonal_fisher(checkpoint: Path, domain: str, n: int, seed: int) -> dict[str, torch.Tensor]:
    """Per-parameter mean squared score over ``n`` prompts of ``domain`` (one backward per prompt)."""
    torch.manual_seed(seed)
    model = load_model(checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    task = training_task(domain)
    totals = {name: torch.zeros_like(p) for name, p in model.named_parameters()}
    for prompt in _sample_prompts(domain, n, seed):
        batch, completion = generate_ids(model, tokenizer, [prompt], task.max_new_tokens, sample=True)
        cmask = completion_mask(completion, tokenizer.eos_token_id)
        ids = torch.cat([batch["input_ids"], completion], dim=1)
        mask = torch.cat([batch["attention_mask"], cmask], dim=1)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).logits
        width = batch["input_ids"].shape[1]
        logp = torch.log_softmax(logits[:, width - 1 : -1], dim=-1).gather(-1, completion.unsqueeze(-1))
        model.zero_grad(set_to_none=True)
        (logp.squeeze(-1) * cmask).sum().backward()  # type: ignore[no-untyped-call]
        for name, param in model.named_parameters():
            if param.grad is not None:
                totals[name] += param.grad.detach() ** 2
    return {name: (total / n).contiguous() for name, total in totals.items()}


def save_fisher(fisher: dict[str, torch.Tensor], out: Path) -> Path:
    """Write the Fisher tensors (float32) to ``out`` (a .safetensors file)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(fisher, str(out))
    return out
