"""A model's raw answer -> the function calls it makes, by the rules of BFCL's prompt mode.

BFCL (``default_decode_ast_prompting``) reads an answer as a Python list of calls:

1. strip backticks, newlines and spaces from both ends; add ``[`` in front unless the text starts with one and
   ``]`` at the end unless it ends with one (so ``f(a=1)`` and ``f(a=1), g(b=2)`` are lists of calls);
2. strip whitespace, then single quotes, from both ends and parse the text as one Python expression; it must be
   a call or a list (or tuple or set) whose every element is a call, else the answer is **not parseable**;
3. a call's name is its dotted name (``math.sqrt``; a part that is not a name, as in ``f()()``, is dropped);
   only **keyword** arguments count — positional ones are silently ignored;
4. an argument's value: a literal as itself (``...`` as the string ``"..."``); a bare name as its text
   (``x=pi`` -> ``"pi"``); a call without keywords as its source text, one with keywords as a nested
   ``{name: {argument: value}}``; a subscript as its source text; lists, tuples and dicts element-wise;
   any unary operator applied to a number **negates** it (BFCL's rule: ``+5`` and ``~5`` read as ``-5``,
   ``not True`` as ``-1``); arithmetic (``2*3``) is evaluated. Anything else (a set, an f-string, a
   comparison, a lambda, ``**kwargs`` in a dict) makes the answer not parseable.

BFCL evaluates arithmetic with Python's ``eval``; here only arithmetic on literals is computed (numbers,
strings, lists, within size limits), and an operand that is a name or a call makes the answer not parseable
(``eval`` would look the name up: a NameError for everything but Python's builtins).
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from typing import Any

Call = dict[str, dict[Any, Any]]  # {function name: {argument: value}}, as BFCL decodes it

MAX_POWER = 10_000  # |exponent| at most this in arithmetic
MAX_REPEAT = 100_000  # a string or list repeated at most this many times
_OPERATORS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.BitOr: operator.or_,
    ast.BitAnd: operator.and_,
    ast.BitXor: operator.xor,
    ast.LShift: operator.lshift,
    ast.RShift: operator.rshift,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
    ast.Invert: operator.invert,
    ast.Not: operator.not_,
}


class DecodeError(ValueError):
    """The answer is not a list of function calls."""


def decode(text: str) -> list[Call]:
    """The calls in ``text`` (see the module docstring), or a ``DecodeError`` saying why there are none."""
    text = text.strip("`\n ")
    if not text.startswith("["):
        text = "[" + text
    if not text.endswith("]"):
        text = text + "]"
    try:
        tree = ast.parse(text.strip().strip("'"), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise DecodeError(f"not Python: {type(e).__name__}") from None
    body = tree.body
    if isinstance(body, ast.Call):
        return [_call(body)]
    if not isinstance(body, ast.List | ast.Tuple | ast.Set):
        raise DecodeError(f"not a list of calls ({type(body).__name__})")
    calls = []
    for element in body.elts:
        if not isinstance(element, ast.Call):
            raise DecodeError(f"an element is not a call ({type(element).__name__})")
        calls.append(_call(element))
    return calls


def _call(node: ast.Call) -> Call:
    parts = []
    func = node.func
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    args: dict[Any, Any] = {}
    for keyword in node.keywords:  # positional arguments are ignored, as BFCL does
        args[keyword.arg] = _value(keyword.value)
    return {".".join(reversed(parts)): args}


def _value(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant):
        return "..." if node.value is Ellipsis else node.value
    if isinstance(node, ast.UnaryOp):
        return _negated(node.operand)
    if isinstance(node, ast.List):
        return [_value(v) for v in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(_value(v) for v in node.elts)
    if isinstance(node, ast.Dict):
        return _dict(node)
    if isinstance(node, ast.BinOp):
        return _arithmetic(node)
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Call):
        return _call(node) if node.keywords else ast.unparse(node)
    if isinstance(node, ast.Subscript):
        return f"{ast.unparse(node.value)}[{ast.unparse(node.slice)}]"
    raise DecodeError(f"unsupported value {type(node).__name__}")


def _negated(operand: ast.expr) -> Any:
    """BFCL reads every unary operator as minus, applied to the operand's literal value."""
    if isinstance(operand, ast.Constant) and isinstance(operand.value, int | float | complex):
        return -operand.value  # bool is an int: -True == -1
    raise DecodeError(f"unsupported unary operand {type(operand).__name__}")


def _dict(node: ast.Dict) -> dict[Any, Any]:
    out = {}
    for key, value in zip(node.keys, node.values, strict=True):
        if key is None:
            raise DecodeError("** in a dict")
        k = _value(key)
        try:
            hash(k)
        except TypeError:
            raise DecodeError("an unhashable dict key") from None
        out[k] = _value(value)
    return out


def _arithmetic(node: ast.expr) -> Any:
    """Python arithmetic on literals (what BFCL's ``eval`` computes), within size limits."""
    if isinstance(node, ast.Constant) and not isinstance(node.value, type(Ellipsis)):
        return node.value
    if isinstance(node, ast.UnaryOp):
        return _apply(_UNARY[type(node.op)], _arithmetic(node.operand))
    if isinstance(node, ast.List | ast.Tuple):
        items = [_arithmetic(v) for v in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _arithmetic(node.left), _arithmetic(node.right)
        _check_size(node.op, left, right)
        return _apply(_OPERATORS[type(node.op)], left, right)
    raise DecodeError(f"arithmetic on {type(node).__name__} is not computed here")


def _check_size(op: ast.operator, left: Any, right: Any) -> None:
    if isinstance(op, ast.Pow | ast.LShift) and isinstance(right, int | float) and abs(right) > MAX_POWER:
        raise DecodeError("an exponent or shift too large to compute")
    if isinstance(op, ast.Mod) and isinstance(left, str | bytes):
        raise DecodeError("%-formatting is not computed here")
    if isinstance(op, ast.Mult):
        for seq, times in ((left, right), (right, left)):
            if isinstance(seq, str | bytes | list | tuple) and isinstance(times, int) and times > MAX_REPEAT:
                raise DecodeError("a repetition too large to compute")


def _apply(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except (TypeError, ValueError, ArithmeticError, MemoryError) as e:
        raise DecodeError(f"arithmetic failed: {type(e).__name__}") from None
