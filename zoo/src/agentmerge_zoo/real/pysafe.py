"""A restricted interpreter for a small subset of Python: the verifier of the code skill.

Model output is **never executed as Python**. The source is parsed with :func:`ast.parse` (parsing runs no code),
every node of every top-level ``def`` is checked against an allow-list, and the function is run by this module's
own tree-walking interpreter over the values of :mod:`pysafe_lib`. Any top-level statement other than ``def`` and
a docstring (an import, an example call) refuses the whole program.

The subset: ``def`` with positional parameters; ``return``, ``=`` (to names, tuples of names, ``x[i]``), ``+=``
and friends, ``if`` / ``elif`` / ``else``, ``for`` over lists, tuples, strings and ``range``, ``while``,
``break``, ``continue``, ``pass``; expressions over ints, floats, strings, lists and tuples with arithmetic,
comparisons, ``and`` / ``or`` / ``not``, conditional expressions, indexing and slicing, list comprehensions and
generator expressions, calls of the program's own functions, of the builtins in ``pysafe_lib.BUILTINS`` and of
the string and list methods in ``pysafe_lib.METHODS``. No imports, attributes other than those methods, names
with a leading underscore, ``global``, ``lambda``, ``with``, ``try``, classes, dicts, sets or keyword arguments
(but ``reverse=`` of ``sorted`` / ``sort``).

Limits (:class:`Limits`): source length, syntax depth, steps per call (each node evaluated and each element a
builtin walks or builds costs one), sequence length, integer size, nested calls and wall-clock time. Anything
outside the subset or over a limit raises :class:`CodeError`, which the verifier scores as a failure.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from dataclasses import dataclass

from agentmerge_zoo.real.pysafe_eval import Interpreter
from agentmerge_zoo.real.pysafe_lib import BUILTINS, KEYWORDS, METHOD_NAMES, CodeError, Limits, Value

__all__ = ["CodeError", "Limits", "Program", "extract_code", "load_program", "run_function"]

_STATEMENTS = (ast.Return, ast.Assign, ast.AugAssign, ast.If, ast.For, ast.While, ast.Break, ast.Continue, ast.Pass)
_EXPRESSIONS = (ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Compare, ast.IfExp, ast.Call, ast.Constant, ast.Name)
_CONTAINERS = (ast.List, ast.Tuple, ast.Subscript, ast.Slice, ast.ListComp, ast.GeneratorExp, ast.comprehension)
_OPERATORS = (ast.operator, ast.unaryop, ast.cmpop, ast.boolop, ast.expr_context)
_ALLOWED = (
    ast.FunctionDef,
    ast.arguments,
    ast.arg,
    ast.Expr,
    ast.keyword,
    ast.Attribute,
    *_STATEMENTS,
    *_EXPRESSIONS,
    *_CONTAINERS,
    *_OPERATORS,
)
_BANNED_OPERATORS = (ast.MatMult, ast.LShift, ast.RShift, ast.BitOr, ast.BitXor, ast.BitAnd, ast.Invert)
# possessive [ \t]*+ and the language's spaces only after the language: the spaces after a fence match one way
# only, so a fence followed by 60 k spaces is one linear pass (the two plain [ \t]* around an optional word
# split any run of spaces every way: quadratic)
_FENCE = re.compile(r"```[ \t]*+(?:(?:python|py|Python)[ \t]*+)?\n(.*?)(?:```|\Z)", re.S)


@dataclass(frozen=True)
class Program:
    """The checked functions of a source text, by name, in definition order."""

    functions: dict[str, ast.FunctionDef]

    def entry(self, preferred: str) -> str:
        """``preferred`` if defined, else the first function."""
        return preferred if preferred in self.functions else next(iter(self.functions))


def extract_code(text: str) -> str:
    """The first fenced code block of a completion (an unclosed one runs to the end), else the whole text."""
    match = _FENCE.search(text)
    return match.group(1) if match else text


def load_program(source: str, limits: Limits | None = None) -> Program:
    """Parse and check ``source``; :class:`CodeError` when it has no function or leaves the subset."""
    limits = limits or Limits()
    if len(source) > limits.max_source:
        raise CodeError("source too long")
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise CodeError(f"does not parse: {type(e).__name__}") from None
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) and not _is_docstring(node):
            raise CodeError(f"top-level {type(node).__name__}: only def (and docstrings) at the top level")
    functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
    if not functions:
        raise CodeError("no function defined")
    for node in functions.values():
        _check_function(node, set(functions), limits)
    return Program(functions)


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _check_function(fn: ast.FunctionDef, names: set[str], limits: Limits) -> None:
    args = fn.args
    if fn.decorator_list or args.vararg or args.kwarg or args.kwonlyargs or args.defaults or args.posonlyargs:
        raise CodeError(f"def {fn.name}: only plain positional parameters")
    stack: list[tuple[ast.AST, int]] = [(stmt, 1) for stmt in fn.body]
    stack += [(a, 1) for a in args.args]
    while stack:
        node, depth = stack.pop()
        if depth > limits.max_depth:
            raise CodeError("nested too deeply")
        _check_node(node, names)
        for child in _children(node):
            stack.append((child, depth + 1))
    _check_name(fn.name)


def _children(node: ast.AST) -> list[ast.AST]:
    """Child nodes, leaving out annotations (never evaluated) and docstring-like constant statements."""
    out = []
    for field, value in ast.iter_fields(node):
        if field in ("annotation", "returns", "type_comment"):
            continue
        items = value if isinstance(value, list) else [value]
        out += [v for v in items if isinstance(v, ast.AST)]
    return out


def _check_node(node: ast.AST, functions: set[str]) -> None:
    if not isinstance(node, _ALLOWED) or isinstance(node, _BANNED_OPERATORS):
        raise CodeError(f"{type(node).__name__} is not in the subset")
    if isinstance(node, ast.Name):
        _check_name(node.id)
    elif isinstance(node, ast.arg):
        _check_name(node.arg)
    elif isinstance(node, ast.FunctionDef):
        raise CodeError("nested def is not in the subset")
    elif isinstance(node, ast.Constant) and not isinstance(node.value, int | float | str | bool | type(None)):
        raise CodeError("constant of an unsupported type")
    elif isinstance(node, ast.Attribute) and node.attr not in METHOD_NAMES:
        raise CodeError(f"attribute .{node.attr} is not in the subset")
    elif isinstance(node, ast.Call):
        _check_call(node, functions)
    elif isinstance(node, ast.comprehension) and node.is_async:
        raise CodeError("async comprehension")


def _check_call(node: ast.Call, functions: set[str]) -> None:
    func = node.func
    if isinstance(func, ast.Name):
        name = func.id
        if name not in BUILTINS and name not in functions:
            raise CodeError(f"call of {name!r} is not in the subset")
    elif isinstance(func, ast.Attribute):
        name = func.attr
    else:
        raise CodeError("only named functions and methods can be called")
    allowed = KEYWORDS.get(name, set())
    if any(k.arg not in allowed for k in node.keywords) or any(isinstance(a, ast.Starred) for a in node.args):
        raise CodeError(f"call of {name!r}: keyword or starred arguments are not in the subset")


def _check_name(name: str) -> None:
    if name.startswith("_"):
        raise CodeError(f"name {name!r}: leading underscores are not in the subset")


def run_function(program: Program, name: str, args: Sequence[Value], limits: Limits | None = None) -> Value:
    """Call ``name`` of ``program`` on ``args`` (deep-copied) in the interpreter; :class:`CodeError` on failure."""
    interpreter = Interpreter(program.functions, limits or Limits())
    return interpreter.call_checked(name, list(args))
