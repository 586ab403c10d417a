"""Decoding choices shared by the generating evaluators: sampled decoding, and stopping at strings.

``Sampling`` draws with temperature and nucleus (top-p) sampling and no top-k cut, torch seeded per batch.
``stop_rule`` ends a row of a batch once its newly generated text holds a stop string (each row alone, so the
others of the batch go on); ``cut_at`` then cuts the text before that string.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Sampling:
    """Sampled decoding instead of greedy: temperature, nucleus ``top_p`` (no top-k cut), the torch seed."""

    temperature: float = 0.8
    top_p: float = 0.95
    seed: int = 0


def stop_rule(tokenizer: Any, stop: Sequence[str], start: int) -> Any:
    """A transformers stopping criterion: a row is done once the text of its last tokens after column ``start``
    holds one of the ``stop`` strings (works with any vocabulary, unlike ``stop_strings``)."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    window = max(len(s) for s in stop) + 2  # tokens; each decodes to at least one character

    class Stop(StoppingCriteria):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
            tails = tokenizer.batch_decode(input_ids[:, max(start, input_ids.shape[1] - window) :])
            return torch.tensor([any(s in t for s in stop) for t in tails], device=input_ids.device)

    return StoppingCriteriaList([Stop()])


def cut_at(text: str, stop: Sequence[str]) -> str:
    """``text`` up to (without) the first of the ``stop`` strings it holds."""
    ends = [k for k in (text.find(s) for s in stop) if k >= 0]
    return text[: min(ends)] if ends else text


def decoding_options(sampling: Sampling | None, stop: Sequence[str], tokenizer: Any, start: int) -> dict[str, Any]:
    """``generate`` keywords: greedy, or sampled (torch seeded now); a stop rule for ``stop`` after column ``start``."""
    drawn: dict[str, Any] = {"do_sample": False}
    if sampling is not None:
        import torch

        torch.manual_seed(sampling.seed)
        drawn = {"do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": 0}
    if stop:
        drawn["stopping_criteria"] = stop_rule(tokenizer, stop, start)
    return drawn
