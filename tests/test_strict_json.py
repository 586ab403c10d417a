"""Every JSON text agentmerge and its zoo write is strict JSON (issue 42): one writer, ``io.guards.jsontext.dumps``."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest

import agentmerge
from agentmerge.io.guards import jsontext

SRC = Path(agentmerge.__file__).resolve().parent
ROOTS = (SRC, Path(__file__).resolve().parents[1] / "zoo" / "src" / "agentmerge_zoo")  # the library and the zoo


def _strict_load(text: str) -> object:
    def refuse(word: str) -> None:
        raise ValueError(f"not JSON: {word}")

    return json.loads(text, parse_constant=refuse)


def test_no_module_calls_json_dump_directly() -> None:
    """``json.dump(s)`` writes NaN / Infinity by default: every module must use ``jsontext.dumps`` instead."""
    found = []
    for root in ROOTS:
        assert root.is_dir(), root  # a moved package must not leave the check looking at nothing
        for path in sorted(root.rglob("*.py")):
            if path.name == "jsontext.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Attribute)
                    and node.attr in ("dump", "dumps")
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "json"
                ):
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    assert not found, found


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_values_become_null_anywhere(bad: float) -> None:
    data = {"a": bad, "b": [1.0, bad, {"c": (bad, 2)}], "d": "NaN", "e": 3}
    text = jsontext.dumps(data, indent=2)
    assert _strict_load(text) == {"a": None, "b": [1.0, None, {"c": [None, 2]}], "d": "NaN", "e": 3}
    assert json.loads(jsontext.dumps([0.1, 1e308, -0.0])) == [0.1, 1e308, -0.0]  # finite values exactly


def test_a_default_that_returns_nan_is_refused_not_written() -> None:
    with pytest.raises(ValueError):
        jsontext.dumps({"x": object()}, default=lambda _o: math.nan)
