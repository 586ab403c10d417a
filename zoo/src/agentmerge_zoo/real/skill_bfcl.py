"""The BFCL tool skill: BFCL's prompt mode, trained on questions BFCL never tests, tested on BFCL's non-live items.

Prompt: BFCL's default system prompt with the question's functions as JSON (``agentmerge.evaluation.bfcl``),
``SHOTS`` demonstration turns (a generated question and its answer written as BFCL's Python calls; their
functions are not offered, they show the format), then the question. Every user turn, the demonstrations' too,
opens with a **signature hint**, ``Functions you can call: a(x, y), b(z)`` (its own turn's functions with their
required arguments, in the docs' order; :func:`hinted`): without a hint the base never named an offered function
(0 of 16 test prompts, greedy, with two demonstrations), with the names alone 8 of 16, and agents trained with the
names alone learned calls without arguments or with argument names of the generator's functions (docs/real/bfcl.md,
"The names hint", "The signature hint"); every model of a bench (base, agents, merges) gets the same prompt.
The answer is graded by agentmerge's own BFCL checker (``verdict``), whose verdicts agree with BFCL's own
(tests/test_bfcl_agreement.py).

Split (declared in docs/real/bfcl.md):

- **train and validation**: questions of ``bfcl_gen`` (all four kinds alike) and BFCL's live single-turn
  categories with answers (``live_simple``, ``live_multiple``, ``live_parallel``, ``live_parallel_multiple``),
  ``LIVE_SHARE`` of the draws; each example falls in train / validation / (unused) test by the hash of its user
  message, as every skill of the zoo.
- **test**: BFCL's non-live AST categories ``simple_python``, ``multiple``, ``parallel``, ``parallel_multiple``
  (``fixed_set``: the first ``n / 4`` of each category in a fixed seeded order). No training, tuning or
  demonstration ever sees them.

Credit (``partial``, the training reward): ``bfcl_credit.credit``, dense steps towards an accepted answer
(parseable, offered names, the expected names, accepted arguments, BFCL's verdict); ``strict`` is the checker's
verdict.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentmerge.api import BFCL_LIVE_AST, BFCL_NON_LIVE_AST, BfclItem, bfcl_load_category, bfcl_subset
from agentmerge.api import bfcl_mode_of as mode_of
from agentmerge.api import bfcl_render_call as render_call
from agentmerge.api import bfcl_system_prompt as system_prompt
from agentmerge.api import bfcl_verdict as verdict
from agentmerge_zoo.real.bfcl_credit import called_names, credit
from agentmerge_zoo.real.bfcl_gen import KINDS, generate
from agentmerge_zoo.real.tasks import Example, Score

TRAIN_LIVE = BFCL_LIVE_AST  # live_simple, live_multiple, live_parallel, live_parallel_multiple
TEST_CATEGORIES = BFCL_NON_LIVE_AST  # simple_python, multiple, parallel, parallel_multiple
LIVE_SHARE = 0.35
SHOTS = 2
HINT = "Functions you can call: "


def signature(function: Mapping[str, Any]) -> str:
    """``name(a, b)``: a function doc's name and its required arguments, in the doc's order."""
    return f"{function['name']}({', '.join(function.get('parameters', {}).get('required', []))})"


def hinted(question: str, functions: Sequence[Mapping[str, Any]]) -> str:
    """The user turn: the hint (the turn's functions as ``name(required, args)``, in the docs' order), a blank line,
    the question."""
    return f"{HINT}{', '.join(signature(f) for f in functions)}\n\n{question}"


def _demos(rng: random.Random) -> tuple[tuple[str, str], ...]:
    """``SHOTS`` generated demonstrations: a hinted question, then its calls (their docs left out: they show the
    format and cost little prompt length)."""
    shots = []
    for _ in range(SHOTS):
        item = generate(rng.choice(KINDS), rng)
        shots.append((hinted(item["question"][0][0]["content"], item["function"]), render_call(item["ground_truth"])))
    return tuple(shots)


def _example(question: str, functions: Any, answer: Any, category: str, shots: tuple[tuple[str, str], ...]) -> Example:
    data = {"function": list(functions), "ground_truth": list(answer), "category": category, "question": question}
    user = hinted(question, functions)
    return Example(skill="bfcl", user=user, system=system_prompt(functions), shots=shots, data=data)


def _of_item(item: BfclItem, shots: tuple[tuple[str, str], ...]) -> Example:
    user = "\n".join(m["content"] for m in item.messages if m["role"] == "user")
    return _example(user, item.functions, item.answer or (), item.category, shots)


@dataclass
class BfclSkill:
    """BFCL's single-turn AST format: train on ``bfcl_gen`` and BFCL live, test on BFCL non-live."""

    name: str = "bfcl"
    max_new_tokens: int = 96
    _live: list[BfclItem] = field(default_factory=list, repr=False)

    def live_items(self) -> list[BfclItem]:
        """BFCL's live AST items with one user turn, loaded once from the pinned wheel."""
        if not self._live:
            for category in TRAIN_LIVE:
                items = bfcl_load_category(category)
                self._live += [it for it in items if it.answer and [m["role"] for m in it.messages] == ["user"]]
        return self._live

    def sample(self, rng: random.Random) -> Example:
        shots = _demos(rng)
        if rng.random() < LIVE_SHARE:
            return _of_item(rng.choice(self.live_items()), shots)
        kind = rng.choice(KINDS)
        item = generate(kind, rng)
        return _example(item["question"][0][0]["content"], item["function"], item["ground_truth"], f"gen_{kind}", shots)

    def fixed_set(self, split: str, n: int) -> list[Example] | None:
        """The test set: BFCL non-live, ``n / 4`` items of each category (a fixed seeded subset, in file order), each
        with generated demonstrations seeded by its id. Other splits: ``None`` (the hash split of ``sample``'s)."""
        if split != "test":
            return None
        per = max(1, n // len(TEST_CATEGORIES))
        out = []
        for category in TEST_CATEGORIES:
            for item in bfcl_subset(bfcl_load_category(category), per):
                out.append(_of_item(item, _demos(random.Random(f"agentmerge-real/bfcl-shots/{item.id}"))))
        return out

    def score(self, example: Example, completion: str) -> Score:
        d = example.data
        mode = mode_of(d["category"])
        correct = verdict(completion, d["function"], d["ground_truth"], mode).correct
        shown = {name for _, demo in example.shots for name in called_names(demo)}
        partial = credit(completion, d["function"], d["ground_truth"], mode, shown)
        return {"strict": 1.0 if correct else 0.0, "partial": partial}
