"""Bounds on config files, so a hostile or careless one cannot hang agentmerge or exhaust memory.

- ``read_config_yaml``: at most ``MAX_CONFIG_BYTES``, UTF-8, parsed once with PyYAML's safe loader; the
  parsed document may hold at most ``MAX_CONFIG_NODES`` values once YAML aliases are expanded (an alias
  bomb is refused before anything walks it), and no alias may contain itself.
- ``PatternSet``: include/exclude globs matched in time linear in the number of tensors: plain names
  (no wildcard) by a set lookup, the others through one compiled regular expression.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agentmerge.errors import ConfigError

MAX_CONFIG_BYTES = 4 * 1024 * 1024
MAX_CONFIG_NODES = 200_000
_WILDCARD = re.compile(r"[*?\[]")


def read_config_yaml(path: Path) -> Any:
    """Parse a YAML config file safely and within the bounds above; any failure is one ``ConfigError``."""
    import yaml

    try:
        size = path.stat().st_size
        if size > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"{path}: {size} bytes is too large for a config file (at most {MAX_CONFIG_BYTES}); "
                "list patterns such as '*mlp*' instead of every tensor"
            )
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror})") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: too large for a config file (at most {MAX_CONFIG_BYTES} bytes)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}); save the config as UTF-8") from None
    if "\x00" in text:
        raise ConfigError(f"{path}: contains NUL bytes (UTF-16?); save the config as UTF-8")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({_first_line(e)})") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a config") from None
    except ValueError as e:  # e.g. an integer beyond Python's digit limit
        raise ConfigError(f"{path}: not a valid config value ({_first_line(e)})") from None
    check_expanded_size(data, str(path))
    return data


def _first_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text[:200] + ("..." if len(text) > 200 else "")


def check_expanded_size(data: Any, source: str, limit: int = MAX_CONFIG_NODES) -> None:
    """Refuse a document whose alias-expanded size exceeds ``limit`` values, or that contains itself.

    Shared sub-documents (YAML aliases) are sized once each (memoised by identity), so this costs time
    linear in the document as parsed, not as expanded.
    """
    sizes: dict[int, int] = {}
    visiting: set[int] = set()
    stack: list[tuple[Any, bool]] = [(data, False)]
    while stack:
        obj, done = stack.pop()
        if not isinstance(obj, list | dict):
            continue
        key = id(obj)
        if done:
            visiting.discard(key)
            children = obj.values() if isinstance(obj, dict) else obj
            total = 1 + sum(sizes.get(id(c), 1) if isinstance(c, list | dict) else 1 for c in children)
            if isinstance(obj, dict):
                total += len(obj)
            if total > limit:
                raise ConfigError(
                    f"{source}: expands to more than {limit} values (YAML aliases repeated too often); "
                    "write the config out plainly"
                )
            sizes[key] = total
            continue
        if key in sizes:
            continue
        if key in visiting:
            raise ConfigError(f"{source}: a YAML alias refers to itself; write the config out plainly")
        visiting.add(key)
        stack.append((obj, True))
        children = list(obj.values()) if isinstance(obj, dict) else obj
        stack.extend((c, False) for c in children if isinstance(c, list | dict))


class PatternSet:
    """fnmatch globs (case-sensitive) matched against many names in time linear in the names."""

    def __init__(self, patterns: Iterable[str]) -> None:
        pats = list(dict.fromkeys(patterns))
        self.empty = not pats
        self.literal = frozenset(p for p in pats if not _WILDCARD.search(p))
        globs = [p for p in pats if _WILDCARD.search(p)]
        self.regex = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in globs)) if globs else None

    def matches(self, name: str) -> bool:
        return name in self.literal or (self.regex is not None and self.regex.match(name) is not None)
