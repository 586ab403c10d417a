"""The memory skill: recall one fact from a context of a few hundred tokens of similar facts.

The user message lists ``n_facts`` notes of four kinds (where a person lives, what a locker holds, the code of a
coloured door, the name of a person's dog), each key once, then asks about one of them. The answer is right
(``strict`` = ``partial``) when it names the asked value as whole words and names no other value of the same
kind that the notes mention (listing every city is not recall).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from agentmerge_zoo.real.tasks import Example, Score, mentions, strict_partial

NAMES = [
    "Maria",
    "Tom",
    "Anna",
    "Omar",
    "Lena",
    "Kofi",
    "Priya",
    "Jonas",
    "Sofia",
    "Diego",
    "Mei",
    "Ivan",
    "Clara",
    "Ahmed",
    "Noor",
    "Felix",
    "Hana",
    "Luca",
    "Rosa",
    "Samir",
]
CITIES = [
    "Lisbon",
    "Oslo",
    "Rome",
    "Cairo",
    "Lima",
    "Dublin",
    "Vienna",
    "Quito",
    "Seoul",
    "Athens",
    "Perth",
    "Bergen",
    "Porto",
    "Krakow",
    "Nairobi",
    "Hanoi",
]
OBJECTS = [
    "umbrella",
    "lamp",
    "violin",
    "helmet",
    "kettle",
    "compass",
    "ladder",
    "candle",
    "hammer",
    "blanket",
    "mirror",
    "teapot",
    "camera",
]
COLORS = ["red", "blue", "green", "yellow", "black", "white", "orange", "purple", "brown", "grey"]
DOGS = ["Rex", "Bella", "Max", "Luna", "Charlie", "Daisy", "Rocky", "Milo", "Coco", "Buddy", "Ruby", "Oscar"]

# kind: (fact template, question, what the answer is)
KINDS = {
    "city": ("{key} lives in {value}.", "Where does {key} live?", "city"),
    "locker": ("Locker {key} holds a {value}.", "What does locker {key} hold?", "object"),
    "door": ("The code for the {key} door is {value}.", "What is the code for the {key} door?", "code"),
    "dog": ("{key}'s dog is called {value}.", "What is the name of {key}'s dog?", "name"),
}


def _keys_values(kind: str, rng: random.Random, n: int) -> list[tuple[str, str]]:
    if kind == "city":
        return list(zip(rng.sample(NAMES, n), rng.sample(CITIES, n), strict=True))
    if kind == "locker":
        return list(zip(map(str, rng.sample(range(10, 99), n)), rng.sample(OBJECTS, n), strict=True))
    if kind == "door":
        return [(c, str(rng.randint(1000, 9999))) for c in rng.sample(COLORS, n)]
    return list(zip(rng.sample(NAMES, n), rng.sample(DOGS, n), strict=True))


@dataclass(frozen=True)
class MemorySkill:
    """Recall from ``n_facts`` notes (at most 10 of one kind)."""

    name: str = "memory"
    max_new_tokens: int = 24
    n_facts: tuple[int, int] = (16, 24)

    def sample(self, rng: random.Random) -> Example:
        total = rng.randint(*self.n_facts)
        counts = dict.fromkeys(KINDS, 0)
        for _ in range(total):
            counts[rng.choice([k for k, c in counts.items() if c < 10])] += 1
        facts: list[tuple[str, str, str]] = []
        for kind, count in counts.items():
            facts += [(kind, key, value) for key, value in _keys_values(kind, rng, count)]
        rng.shuffle(facts)
        kind, key, value = rng.choice(facts)
        notes = "\n".join("- " + KINDS[k][0].format(key=fk, value=fv) for k, fk, fv in facts)
        _, question, what = KINDS[kind]
        user = f"Read these notes.\n{notes}\n\nQuestion: {question.format(key=key)} Answer with the {what} only."
        others = sorted({fv for k, _, fv in facts if k == kind and fv != value})
        return Example(self.name, user, {"answer": value, "others": others})

    def score(self, example: Example, completion: str) -> Score:
        right = mentions(completion, example.data["answer"])
        confused = any(mentions(completion, other) for other in example.data["others"])
        return strict_partial(right and not confused, float(right and not confused))
