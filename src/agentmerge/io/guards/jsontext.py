"""The one JSON writer of agentmerge: strict JSON (RFC 8259) always, whatever the values.

Python's ``json.dumps`` writes a float NaN as ``NaN`` and an infinity as ``Infinity`` by default; neither is JSON,
and most readers (``jq``, JavaScript, Go, Rust's serde) refuse the whole file. Every JSON text agentmerge writes
or prints (reports, records, configs, caches, headers) goes through :func:`dumps`, which

- maps each non-finite float (anywhere: in dicts, lists, tuples, as a dataclass field already made a dict) to
  ``null``: "no value" is what a NaN error or an infinite ratio means to a reader, and ``null`` is the one JSON
  spelling for it;
- then serialises with ``allow_nan=False``, so a non-finite value that slipped past the mapping (a custom
  ``default`` returning one) raises instead of writing a broken file.

``tests/test_strict_json.py`` checks that no module calls ``json.dump``/``json.dumps`` directly.
"""

from __future__ import annotations

import json
import math
from typing import Any


def finite_or_null(value: Any) -> Any:
    """``value`` with every non-finite float in it replaced by None (containers copied, other values as is)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_or_null(v) for v in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """``json.dumps`` that writes strict JSON: non-finite floats become ``null`` (module docstring)."""
    return json.dumps(finite_or_null(value), allow_nan=False, **kwargs)
