"""Strict JSON for the files agentmerge reads: safetensors headers (``formats.tensorfile`` adds the safetensors
library's own rules), config.json and index files, adapter configs, task lines, cache entries, sweep results.
Every failure is one line (``CheckpointError`` unless the caller names another type), never a
``RecursionError`` (deeply nested JSON) or ``ValueError`` (a 5000-digit integer) traceback; a value nested
deeper than ``MAX_JSON_DEPTH`` levels is refused too, so no later walk of it can recurse too deep.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentmerge.errors import AgentMergeError, CheckpointError

MAX_JSON_DEPTH = 100  # arrays and objects inside one another; real files nest a handful of levels


class _Duplicate(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(key)
        out[key] = value
    return out


def json_depth(value: Any) -> int:
    """How many arrays and objects lie inside one another in ``value`` (0 for a plain value); no recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, depth)
            if depth <= MAX_JSON_DEPTH:  # deeper is refused anyway: stop walking
                stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def loads_strict(text: str | bytes, where: str, error: type[AgentMergeError] = CheckpointError) -> Any:
    """``json.loads`` refusing duplicate keys, non-UTF-8 bytes, deep nesting and huge integers, one line each."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise error(f"{where}: not valid JSON (not UTF-8; re-export the file)") from None
    try:
        value = json.loads(text, object_pairs_hook=_unique_pairs)
    except _Duplicate as e:
        raise error(f"{where}: the name {e.key!r} appears twice; the file is ambiguous, re-export it") from None
    except RecursionError:
        value = None
        depth = MAX_JSON_DEPTH + 1
    except ValueError as e:  # JSONDecodeError, and ints longer than Python's digit limit
        raise error(f"{where}: not valid JSON ({str(e)[:200]})") from None
    else:
        depth = json_depth(value)
    if depth > MAX_JSON_DEPTH:
        raise error(f"{where}: JSON nested more than {MAX_JSON_DEPTH} levels deep (corrupt or hostile file)")
    return value


def strict_bool(
    value: object, where: str, default: bool = False, error: type[AgentMergeError] = CheckpointError
) -> bool:
    """A true/false setting read from JSON or YAML: a real boolean, or ``default`` when absent (None).

    Anything else is refused in one line: ``bool("false")`` is True, so a quoted ``'false'`` would silently
    switch the setting on.
    """
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    hint = " (a quoted string: write it without quotes)" if isinstance(value, str) else ""
    raise error(f"{where} must be true or false (got {str(value)[:40]!r}){hint}")


def read_json_file(path: Path, what: str = "file") -> Any:
    """A JSON file such as config.json or an index; unreadable or invalid gives one ``CheckpointError``."""
    try:
        text = path.read_bytes()
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read this {what} ({e.strerror})") from None
    return loads_strict(text, str(path))


def read_json_object(path: Path, what: str = "file") -> dict[str, Any]:
    """``read_json_file`` that must give a JSON object."""
    data = read_json_file(path, what)
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: this {what} must be a JSON object, not {type(data).__name__}")
    return data
