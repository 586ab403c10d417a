"""Values, size limits, builtins and methods of the restricted Python interpreter (see ``pysafe``).

Values are ``None``, ``bool``, ``int``, ``float``, ``str``, ``list`` and ``tuple``. A container holds scalars or
flat tuples of scalars: a list placed inside a container is stored as a tuple copy, so no value nests deeper than
two levels and no value can contain itself. Every result is checked against the limits *before* it is built
where its size can be known in advance (``"a" * n``, ``range``, ``join``, ``replace``), and after otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Value = Any  # None | bool | int | float | str | list[Value] | tuple[Value, ...]
SCALARS = (type(None), bool, int, float, str)


class CodeError(Exception):
    """Any program that is not in the subset, fails, or exceeds a limit (it scores 0)."""


@dataclass(frozen=True)
class Limits:
    """Bounds on one call of a program."""

    max_source: int = 2000  # characters of source
    max_steps: int = 10_000  # evaluated nodes, plus the length of every sequence an operation walks or builds
    max_len: int = 1000  # elements of a list or tuple, characters of a string
    max_int: int = 10**12  # |int| and |float|
    max_calls: int = 8  # nested calls of the program's own functions
    max_depth: int = 40  # nesting depth of the syntax tree
    max_seconds: float = 1.0  # wall clock, checked every 256 steps


def check_value(value: Value, limits: Limits) -> Value:
    """``value`` if it is within the limits, else :class:`CodeError`."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        if abs(value) > limits.max_int:
            raise CodeError("integer out of range")
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or abs(value) > limits.max_int:
            raise CodeError("float out of range")
        return value
    if isinstance(value, str | list | tuple):
        if len(value) > limits.max_len:
            raise CodeError("sequence too long")
        return value
    raise CodeError(f"value of type {type(value).__name__} not allowed")


def stored(value: Value, limits: Limits) -> Value:
    """A value as a container element: lists become tuples; only scalars may sit inside those."""
    if isinstance(value, list | tuple):
        if any(not isinstance(v, SCALARS) for v in value):
            raise CodeError("values nest at most two levels")
        return tuple(value)
    return check_value(value, limits)


def new_list(items: Sequence[Value], limits: Limits) -> list[Value]:
    if len(items) > limits.max_len:
        raise CodeError("sequence too long")
    return [stored(v, limits) for v in items]


def iterate(value: Value) -> Sequence[Value]:
    if isinstance(value, list | tuple | str):
        return value
    raise CodeError(f"cannot iterate over {type(value).__name__}")


def repeat(seq: Value, times: Value, limits: Limits) -> Value:
    """``seq * times`` with the length checked first."""
    if isinstance(seq, int) and isinstance(times, str | list | tuple):
        seq, times = times, seq
    if not isinstance(times, int) or isinstance(times, bool):
        raise CodeError("a sequence repeats an integer number of times")
    if len(seq) * max(times, 0) > limits.max_len:
        raise CodeError("sequence too long")
    return seq * times


def power(base: Value, exp: Value, limits: Limits) -> Value:
    if isinstance(exp, int) and not isinstance(exp, bool) and isinstance(base, int):
        if exp < 0 or (exp > 64 and abs(base) > 1):
            raise CodeError("exponent out of range")
        return check_value(base**exp, limits)
    if isinstance(base, int | float) and isinstance(exp, int | float) and abs(exp) <= 64:
        try:
            return check_value(float(base) ** float(exp), limits)
        except (OverflowError, ZeroDivisionError) as e:
            raise CodeError(str(e)) from None
    raise CodeError("bad operands of **")


def _range(limits: Limits, *args: Value) -> list[int]:
    if not args or len(args) > 3 or any(not isinstance(a, int) or isinstance(a, bool) for a in args):
        raise CodeError("range takes 1 to 3 integers")
    r = range(*args)
    if len(r) > limits.max_len:
        raise CodeError("range too long")
    return list(r)


def _sorted(limits: Limits, seq: Value, reverse: Value = False) -> list[Value]:
    return new_list(sorted(iterate(seq), reverse=bool(reverse)), limits)


def _to_str(limits: Limits, value: Value = "") -> str:
    if not isinstance(value, SCALARS):
        raise CodeError("str() of a container is not allowed")
    return str(check_value(value, limits))


def _to_int(limits: Limits, value: Value = 0) -> int:
    if isinstance(value, str) and len(value.strip()) > 20:
        raise CodeError("int() of a long string")
    if not isinstance(value, int | float | str):
        raise CodeError("int() of a container")
    return int(check_value(int(value), limits))


def _min_max(pick: Callable[..., Value]) -> Callable[..., Value]:
    def run(limits: Limits, *args: Value) -> Value:
        items = iterate(args[0]) if len(args) == 1 else args
        return pick(items)

    return run


def _join(limits: Limits, sep: str, items: Value) -> str:
    parts = list(iterate(items))
    if any(not isinstance(p, str) for p in parts):
        raise CodeError("join takes strings")
    if sum(map(len, parts)) + len(sep) * len(parts) > limits.max_len:
        raise CodeError("string too long")
    return sep.join(parts)


def _replace(limits: Limits, s: str, old: Value, new: Value) -> str:
    if not isinstance(old, str) or not isinstance(new, str) or not old:
        raise CodeError("replace takes two strings, the first non-empty")
    if len(s) + s.count(old) * len(new) > limits.max_len:
        raise CodeError("string too long")
    return s.replace(old, new)


def _grow(limits: Limits, seq: list[Value], extra: int) -> None:
    if len(seq) + extra > limits.max_len:
        raise CodeError("list too long")


def _append(limits: Limits, seq: list[Value], item: Value) -> None:
    _grow(limits, seq, 1)
    seq.append(stored(item, limits))


def _insert(limits: Limits, seq: list[Value], index: Value, item: Value) -> None:
    _grow(limits, seq, 1)
    seq.insert(index, stored(item, limits))


def _extend(limits: Limits, seq: list[Value], items: Value) -> None:
    more = list(iterate(items))
    _grow(limits, seq, len(more))
    seq.extend(stored(v, limits) for v in more)


def _sort(limits: Limits, seq: list[Value], reverse: Value = False) -> None:
    seq.sort(reverse=bool(reverse))


Builtin = Callable[..., Value]
BUILTINS: dict[str, Builtin] = {
    "len": lambda limits, x: len(iterate(x)),
    "abs": lambda limits, x: check_value(abs(x), limits),
    "min": _min_max(min),
    "max": _min_max(max),
    "sum": lambda limits, x: check_value(sum(iterate(x)), limits),
    "any": lambda limits, x: any(iterate(x)),
    "all": lambda limits, x: all(iterate(x)),
    "sorted": _sorted,
    "reversed": lambda limits, x: new_list(list(reversed(iterate(x))), limits),
    "list": lambda limits, x=(): new_list(list(iterate(x)), limits),
    "tuple": lambda limits, x=(): tuple(new_list(list(iterate(x)), limits)),
    "range": _range,
    "enumerate": lambda limits, x: new_list(list(enumerate(iterate(x))), limits),
    "zip": lambda limits, a, b: new_list(list(zip(iterate(a), iterate(b), strict=False)), limits),
    "str": _to_str,
    "int": _to_int,
    "bool": lambda limits, x=False: bool(x),
    "round": lambda limits, x, n=0: check_value(round(x, n if isinstance(n, int) and abs(n) <= 10 else 0), limits),
}
KEYWORDS = {"sorted": {"reverse"}, "sort": {"reverse"}}  # the only keyword arguments any call takes

_STR_METHODS = ("upper", "lower", "strip", "lstrip", "rstrip", "title", "capitalize", "isdigit", "isalpha")
_STR_ARGS = ("split", "startswith", "endswith", "count", "find", "index")
METHODS: dict[tuple[type, str], Builtin] = {
    **{(str, m): (lambda name: lambda limits, s, *a: getattr(s, name)(*a))(m) for m in _STR_METHODS + _STR_ARGS},
    (str, "join"): _join,
    (str, "replace"): _replace,
    (list, "append"): _append,
    (list, "insert"): _insert,
    (list, "extend"): _extend,
    (list, "sort"): _sort,
    (list, "pop"): lambda limits, seq, *a: seq.pop(*a),
    (list, "index"): lambda limits, seq, x: seq.index(x),
    (list, "count"): lambda limits, seq, x: seq.count(x),
    (list, "reverse"): lambda limits, seq: seq.reverse(),
    (list, "copy"): lambda limits, seq: list(seq),
    (tuple, "index"): lambda limits, seq, x: seq.index(x),
    (tuple, "count"): lambda limits, seq, x: seq.count(x),
}
METHOD_NAMES = frozenset(name for _, name in METHODS)
