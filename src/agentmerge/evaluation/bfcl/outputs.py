"""Generations made elsewhere (``--outputs FILE.jsonl``): one ``{"id": "simple_python_12", "output": "..."}`` a line.

The ids must be BFCL ids of the categories being scored; a file may hold a subset of a category's ids (the
report says how many of the category it covers). Mistakes are refused with one line naming the file and line.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from agentmerge.errors import ConfigError
from agentmerge.evaluation.bfcl import data
from agentmerge.io.guards.bounded import text_lines
from agentmerge.io.guards.strict_json import loads_strict

MAX_OUTPUTS_BYTES = 1 << 30
MAX_LINE_CHARS = 1 << 22
WHAT = "BFCL outputs file"


def read_outputs(path: Path) -> dict[str, str]:
    """``{id: output}`` from the file; blank lines are skipped; a repeated id, bad JSON or a wrong field: one line."""
    lines = text_lines(path, WHAT, MAX_OUTPUTS_BYTES, MAX_LINE_CHARS, ConfigError)
    out: dict[str, str] = {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        row = loads_strict(line, f"{path}:{n}", ConfigError)
        if not isinstance(row, dict) or not isinstance(row.get("id"), str) or not isinstance(row.get("output"), str):
            raise ConfigError(f'{path}:{n}: each line must be {{"id": "<BFCL id>", "output": "<raw model text>"}}')
        if row["id"] in out:
            raise ConfigError(f"{path}:{n}: id {row['id']!r} appears twice; keep one output per id")
        out[row["id"]] = row["output"]
    if not out:
        raise ConfigError(f"{path}: no outputs in this {WHAT}")
    return out


def matched(path: Path, outputs: dict[str, str], categories: Sequence[str]) -> dict[str, list[data.Item]]:
    """The items the outputs answer, by category (only ``categories``); unknown ids are refused, first three named."""
    present = {data.category_of(i) for i in outputs}
    stray = [i for i in outputs if data.category_of(i) not in categories]
    if stray:
        first = data.category_of(stray[0])
        if first not in data.CATEGORIES:
            raise ConfigError(
                f"{path}: id {stray[0]!r} is not in a BFCL category scored here ({', '.join(data.CATEGORIES)})"
            )
        raise ConfigError(
            f"{path}: {len(stray)} ids outside the categories scored ({', '.join(categories)}), e.g. "
            f"{', '.join(map(repr, stray[:3]))}; add their categories to --suite bfcl:CATEGORIES"
        )
    out = {}
    for category in [c for c in data.CATEGORIES if c in present]:
        items = data.load_category(category)
        known = {it.id for it in items}
        unknown = [i for i in outputs if data.category_of(i) == category and i not in known]
        if unknown:
            raise ConfigError(
                f"{path}: {len(unknown)} ids that {category} does not have, e.g. {', '.join(map(repr, unknown[:3]))}"
            )
        out[category] = [it for it in items if it.id in outputs]
    return out
