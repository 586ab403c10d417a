"""The one grammar of a parameter value typed as text: ``--param NAME=VALUE`` of every command (merge, moe,
probe), and a value a YAML file left as a string (PyYAML reads ``1e-3`` as text) when a ``Param`` checks it.

    VALUE   := QUOTED | LIST | SCALAR
    QUOTED  := "..." | '...'              the text inside, as it is (``"true"``, ``'[abc]'`` stay text)
    LIST    := [ SCALAR, SCALAR, ... ]    each item a SCALAR (no nesting); ``[]`` is the empty list
    SCALAR  := true | false               any case: a bool
             | INTEGER                    ``3``, ``-2``: an int
             | DECIMAL                    ``0.5``, ``1e-3``, ``.5``, ``2.``: a float (``1e999``: inf)
             | anything else              text, stripped (``no``, ``off``, ``yes``, ``none``, ``inf``, ``ties``)

Only ``true`` and ``false`` are booleans: unlike a YAML file, ``no`` / ``yes`` / ``on`` / ``off`` stay text, so a
choice spelled that way is never turned into a bool behind the user's back (a bool parameter given ``no`` is
refused with "must be true or false"). ``inf`` and ``nan`` are text too: no parameter takes them, and a number
parameter refuses them by name. A leaf of the package (no layer): ``methods.params`` and the command line both
read values with it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable

from agentmerge.errors import ConfigError

Scalar = bool | int | float | str
Value = Scalar | list[Scalar]

_INTEGER = re.compile(r"[+-]?\d+", re.ASCII)
_DECIMAL = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?", re.ASCII)


def parse_scalar(text: str) -> Scalar:
    """One SCALAR of the grammar: a bool, an int, a float or the stripped text."""
    word = text.strip()
    if word.lower() in ("true", "false"):
        return word.lower() == "true"
    if not _DECIMAL.fullmatch(word):
        return word
    if _INTEGER.fullmatch(word):
        with contextlib.suppress(ValueError):  # past Python's digit limit: a float (inf), refused as not finite
            return int(word)
    return float(word)


def parse_value(text: str) -> Value:
    """A VALUE of the grammar (see the module docstring): quoted text, a list of scalars, or a scalar."""
    word = text.strip()
    if len(word) >= 2 and word[0] == word[-1] and word[0] in "\"'":
        return word[1:-1]
    if word.startswith("[") and word.endswith("]"):
        inner = word[1:-1].strip()
        return [parse_scalar(item) for item in inner.split(",")] if inner else []
    return parse_scalar(word)


def parse_assignments(items: Iterable[str], flag: str = "--param") -> dict[str, Value]:
    """``NAME=VALUE`` items (a repeated ``flag``) -> ``{NAME: value}``; the last of a repeated name wins."""
    out: dict[str, Value] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{flag} {item!r}: write NAME=VALUE, e.g. {flag} r=0.1")
        out[key.strip()] = parse_value(value)
    return out
