"""BFCL v4's single-turn AST categories, read from the pinned ``bfcl-eval`` wheel (``wheeldata.BFCL_WHEEL``).

A category's questions are ``bfcl_eval/data/BFCL_v4_<category>.json`` (one JSON object a line: ``id``,
``question`` — a list of turns, each a list of chat messages; single-turn categories have one turn —
and ``function``, the JSON-schema docs of the functions offered). Its ground truth, where it has one, is
``bfcl_eval/data/possible_answer/BFCL_v4_<category>.json`` (``ground_truth``: one ``{function: {argument:
[accepted values]}}`` per expected call; ``""`` among the accepted values means the argument may be left out).
The (ir)relevance categories have no ground truth: they only ask whether the model calls something.

Non-live categories are BFCL's expert-written test; live categories are user-contributed. agentmerge treats
non-live as the **test** and live as the **validation** side (``validation``): a sweep tunes on live by
default, and few-shot demonstrations come only from live categories that are not being scored.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentmerge.config.userinput import did_you_mean
from agentmerge.errors import ConfigError
from agentmerge.evaluation.wheeldata import BFCL_WHEEL, read_member

NON_LIVE = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance")
LIVE = (
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
    "live_irrelevance",
    "live_relevance",
)
CATEGORIES = NON_LIVE + LIVE
GROUPS: dict[str, tuple[str, ...]] = {
    "all": CATEGORIES,
    "non_live": NON_LIVE,
    "test": NON_LIVE,
    "live": LIVE,
    "validation": LIVE,
}
# BFCL's leaderboard summaries: non-live AST = unweighted mean, live AST = mean weighted by item count
NON_LIVE_AST = ("simple_python", "multiple", "parallel", "parallel_multiple")
LIVE_AST = ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple")


@dataclass(frozen=True)
class Item:
    """One BFCL question: its chat messages, the functions offered and (AST categories) the accepted calls."""

    id: str
    category: str
    messages: tuple[Mapping[str, str], ...]
    functions: tuple[Mapping[str, Any], ...]
    answer: tuple[Mapping[str, Mapping[str, list[Any]]], ...] | None  # None: (ir)relevance, no ground truth


def check(category: str) -> str:
    """``category`` if it is one of ours, else a ``ConfigError`` naming the known ones."""
    if category not in CATEGORIES:
        known = (*CATEGORIES, *GROUPS)
        raise ConfigError(
            f"bfcl: unknown category {category!r}{did_you_mean(category, known)} (categories: {', '.join(CATEGORIES)};"
            f" groups: {', '.join(GROUPS)})"
        )
    return category


def parse_categories(spec: str) -> tuple[str, ...]:
    """``"simple_python,live"`` -> the categories it names, in BFCL's order; empty -> all."""
    words = [w.strip() for w in spec.split(",") if w.strip()] or ["all"]
    chosen = {c for w in words for c in (GROUPS[w] if w in GROUPS else (check(w),))}
    return tuple(c for c in CATEGORIES if c in chosen)


def category_of(item_id: str) -> str:
    """BFCL's rule: the id without its last ``_`` part (``live_simple_3-2-1`` -> ``live_simple``)."""
    return item_id.rsplit("_", 1)[0]


def _rows(member: str, cache: Path | None) -> list[dict[str, Any]]:
    text = read_member(BFCL_WHEEL, member, cache).decode("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def load_category(category: str, cache: Path | None = None) -> list[Item]:
    """Every item of one category, in the file's order, joined with its ground truth."""
    check(category)
    rows = _rows(f"bfcl_eval/data/BFCL_v4_{category}.json", cache)
    answers: dict[str, Any] = {}
    if "relevance" not in category:  # irrelevance and relevance have no ground truth
        truth = _rows(f"bfcl_eval/data/possible_answer/BFCL_v4_{category}.json", cache)
        answers = {r["id"]: r["ground_truth"] for r in truth}
    items = []
    for row in rows:
        answer = answers.get(row["id"])
        if answers and answer is None:
            raise ConfigError(f"bfcl: {row['id']} has no ground truth in {BFCL_WHEEL.filename}; is the wheel damaged?")
        items.append(
            Item(
                row["id"],
                category,
                tuple(row["question"][0]),
                tuple(row["function"]),
                None if answer is None else tuple(answer),
            )
        )
    return items


def load(categories: Sequence[str], cache: Path | None = None) -> dict[str, list[Item]]:
    """``{category: items}`` for each category named."""
    return {c: load_category(c, cache) for c in categories}


def subset(items: Sequence[Item], n: int | None, seed: int = 0) -> list[Item]:
    """A fixed seeded subset of ``n`` items (all when ``n`` is None or at least their number), in file order."""
    if n is None or n >= len(items):
        return list(items)
    keep = set(random.Random(f"bfcl-subset:{seed}:{items[0].category}").sample(range(len(items)), n))
    return [it for i, it in enumerate(items) if i in keep]
