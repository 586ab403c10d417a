"""The user's own evaluation tasks: a JSONL file of prompts with references, and how each is scored.

One JSON object per line (blank lines and lines starting with ``//`` are skipped):

    {"task": "arith", "prompt": "What is 17 + 25?", "reference": "42", "match": "numeric"}
    {"task": "arith", "defaults": {"match": "numeric", "max_new_tokens": 8, "system": "Answer with a number."}}

An *example* line has ``prompt`` and ``reference`` (and optionally ``task``, default ``"default"``, ``id``
and any of the settings below). A *defaults* line names a ``task`` and gives settings for every example
of that task that does not set them itself (wherever the line stands in the file). Settings:

- ``match``: ``exact`` (default; the output, stripped, equals the reference), ``normalised`` (both
  lowercased, punctuation removed, whitespace collapsed, then equal), ``contains`` (the normalised
  reference occurs in the normalised output), ``regex`` (the reference is a Python regular expression
  found anywhere in the output), ``numeric`` (the last number in the output is within ``tolerance``
  times max(1, |reference|) of the reference; default 1e-6) or ``json`` (the output, or the first JSON
  object or array in it, parses to a value equal to the reference, which may be any JSON value or a
  string holding one).
- ``max_new_tokens`` (default 64), ``system`` (a system prompt for the chat template), ``tolerance``.

Mistakes are refused with one line naming the file, the line and the field. The file must be a regular
file of at most ``MAX_TASK_FILE_BYTES`` (not a device or FIFO, which would never end), each line at most
``MAX_LINE_CHARS`` characters and nested at most ``strict_json.MAX_JSON_DEPTH`` levels. A ``regex`` reference
runs with a time limit per match (``userregex.MATCH_SECONDS``): a pattern that backtracks catastrophically
on an output stops the evaluation with one line naming its task-file line. A model's output that holds
JSON nested deeper than that limit is not JSON (the ``json`` rule scores it wrong). Nothing here imports
torch.
"""

from __future__ import annotations

import functools
import json
import math
import re
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentmerge.config.userinput import did_you_mean
from agentmerge.errors import ConfigError
from agentmerge.io.guards.bounded import text_lines
from agentmerge.io.guards.strict_json import MAX_JSON_DEPTH, json_depth, loads_strict
from agentmerge.io.guards.userregex import UserPattern

MATCHES = ("exact", "normalised", "contains", "regex", "numeric", "json")
SETTINGS = ("match", "max_new_tokens", "system", "tolerance")
EXAMPLE_FIELDS = ("task", "id", "prompt", "reference", *SETTINGS)
DEFAULT_TASK = "default"
DEFAULT_MAX_NEW_TOKENS = 64
DEFAULT_TOLERANCE = 1e-6
MAX_TASK_FILE_BYTES = 256 << 20
MAX_LINE_CHARS = 1 << 20  # a prompt of a million characters is past any model's context
MAX_JSON_ATTEMPTS = 1000  # places in an output where a JSON object or array is tried


class TaskFileError(ConfigError):
    """A task file that cannot be read or holds a mistake (the message names file, line and field)."""


@dataclass(frozen=True)
class Example:
    """One prompt with its reference and how to score it (every default applied)."""

    task: str
    prompt: str
    reference: Any
    match: str = "exact"
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    system: str | None = None
    tolerance: float = DEFAULT_TOLERANCE
    id: str = ""
    line: int = 0

    def score(self, output: str) -> bool:
        """Whether ``output`` matches the reference under this example's rule."""
        return MATCHERS[self.match](output, self)


# --------------------------------------------------------------------------- matching


_PUNCT = str.maketrans("", "", string.punctuation)
_NUMBER = re.compile(r"[-+]?(?:\d+(?:[.,]\d+)*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


def normalise(text: str) -> str:
    """Lowercased, punctuation removed, whitespace collapsed."""
    return " ".join(text.lower().translate(_PUNCT).split())


def last_number(text: str) -> float | None:
    """The last number written in ``text`` (thousands commas allowed), or None."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def first_json(text: str) -> tuple[bool, Any]:
    """``(True, value)`` for the whole output as JSON, else its first JSON object or array; ``(False, None)``.

    Values nested deeper than ``MAX_JSON_DEPTH`` are not JSON here; at most ``MAX_JSON_ATTEMPTS`` openings tried.
    """
    stripped = text.strip()
    whole = _json_value(lambda: json.loads(stripped))
    if whole is not None:
        return whole
    decoder = json.JSONDecoder()
    starts = [i for i, ch in enumerate(stripped) if ch in "[{"][:MAX_JSON_ATTEMPTS]
    for i in starts:
        found = _json_value(functools.partial(_raw_decode, decoder, stripped, i))
        if found is not None:
            return found
    return False, None


def _raw_decode(decoder: json.JSONDecoder, text: str, start: int) -> Any:
    return decoder.raw_decode(text, start)[0]


def _json_value(parse: Callable[[], Any]) -> tuple[bool, Any] | None:
    try:
        value = parse()
    except (ValueError, RecursionError):
        return None
    return (True, value) if json_depth(value) <= MAX_JSON_DEPTH else None


def _numeric(output: str, ex: Example) -> bool:
    got = last_number(output)
    want = float(ex.reference)
    return got is not None and abs(got - want) <= ex.tolerance * max(1.0, abs(want))


def _json(output: str, ex: Example) -> bool:
    ok, value = first_json(output)
    return ok and value == ex.reference


@functools.lru_cache(maxsize=256)
def user_pattern(text: str, line: int) -> UserPattern:
    """A ``regex`` reference compiled once, matched with a time limit (``userregex``)."""
    return UserPattern.compile(text, f"task line {line}: field 'reference'", TaskFileError)


MATCHERS: dict[str, Callable[[str, Example], bool]] = {
    "exact": lambda out, ex: out.strip() == str(ex.reference).strip(),
    "normalised": lambda out, ex: normalise(out) == normalise(str(ex.reference)),
    "contains": lambda out, ex: normalise(str(ex.reference)) in normalise(out),
    "regex": lambda out, ex: user_pattern(str(ex.reference), ex.line).search(out, f"task line {ex.line}"),
    "numeric": _numeric,
    "json": _json,
}


# --------------------------------------------------------------------------- reading


def load_tasks(path: str | Path) -> list[Example]:
    """Every example of a task file, defaults applied, in file order (``TaskFileError`` on any mistake)."""
    file = Path(path).expanduser()
    lines = text_lines(file, "task file", MAX_TASK_FILE_BYTES, MAX_LINE_CHARS, TaskFileError)
    rows, defaults = _parse_lines(file, lines)
    examples = [_example(file, n, row, defaults.get(str(row.get("task", DEFAULT_TASK)), {})) for n, row in rows]
    if not examples:
        raise TaskFileError(f"{file}: no examples (write one JSON object per line with 'prompt' and 'reference')")
    unused = sorted(set(defaults) - {ex.task for ex in examples})
    if unused:
        raise TaskFileError(f"{file}: defaults for task {unused[0]!r}, which has no examples (a typo in 'task'?)")
    return examples


def _parse_lines(
    file: Path, lines: Sequence[str]
) -> tuple[list[tuple[int, dict[str, Any]]], dict[str, dict[str, Any]]]:
    rows: list[tuple[int, dict[str, Any]]] = []
    defaults: dict[str, dict[str, Any]] = {}
    for n, text in enumerate(lines, 1):
        if not text.strip() or text.lstrip().startswith("//"):
            continue
        row = loads_strict(text, f"{file}:{n}", TaskFileError)
        if not isinstance(row, dict):
            raise TaskFileError(f"{file}:{n}: each line must be a JSON object, got {type(row).__name__}")
        if "defaults" in row:
            task, settings = _defaults_line(file, n, row)
            if task in defaults:
                raise TaskFileError(f"{file}:{n}: a second defaults line for task {task!r}; merge them into one")
            defaults[task] = settings
        else:
            rows.append((n, row))
    return rows, defaults


def _defaults_line(file: Path, n: int, row: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    extra = sorted(set(row) - {"task", "defaults"})
    if extra:
        raise TaskFileError(f"{file}:{n}: a defaults line holds only 'task' and 'defaults' (found {extra[0]!r})")
    settings = row["defaults"]
    if not isinstance(settings, dict):
        raise TaskFileError(f"{file}:{n}: field 'defaults' must be an object of settings ({', '.join(SETTINGS)})")
    for key in settings:
        if key not in SETTINGS:
            raise TaskFileError(f"{file}:{n}: unknown setting {key!r} in 'defaults'{did_you_mean(key, SETTINGS)}")
    task = row.get("task", DEFAULT_TASK)
    if not isinstance(task, str) or not task:
        raise TaskFileError(f"{file}:{n}: field 'task' must be a non-empty string")
    return task, settings


def _example(file: Path, n: int, row: dict[str, Any], defaults: dict[str, Any]) -> Example:
    where = f"{file}:{n}"
    for key in row:
        if key not in EXAMPLE_FIELDS:
            raise TaskFileError(f"{where}: unknown field {key!r}{did_you_mean(key, EXAMPLE_FIELDS)}")
    for key in ("prompt", "reference"):
        if key not in row:
            raise TaskFileError(f"{where}: field {key!r} is missing (an example needs 'prompt' and 'reference')")
    merged = {**defaults, **row}
    ex = Example(
        task=_text(where, merged, "task", DEFAULT_TASK),
        prompt=_text(where, merged, "prompt", ""),
        reference=merged["reference"],
        match=_choice(where, merged.get("match", "exact")),
        max_new_tokens=_count(where, merged.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)),
        system=_text(where, merged, "system", None),
        tolerance=_tolerance(where, merged.get("tolerance", DEFAULT_TOLERANCE)),
        id=str(merged.get("id", n)),
        line=n,
    )
    _check_reference(where, ex)
    return ex


def _text(where: str, row: dict[str, Any], key: str, default: str | None) -> Any:
    value = row.get(key, default)
    if value is not None and (not isinstance(value, str) or (key in ("task", "prompt") and not value)):
        raise TaskFileError(f"{where}: field {key!r} must be a non-empty string")
    return value


def _choice(where: str, match: Any) -> str:
    if match not in MATCHES:
        hint = did_you_mean(match, MATCHES) if isinstance(match, str) else ""
        raise TaskFileError(f"{where}: field 'match' must be one of {', '.join(MATCHES)} (got {match!r}){hint}")
    return str(match)


def _count(where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 100_000:
        raise TaskFileError(f"{where}: field 'max_new_tokens' must be a whole number from 1 (got {value!r})")
    return value


def _tolerance(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (math.isfinite(value) and value >= 0):
        raise TaskFileError(f"{where}: field 'tolerance' must be a number >= 0 (got {value!r})")
    return float(value)


def _check_reference(where: str, ex: Example) -> None:
    """The reference suits the match rule (a number for numeric, a valid pattern for regex, JSON for json)."""
    ref = ex.reference
    if ex.match == "json":
        if isinstance(ref, str):
            ok, value = first_json(ref)
            if not ok:
                raise TaskFileError(f"{where}: field 'reference' must be JSON for match json (got {ref!r})")
            object.__setattr__(ex, "reference", value)
        return
    if not isinstance(ref, str | int | float) or isinstance(ref, bool):
        raise TaskFileError(f"{where}: field 'reference' must be a string (or a number) for match {ex.match}")
    if ex.match == "numeric":
        try:
            float(ref)
        except ValueError:
            raise TaskFileError(
                f"{where}: field 'reference' must be a number for match numeric (got {ref!r})"
            ) from None
    if ex.match == "regex":
        UserPattern.compile(str(ref), f"{where}: field 'reference'", TaskFileError)
