"""Skills of the real zoo: generated chat prompts with verifiable rewards, and their disjoint splits.

A skill draws examples from a seeded ``random.Random`` and scores a completion: ``strict`` (0 or 1, the reported
accuracy) and ``partial`` (in [0, 1], the training reward where the skill gives partial credit). An example is
a system message (or none: the template's default), demonstration turns (or none), a user message and the hidden
data its verifier needs.

Splits are disjoint by construction: an example belongs to the split its user message hashes to (sha256, 10 %
test, 10 % validation, 80 % train). Validation and test sets are fixed (seeded by the skill's name only, the
same for every pipeline seed); a training stream is seeded by the pipeline seed and the stage and emits only
train-bucket examples, so no evaluated prompt is ever trained on.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

SPLITS = ("train", "val", "test")
SKILLS_VERSION = 5  # bump when a generator or verifier changes (evaluation caches key on it)


@dataclass(frozen=True)
class Example:
    """One prompt of a skill with what its verifier needs."""

    skill: str
    user: str
    data: dict[str, Any] = field(default_factory=dict)
    system: str | None = None
    shots: tuple[tuple[str, str], ...] = ()  # demonstration turns (user, assistant) before the question

    def messages(self) -> list[dict[str, str]]:
        head = [{"role": "system", "content": self.system}] if self.system is not None else []
        for user, assistant in self.shots:
            head += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
        return [*head, {"role": "user", "content": self.user}]


Score = dict[str, float]  # {"strict": 0 or 1, "partial": 0..1}


class Skill(Protocol):
    """A generator of examples and their verifier."""

    @property
    def name(self) -> str: ...

    @property
    def max_new_tokens(self) -> int: ...

    def sample(self, rng: random.Random) -> Example: ...

    def score(self, example: Example, completion: str) -> Score: ...


def split_of(example: Example) -> str:
    """The split an example belongs to, from the sha256 of its skill and user message."""
    digest = hashlib.sha256(f"{example.skill}\n{example.user}".encode()).digest()
    bucket = int.from_bytes(digest[:4], "big") % 100
    return "test" if bucket < 10 else "val" if bucket < 20 else "train"


def eval_set(skill: Skill, split: str, n: int) -> list[Example]:
    """The first ``n`` distinct examples of ``split`` (val or test) from the skill's fixed stream."""
    if split not in ("val", "test"):
        raise ValueError(f"split must be val or test, not {split!r}")
    fixed = getattr(skill, "fixed_set", None)  # a skill tested on a fixed benchmark (bfcl: BFCL non-live)
    if fixed is not None and (examples := fixed(split, n)) is not None:
        return list(examples)
    rng = random.Random(f"agentmerge-real/{split}/{skill.name}")
    seen: set[str] = set()
    out: list[Example] = []
    for _ in range(n * 400):
        ex = skill.sample(rng)
        if ex.user not in seen and split_of(ex) == split:
            seen.add(ex.user)
            out.append(ex)
            if len(out) == n:
                return out
    raise ValueError(f"{skill.name}: only {len(out)} distinct {split} examples (asked for {n})")


def train_stream(skill: Skill, seed: int, stage: str) -> Iterator[Example]:
    """Endless training examples (train bucket only) seeded by the pipeline seed and the stage name."""
    rng = random.Random(f"agentmerge-real/train/{skill.name}/{stage}/{seed}")
    while True:
        ex = skill.sample(rng)
        if split_of(ex) == "train":
            yield ex


def normalise(text: str) -> str:
    """Lower case, letters, digits and single spaces only."""
    kept = "".join(ch.lower() if ch.isalnum() else " " for ch in text)
    return " ".join(kept.split())


def mentions(text: str, value: str) -> bool:
    """``value`` occurs in ``text`` as whole words, after :func:`normalise` of both."""
    return f" {normalise(value)} " in f" {normalise(text)} "


def strict_partial(strict: bool, partial: float) -> Score:
    return {"strict": 1.0 if strict else 0.0, "partial": float(partial)}
