"""The tree-walking interpreter of the restricted Python subset (checked by ``pysafe.load_program`` first).

Each statement and expression node costs one step; builtins and methods cost the length of the sequences they
walk and build; every produced value passes ``pysafe_lib.check_value``. Python exceptions an operation raises on
bad operands (``TypeError``, ``IndexError``, ...) become :class:`CodeError` at the outermost call.
"""

from __future__ import annotations

import ast
import operator
import time
from collections.abc import Callable
from typing import Any

from agentmerge_zoo.real.pysafe_lib import (
    BUILTINS,
    METHODS,
    CodeError,
    Limits,
    Value,
    check_value,
    iterate,
    new_list,
    power,
    repeat,
    stored,
)

_FAILURES = (TypeError, ValueError, IndexError, KeyError, ZeroDivisionError, OverflowError, AttributeError)
_COMPARE: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in iterate(b),
    ast.NotIn: lambda a, b: a not in iterate(b),
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}
_ARITH: dict[type, Callable[[Any, Any], Any]] = {
    ast.Sub: operator.sub,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
}


class _Return(Exception):
    def __init__(self, value: Value) -> None:
        self.value = value


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


def _size(value: Value) -> int:
    return len(value) if isinstance(value, str | list | tuple) else 0


class Interpreter:
    """Runs the functions of one checked program under one set of limits (one instance per call)."""

    def __init__(self, functions: dict[str, ast.FunctionDef], limits: Limits) -> None:
        self.functions, self.limits = functions, limits
        self.steps, self.calls, self._next_clock = 0, 0, 256
        self.deadline = time.perf_counter() + limits.max_seconds

    def call_checked(self, name: str, args: list[Value]) -> Value:
        try:
            return self.call(name, [new_list(a, self.limits) if isinstance(a, list) else a for a in args])
        except _FAILURES as e:
            raise CodeError(type(e).__name__) from None
        except (RecursionError, MemoryError) as e:
            raise CodeError(type(e).__name__) from None

    def tick(self, n: int = 1) -> None:
        self.steps += n
        if self.steps > self.limits.max_steps:
            raise CodeError("step limit")
        if self.steps >= self._next_clock:
            self._next_clock = self.steps + 256
            if time.perf_counter() > self.deadline:
                raise CodeError("time limit")

    # ---------------------------------------------------------------------------------------------- statements

    def call(self, name: str, args: list[Value]) -> Value:
        fn = self.functions[name]
        params = [a.arg for a in fn.args.args]
        if len(args) != len(params):
            raise CodeError(f"{name} takes {len(params)} arguments, got {len(args)}")
        if self.calls >= self.limits.max_calls:
            raise CodeError("too many nested calls")
        self.calls += 1
        try:
            self.block(fn.body, dict(zip(params, args, strict=True)))
        except _Return as r:
            return r.value
        except (_Break, _Continue):
            raise CodeError("break or continue outside a loop") from None
        finally:
            self.calls -= 1
        return None

    def block(self, body: list[ast.stmt], env: dict[str, Value]) -> None:
        for node in body:
            self.stmt(node, env)

    def stmt(self, node: ast.stmt, env: dict[str, Value]) -> None:
        self.tick()
        if isinstance(node, ast.Return):
            raise _Return(self.expr(node.value, env) if node.value is not None else None)
        if isinstance(node, ast.Expr):
            self.expr(node.value, env)
        elif isinstance(node, ast.Assign):
            value = self.expr(node.value, env)
            for target in node.targets:
                self.assign(target, value, env)
        elif isinstance(node, ast.AugAssign):
            value = self.binop(node.op, self.expr(_as_load(node.target), env), self.expr(node.value, env))
            self.assign(node.target, value, env)
        elif isinstance(node, ast.If):
            self.block(node.body if self.expr(node.test, env) else node.orelse, env)
        elif isinstance(node, ast.For | ast.While):
            self.loop(node, env)
        elif isinstance(node, ast.Break):
            raise _Break
        elif isinstance(node, ast.Continue):
            raise _Continue

    def loop(self, node: ast.For | ast.While, env: dict[str, Value]) -> None:
        items = iter(list(iterate(self.expr(node.iter, env)))) if isinstance(node, ast.For) else None
        while True:
            self.tick()
            if items is not None:
                item = next(items, _Break)
                if item is _Break:
                    break
                self.assign(node.target, item, env)  # type: ignore[union-attr]
            elif not self.expr(node.test, env):  # type: ignore[union-attr]
                break
            try:
                self.block(node.body, env)
            except _Break:
                return
            except _Continue:
                continue
        self.block(node.orelse, env)

    def assign(self, target: ast.expr, value: Value, env: dict[str, Value]) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = check_value(value, self.limits)
        elif isinstance(target, ast.Tuple | ast.List):
            values = list(iterate(value))
            if len(values) != len(target.elts):
                raise CodeError("wrong number of values to unpack")
            for sub, v in zip(target.elts, values, strict=True):
                self.assign(sub, v, env)
        elif isinstance(target, ast.Subscript) and not isinstance(target.slice, ast.Slice):
            container = self.expr(target.value, env)
            if not isinstance(container, list):
                raise CodeError("only list items can be assigned")
            container[self.expr(target.slice, env)] = stored(value, self.limits)
        else:
            raise CodeError("unsupported assignment target")

    # ---------------------------------------------------------------------------------------------- expressions

    def expr(self, node: ast.expr, env: dict[str, Value]) -> Value:
        self.tick()
        if isinstance(node, ast.Constant):
            return check_value(node.value, self.limits)
        if isinstance(node, ast.Name):
            if node.id not in env:
                raise CodeError(f"undefined name {node.id!r}")
            return env[node.id]
        if isinstance(node, ast.BinOp):
            return self.binop(node.op, self.expr(node.left, env), self.expr(node.right, env))
        if isinstance(node, ast.UnaryOp):
            return self.unary(node, env)
        if isinstance(node, ast.BoolOp):
            return self.boolop(node, env)
        if isinstance(node, ast.Compare):
            return self.compare(node, env)
        if isinstance(node, ast.IfExp):
            return self.expr(node.body if self.expr(node.test, env) else node.orelse, env)
        if isinstance(node, ast.List | ast.Tuple):
            items = new_list([self.expr(e, env) for e in node.elts], self.limits)
            return items if isinstance(node, ast.List) else tuple(items)
        if isinstance(node, ast.Subscript):
            return self.subscript(node, env)
        if isinstance(node, ast.Call):
            return self.call_expr(node, env)
        if isinstance(node, ast.ListComp | ast.GeneratorExp):
            return self.comprehension(node, env)
        raise CodeError(f"{type(node).__name__} is not in the subset")

    def binop(self, op: ast.operator, a: Value, b: Value) -> Value:
        if isinstance(op, ast.Add):
            if isinstance(a, str | list | tuple) and _size(a) + _size(b) > self.limits.max_len:
                raise CodeError("sequence too long")
            result = a + b
        elif isinstance(op, ast.Mult):
            both_numbers = isinstance(a, int | float) and isinstance(b, int | float)
            result = a * b if both_numbers else repeat(a, b, self.limits)
        elif isinstance(op, ast.Mod):
            if not isinstance(a, int | float):
                raise CodeError("% is for numbers only")
            result = a % b
        elif isinstance(op, ast.Pow):
            result = power(a, b, self.limits)
        elif type(op) in _ARITH:
            result = _ARITH[type(op)](a, b)
        else:
            raise CodeError(f"operator {type(op).__name__} is not in the subset")
        self.tick(_size(result))
        return check_value(result, self.limits)

    def unary(self, node: ast.UnaryOp, env: dict[str, Value]) -> Value:
        value = self.expr(node.operand, env)
        if isinstance(node.op, ast.Not):
            return not value
        if not isinstance(value, int | float):
            raise CodeError("unary sign of a non-number")
        return check_value(-value if isinstance(node.op, ast.USub) else +value, self.limits)

    def boolop(self, node: ast.BoolOp, env: dict[str, Value]) -> Value:
        value: Value = None
        for sub in node.values:
            value = self.expr(sub, env)
            if bool(value) is isinstance(node.op, ast.Or):
                return value
        return value

    def compare(self, node: ast.Compare, env: dict[str, Value]) -> bool:
        left = self.expr(node.left, env)
        for op, sub in zip(node.ops, node.comparators, strict=True):
            right = self.expr(sub, env)
            self.tick(_size(left) + _size(right))
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True

    def subscript(self, node: ast.Subscript, env: dict[str, Value]) -> Value:
        container = self.expr(node.value, env)
        if not isinstance(container, str | list | tuple):
            raise CodeError("only strings, lists and tuples can be indexed")
        if isinstance(node.slice, ast.Slice):
            parts = (node.slice.lower, node.slice.upper, node.slice.step)
            bounds = [None if p is None else self.expr(p, env) for p in parts]
            result = container[slice(*bounds)]
            self.tick(len(result))
            return result
        return container[self.expr(node.slice, env)]

    def call_expr(self, node: ast.Call, env: dict[str, Value]) -> Value:
        args = [self.expr(a, env) for a in node.args]
        kwargs = {str(k.arg): self.expr(k.value, env) for k in node.keywords}
        self.tick(sum(_size(a) for a in args))
        if isinstance(node.func, ast.Attribute):
            target = self.expr(node.func.value, env)
            method = METHODS.get((type(target), node.func.attr))
            if method is None:
                raise CodeError(f".{node.func.attr} of {type(target).__name__} is not in the subset")
            self.tick(_size(target))
            result = method(self.limits, target, *args, **kwargs)
        elif not isinstance(node.func, ast.Name) or node.func.id in env:
            raise CodeError("only named functions can be called")
        elif node.func.id in self.functions:
            result = self.call(node.func.id, args)
        else:
            result = BUILTINS[node.func.id](self.limits, *args, **kwargs)
        self.tick(_size(result))
        return check_value(result, self.limits)

    def comprehension(self, node: ast.ListComp | ast.GeneratorExp, env: dict[str, Value]) -> list[Value]:
        out: list[Value] = []
        self._generate(node.elt, node.generators, dict(env), out)
        return out

    def _generate(self, elt: ast.expr, gens: list[ast.comprehension], env: dict[str, Value], out: list[Value]) -> None:
        if not gens:
            if len(out) >= self.limits.max_len:
                raise CodeError("sequence too long")
            out.append(stored(self.expr(elt, env), self.limits))
            return
        first, rest = gens[0], gens[1:]
        for item in list(iterate(self.expr(first.iter, env))):
            self.tick()
            self.assign(first.target, item, env)
            if all(self.expr(cond, env) for cond in first.ifs):
                self._generate(elt, rest, env, out)


def _as_load(target: ast.expr) -> ast.expr:
    """The target of ``x += 1`` read as an expression (Name or Subscript with a Load context)."""
    if isinstance(target, ast.Name):
        return ast.Name(id=target.id, ctx=ast.Load())
    if isinstance(target, ast.Subscript):
        return ast.Subscript(value=target.value, slice=target.slice, ctx=ast.Load())
    raise CodeError("unsupported augmented assignment target")
