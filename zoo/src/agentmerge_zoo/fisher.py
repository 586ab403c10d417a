"""Diagonal Fisher information of a zoo agent on its own domain (input of Fisher merging).

F[p] = mean over prompts of (d/dθ_p log p(y | prompt))², with y a completion sampled from the model itself
(the true Fisher, not the empirical one on reference answers). The estimator is the generic one of
:mod:`agentmerge.evaluation.fisher`; this module only supplies the zoo's prompts and the model's own completions.
Saved as float32 safetensors with the model's tensor names; the tied output embedding is stored once, as in
the checkpoint.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoTokenizer

from agentmerge.api import FISHER_MARK, FisherSample, is_fisher
from agentmerge.api import diagonal_fisher as fisher_of_samples
from agentmerge_zoo.batching import completion_mask
from agentmerge_zoo.generation import generate_ids
from agentmerge_zoo.modeling import load_model
from agentmerge_zoo.splits import split_rng
from agentmerge_zoo.tasks import training_task


def _sample_prompts(domain: str, n: int, seed: int) -> list[str]:
    rng: random.Random = split_rng("fisher", domain, seed)
    task = training_task(domain)
    return [task.sample(rng).prompt for _ in range(n)]


def _own_completions(model: Any, tokenizer: Any, domain: str, n: int, seed: int) -> Iterator[FisherSample]:
    """Per prompt: ``prompt ids + a completion the model samples`` (up to and including its end token)."""
    task = training_task(domain)
    for prompt in _sample_prompts(domain, n, seed):
        batch, completion = generate_ids(model, tokenizer, [prompt], task.max_new_tokens, sample=True)
        keep = completion_mask(completion, tokenizer.eos_token_id)[0].bool()
        prompt_ids = batch["input_ids"][0]
        yield FisherSample(torch.cat([prompt_ids, completion[0][keep]]), prompt=len(prompt_ids))


def diagonal_fisher(checkpoint: Path, domain: str, n: int, seed: int) -> dict[str, torch.Tensor]:
    """Per-parameter mean squared score over ``n`` prompts of ``domain`` (one backward per prompt)."""
    torch.manual_seed(seed)
    model = load_model(checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    estimate = fisher_of_samples(model, _own_completions(model, tokenizer, domain, n, seed))
    stored = dict(model.named_parameters())  # tied weights once, as the checkpoint stores them
    return {name: value.contiguous() for name, value in estimate.items() if name in stored}


def save_fisher(fisher_values: dict[str, torch.Tensor], out: Path) -> Path:
    """Write the Fisher tensors (float32) to ``out`` (a .safetensors file), marked as a Fisher file.

    The mark (``FISHER_MARK`` in the metadata) is what the engine checks before it takes a file as Fisher.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(fisher_values, str(out), metadata=dict([FISHER_MARK]))
    return out


def is_fisher_file(path: Path) -> bool:
    """Whether ``path`` is a Fisher file the engine accepts (written by ``save_fisher`` with its mark)."""
    if not path.is_file():
        return False
    with safe_open(str(path), framework="pt") as handle:
        return is_fisher(handle.metadata() or {})
