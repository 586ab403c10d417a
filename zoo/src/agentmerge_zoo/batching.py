"""Tensor batches for training and generation with the character tokenizer.

Training batches are right-padded ``<bos> prompt answer <eos>`` sequences whose labels cover only the answer
and end token. Generation batches are left-padded prompts; completions are cut at the first end token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from agentmerge_zoo.taskbase import Example
from agentmerge_zoo.vocab import BOS_ID, EOS_ID, PAD_ID, char_vocab

IGNORE = -100
_VOCAB = char_vocab()


def encode(text: str) -> list[int]:
    """Character ids of a text (no specials); unknown characters are an error for zoo data."""
    return [_VOCAB[ch] for ch in text]


def sft_batch(examples: Sequence[Example]) -> dict[str, torch.Tensor]:
    """Right-padded input ids, attention mask and answer-only labels."""
    rows = [([BOS_ID, *encode(ex.prompt)], [*encode(ex.answer), EOS_ID]) for ex in examples]
    width = max(len(p) + len(a) for p, a in rows)
    ids = torch.full((len(rows), width), PAD_ID, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (prompt, answer) in enumerate(rows):
        n = len(prompt) + len(answer)
        ids[i, :n] = torch.tensor(prompt + answer)
        labels[i, len(prompt) : n] = torch.tensor(answer)
        mask[i, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def prompt_batch(tokenizer: Any, prompts: Sequence[str]) -> dict[str, torch.Tensor]:
    """Left-padded prompt batch through the checkpoint's own tokenizer."""
    tokenizer.padding_side = "left"
    enc = tokenizer(list(prompts), return_tensors="pt", padding=True)
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


def completion_mask(completion_ids: torch.Tensor, eos_id: int) -> torch.Tensor:
    """1 for generated tokens up to and including the first end token, 0 after it."""
    is_eos = (completion_ids == eos_id).long()
    after_eos = (is_eos.cumsum(dim=1) - is_eos) > 0
    return (~after_eos).long()


def decode_completions(tokenizer: Any, completion_ids: torch.Tensor, eos_id: int) -> list[str]:
    """Text of each completion up to (not including) its first end token."""
    texts: list[str] = []
    for row in completion_ids.tolist():
        if eos_id in row:
            row = row[: row.index(eos_id)]
        texts.append(tokenizer.decode(row, skip_special_tokens=True))
    return texts


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that start at 0 on each row's first real token (for left-padded inputs)."""
    return (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
