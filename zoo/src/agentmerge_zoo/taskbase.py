"""What every zoo task is: an example (prompt, answer), the task interface, and the shared score rules."""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass

from agentmerge_zoo.minilang import parse_int

LETTERS = "abcdefghijklmnopqrstuvwxyz"


@dataclass(frozen=True)
class Example:
    """One prompt with its reference answer."""

    task: str
    prompt: str
    answer: str


class Task(ABC):
    """A generated task: samples examples and scores completions against the prompt."""

    name: str
    domain: str
    tag: str
    max_new_tokens: int
    metrics: tuple[str, ...]

    @abstractmethod
    def make(self, rng: random.Random) -> tuple[str, str]:
        """Return (prompt body, answer) for one random instance."""

    @abstractmethod
    def score(self, prompt: str, completion: str) -> dict[str, float]:
        """Score a completion (text after the prompt, without end token) for every metric of the task."""

    suffix: str = ">"

    def sample(self, rng: random.Random) -> Example:
        body, answer = self.make(rng)
        return Example(self.name, f"{self.tag}:{body}{self.suffix}", answer)

    def distractor(self, body: str, answer: str) -> str:
        """A plausible wrong answer that follows a simple wrong habit (used to make pretraining noisy)."""
        return answer

    def reward(self, prompt: str, completion: str) -> float:
        """RL reward: the task's first (strictest) metric."""
        return self.score(prompt, completion)[self.metrics[0]]

    def body(self, prompt: str) -> str:
        """Strip the tag and the suffix ('>' for most tasks) from a prompt."""
        head = f"{self.tag}:"
        if not prompt.startswith(head) or not prompt.endswith(self.suffix):
            raise ValueError(f"not a {self.name} prompt: {prompt!r}")
        return prompt[len(head) : len(prompt) - len(self.suffix)]


def int_scores(prefix: str, expected: int, completion: str) -> dict[str, float]:
    """``{prefix}.exact`` and ``{prefix}.partial`` = 1/(1+|error|) (0 if the completion is not an integer)."""
    got = parse_int(completion)
    exact = float(got is not None and got == expected)
    partial = 0.0 if got is None else 1.0 / (1.0 + abs(got - expected))
    return {f"{prefix}.exact": exact, f"{prefix}.partial": partial}


def text_scores(prefix: str, expected: str, completion: str) -> dict[str, float]:
    """``{prefix}.exact`` and ``{prefix}.char``: the share of positions that match, over the longer text."""
    same = sum(a == b for a, b in zip(completion, expected, strict=False))
    char = same / max(len(completion), len(expected))
    return {f"{prefix}.exact": float(completion == expected), f"{prefix}.char": char}
