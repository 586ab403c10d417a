"""Prompts in the chat template, greedy batched completion and GRPO's group sampling with a shared prompt cache.

A group of ``n`` completions of one prompt shares the prompt: it is run once, its key/value cache repeated ``n``
times (``DynamicCache.batch_repeat_interleave``), and the ``n`` continuations decoded token by token. With no
padding anywhere the positions are the plain ones. Sampling draws from ``softmax(logits / temperature)`` with an
explicit ``torch.Generator``; temperature 0 is greedy. A completion ends at the end-of-turn token (the
tokenizer's EOS); everything after it is EOS padding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def prompt_ids(tokenizer: Any, messages: Sequence[dict[str, str]]) -> list[int]:
    """Token ids of a chat, rendered by the tokenizer's own chat template with the assistant turn opened."""
    text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
    ids: list[int] = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids


def _next_token(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    if temperature <= 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def sample_group(
    model: Any,
    prompt: Sequence[int],
    n: int,
    max_new_tokens: int,
    eos_id: int,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """``n`` completions of one prompt, shape (n, T), T <= max_new_tokens; EOS after each completion's end."""
    out = model(input_ids=torch.tensor([list(prompt)]), use_cache=True, logits_to_keep=1)
    cache = out.cache
    cache.batch_repeat_interleave(n)
    logits = out.logits[:, -1].expand(n, -1)
    done = torch.zeros(n, dtype=torch.bool)
    tokens: list[torch.Tensor] = []
    for _ in range(max_new_tokens):
        token = _next_token(logits, temperature, generator).masked_fill(done, eos_id)
        tokens.append(token)
        done |= token == eos_id
        if bool(done.all()):
            break
        out = model(input_ids=token[:, None], cache=cache, use_cache=True)
        logits = out.logits[:, -1]
    return torch.stack(tokens, dim=1)


def completion_mask(completions: torch.Tensor, eos_id: int) -> torch.Tensor:
    """1 on each completion's tokens up to and including its first EOS, 0 after."""
    is_eos = (completions == eos_id).long()
    return ((is_eos.cumsum(dim=1) - is_eos) == 0).long()


def decode(tokenizer: Any, completions: torch.Tensor, eos_id: int) -> list[str]:
    """The text of each completion before its first EOS."""
    texts = []
    for row in completions.tolist():
        if eos_id in row:
            row = row[: row.index(eos_id)]
        texts.append(tokenizer.decode(row, skip_special_tokens=True))
    return texts


@torch.no_grad()
def greedy(model: Any, tokenizer: Any, prompts: Sequence[list[int]], max_new_tokens: int, batch: int = 16) -> list[str]:
    """Greedy completions of many prompts, left-padded batches of similar length, in input order."""
    eos = int(tokenizer.eos_token_id)
    pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    texts = [""] * len(prompts)
    for start in range(0, len(order), batch):
        chunk = order[start : start + batch]
        width = max(len(prompts[i]) for i in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, i in enumerate(chunk):
            ids[row, width - len(prompts[i]) :] = torch.tensor(prompts[i])
            mask[row, width - len(prompts[i]) :] = 1
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=pad,
        )
        for i, text in zip(chunk, decode(tokenizer, out[:, width:], eos), strict=True):
            texts[i] = text
    return texts
