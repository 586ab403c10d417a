"""BFCL's AST check of decoded calls against the accepted ones, written anew; ``grade`` for partial credit.

Per call (BFCL's ``simple_function_checker``), against a function's doc and ``{argument: [accepted values]}``:

- the call names the function; every ``required`` argument is given; every argument given is in the doc
  **and** in the accepted answer (an argument the answer does not list is unexpected);
- type: the value's Python type must be the doc's (``string``/``any`` -> str, ``integer`` -> int, ``float``,
  ``boolean`` -> bool, ``array``/``tuple`` -> list, ``dict``), compared exactly (``True`` is not an integer);
  an int is taken for a ``float``; a tuple is taken for a ``tuple``. A value of another type still passes
  when its type is the accepted values' type (BFCL's "variable" case: ``x="pi"`` where the answer lists
  strings for a float argument), and is then compared exactly. For ``array``/``tuple`` the elements' type
  is checked one level deep against each accepted list (an optional argument's ``""`` passes that check);
- value: strings compare after BFCL's normalisation (spaces and ``,./-_*^`` removed, lower case, ``'`` -> ``"``);
  lists compare element-wise with their strings normalised (an accepted ``""`` reads as the empty list); dicts
  key by key (no unexpected key, each value among its accepted values, strings normalised; a key left out
  must accept ``""``); lists of dicts position by position; anything else by Python equality (``1 == 1.0``);
- every accepted argument not given must accept ``""`` (optional).

Per answer (BFCL's ``ast_checker``): ``simple`` categories need exactly one call, checked against the first
function; ``multiple`` as many calls as expected (one), checked against the expected function; ``parallel``
categories as many calls as expected, matched **greedily**: for each expected call in order, the first unmatched
call that passes is taken (not a best matching — see docs/evaluate.md). Irrelevance: correct when the answer
is not parseable or has no call; relevance: correct when it is parseable with at least one call.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentmerge.evaluation.bfcl.decode import Call, DecodeError, decode

PYTHON_TYPES: dict[str, type] = {
    "string": str,
    "integer": int,
    "float": float,
    "boolean": bool,
    "array": list,
    "tuple": list,
    "dict": dict,
    "any": str,
}
NESTED = ("array", "tuple")
_PUNCTUATION = re.compile(r"[ ,./\-_*^]")

Accepted = Sequence[Any]  # the accepted values of one argument ("" = it may be left out)
Expected = Mapping[str, Mapping[str, Accepted]]  # {function: {argument: accepted values}}


@dataclass(frozen=True)
class Verdict:
    """One answer: a parseable call (decodes as one or more calls), calling the expected functions (as a
    multiset of names; for (ir)relevance: the verdict), and right (BFCL's verdict)."""

    parseable: bool
    right_function: bool
    correct: bool
    error: str = ""


def normalised(text: str) -> str:
    """BFCL's string normalisation: spaces and ``,./-_*^`` removed, lower case, ``'`` -> ``"``."""
    return _PUNCTUATION.sub("", text).lower().replace("'", '"')


def _norm(value: Any) -> Any:
    return normalised(value) if type(value) is str else value


def check_call(doc: Mapping[str, Any], call: Call, expected: Expected) -> str:
    """Why ``call`` is not an accepted call of ``doc`` (``""``: it is)."""
    accepted = next(iter(expected.values()))
    name = doc["name"]
    if name not in call:
        return f"called {next(iter(call), '')!r}, not {name!r}"
    args = call[name]
    schema = doc["parameters"]
    for param in schema.get("required", []):
        if param not in args:
            return f"missing required argument {param!r}"
    for param, value in args.items():
        if param not in schema["properties"] or param not in accepted:
            return f"unexpected argument {param!r}"
        why = _check_argument(value, schema["properties"][param], accepted[param])
        if why:
            return f"argument {param!r}: {why}"
    for param, values in accepted.items():
        if param not in args and "" not in values:
            return f"argument {param!r} left out but not optional"
    return ""


def _check_argument(value: Any, schema: Mapping[str, Any], accepted: Accepted) -> str:
    kind = schema.get("type")
    if kind not in PYTHON_TYPES:
        return f"unknown type {kind!r} in the function doc"
    want = PYTHON_TYPES[kind]
    inner = PYTHON_TYPES.get(schema.get("items", {}).get("type", "")) if kind in NESTED else None
    if kind == "tuple" and type(value) is tuple:
        value = list(value)
    if kind == "float" and type(value) is int:
        value = float(value)
    ok, variable = _type_ok(value, accepted, want, inner)
    if not ok:
        return f"type {type(value).__name__}, expected {kind}"
    if not variable:
        same = _same_value(value, accepted, want, inner)
        if same is not None:
            return "" if same else f"value {value!r} not accepted"
    return "" if value in accepted else f"value {value!r} not accepted"


def _same_value(value: Any, accepted: Accepted, want: type, inner: type | None) -> bool | None:
    """The type-specific comparison (None: plain equality applies)."""
    if want is dict:
        return _dict_ok(value, accepted)
    if want is list and inner is dict:
        return _list_of_dicts_ok(value, accepted)
    if want is str:
        return _norm(value) in [normalised(a) for a in accepted if type(a) is str]
    if want is list:
        options = [[_norm(x) for x in a] for a in accepted if isinstance(a, list | tuple | str)]
        return [_norm(v) for v in value] in options
    return None


def _type_ok(value: Any, accepted: Accepted, want: type, inner: type | None) -> tuple[bool, bool]:
    """(type accepted, read as a "variable"): BFCL's ``type_checker``, nested one level for lists."""
    answer_type = next((type(a) for a in accepted if a != ""), None)
    variable = answer_type is not None and answer_type is not want
    if type(value) is want:
        if inner is None:
            return True, variable
        assert isinstance(value, list)  # want is list whenever inner is set
        for option in accepted:
            if type(option) is not list or all(_type_ok(v, option, inner, None)[0] for v in value):
                return True, variable
        return False, variable
    if answer_type is not None and type(value) is answer_type:
        return True, True
    return False, variable


def _dict_ok(value: Mapping[Any, Any], accepted: Accepted) -> bool:
    return any(option != "" and _dict_matches(value, option) for option in accepted)


def _dict_matches(value: Mapping[Any, Any], option: Any) -> bool:
    if not isinstance(option, Mapping):
        return False
    for key, v in value.items():
        if key not in option or _norm(v) not in [_norm(x) for x in option[key]]:
            return False
    return all(key in value or "" in values for key, values in option.items())


def _list_of_dicts_ok(value: Sequence[Any], accepted: Accepted) -> bool:
    for option in accepted:
        if not isinstance(option, list | tuple | str) or len(value) != len(option):
            continue
        if all(isinstance(v, Mapping) and _dict_ok(v, [o]) for v, o in zip(value, option, strict=True)):
            return True
    return False


def check_calls(
    mode: str, functions: Sequence[Mapping[str, Any]], calls: Sequence[Call], answer: Sequence[Expected]
) -> str:
    """Why ``calls`` are not the ``answer`` (``""``: they are); ``mode``: simple, multiple or parallel."""
    if len(calls) != (1 if mode == "simple" else len(answer)):
        return f"{len(calls)} calls, expected {1 if mode == 'simple' else len(answer)}"
    if mode == "simple":
        return check_call(functions[0], calls[0], answer[0])
    docs = {}
    for expected in answer[:1] if mode == "multiple" else answer:  # BFCL's multiple checks the first call only
        name = next(iter(expected))
        doc = next((f for f in functions if f["name"] == name), None)
        if doc is None:
            return f"the expected function {name!r} is not among the functions offered"
        docs[name] = doc
    if mode == "multiple":
        return check_call(docs[next(iter(answer[0]))], calls[0], answer[0])
    return _greedy_match(docs, calls, answer)


def _greedy_match(docs: Mapping[str, Mapping[str, Any]], calls: Sequence[Call], answer: Sequence[Expected]) -> str:
    """BFCL's order-free matching: each expected call in turn takes the first unmatched call that passes."""
    free = list(range(len(calls)))
    for i, expected in enumerate(answer):
        doc = docs[next(iter(expected))]
        hit = next((j for j in free if not check_call(doc, calls[j], expected)), None)
        if hit is None:
            return f"no call matches expected call {i} ({next(iter(expected))})"
        free.remove(hit)
    return ""


def mode_of(category: str) -> str:
    """BFCL's dispatch by category name: relevance, irrelevance, parallel, multiple or simple."""
    for mode in ("irrelevance", "relevance", "parallel", "multiple"):
        if mode in category:
            return mode
    return "simple"


def verdict(
    output: str, functions: Sequence[Mapping[str, Any]], answer: Sequence[Expected] | None, mode: str
) -> Verdict:
    """BFCL's verdict on one raw answer under ``mode`` (``mode_of(category)``)."""
    try:
        calls = decode(output)
    except DecodeError as e:
        return Verdict(False, mode == "irrelevance", mode == "irrelevance", f"not parseable: {e}")
    if mode in ("irrelevance", "relevance"):
        right = (len(calls) == 0) == (mode == "irrelevance")
        return Verdict(bool(calls), right, right, "" if right else f"{len(calls)} calls")
    if answer is None:
        raise ValueError(f"a {mode} question needs its accepted calls")
    names = Counter(next(iter(c), "") for c in calls)
    right_function = names == Counter(next(iter(e)) for e in answer)
    why = check_calls(mode, functions, calls, answer)
    return Verdict(bool(calls), right_function, not why, why)


def grade(output: str, question: Mapping[str, Any], answer: Sequence[Expected] | None) -> tuple[bool, bool, bool]:
    """Partial credit for one answer: ``(parseable, right_function, correct)``: it decodes as one or more calls,
    it calls the expected functions (each as often as expected, in any order), BFCL counts it right.

    ``question`` is a BFCL-format question (its ``function`` list of docs; its ``id``, when it has one, names
    the category and so the check); ``answer`` the accepted calls in BFCL's ``ground_truth`` format, or None
    when no call should be made. Without an id: several expected calls are matched order-free, one expected
    call among several functions must pick the right one.
    """
    functions = question["function"]
    if "id" in question:
        mode = mode_of(str(question["id"]).rsplit("_", 1)[0])
    elif answer is None:
        mode = "irrelevance"
    else:
        mode = "parallel" if len(answer) > 1 else "multiple" if len(functions) > 1 else "simple"
    v = verdict(output, functions, answer, mode)
    return v.parseable, v.right_function, v.correct
