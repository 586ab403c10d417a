"""A tiny, safe interpreter for the zoo's coding task.

Programs are ``;``-separated statements over single-letter variables::

    a=3;b=a*2-1;?b

Each statement is either an assignment ``name=expr`` or the final query ``?name``. Expressions use integer
literals, variables, unary minus, ``+``, ``-``, ``*`` and parentheses. The interpreter is a hand-written
tokenizer and recursive-descent parser: no ``eval``/``exec`` of any text, bounded input length and bounded
integer size, so any model output or prompt can be fed to it safely.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_SOURCE_CHARS = 512
MAX_ABS_VALUE = 10**9


class MiniLangError(ValueError):
    """Raised for any program that does not parse or cannot be evaluated."""


@dataclass(frozen=True)
class _Token:
    kind: str  # "int", "name", or the operator character itself
    text: str


def _tokenize(src: str) -> list[_Token]:
    """Split an expression into tokens; reject any character outside the language."""
    tokens: list[_Token] = []
    i = 0
    while i < len(src):
        ch = src[i]
        if ch.isdigit():
            j = i
            while j < len(src) and src[j].isdigit():
                j += 1
            tokens.append(_Token("int", src[i:j]))
            i = j
        elif "a" <= ch <= "z":
            tokens.append(_Token("name", ch))
            i += 1
        elif ch in "+-*()":
            tokens.append(_Token(ch, ch))
            i += 1
        else:
            raise MiniLangError(f"unexpected character {ch!r}")
    return tokens


class _Parser:
    """Recursive-descent evaluator over a token list with a variable environment."""

    def __init__(self, tokens: list[_Token], env: dict[str, int]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.env = env

    def _peek(self) -> str | None:
        return self.tokens[self.pos].kind if self.pos < len(self.tokens) else None

    def _take(self) -> _Token:
        if self.pos >= len(self.tokens):
            raise MiniLangError("unexpected end of expression")
        tok = self.tokens[self.pos]
        self.pos += 1
        return tok

    def parse(self) -> int:
        value = self._expr(depth=0)
        if self.pos != len(self.tokens):
            raise MiniLangError("trailing tokens")
        return value

    def _expr(self, depth: int) -> int:
        value = self._term(depth)
        while self._peek() in ("+", "-"):
            op = self._take().kind
            rhs = self._term(depth)
            value = value + rhs if op == "+" else value - rhs
            _check_size(value)
        return value

    def _term(self, depth: int) -> int:
        value = self._factor(depth)
        while self._peek() == "*":
            self._take()
            value *= self._factor(depth)
            _check_size(value)
        return value

    def _factor(self, depth: int) -> int:
        if depth > 32:
            raise MiniLangError("expression nested too deeply")
        tok = self._take()
        if tok.kind == "int":
            if len(tok.text) > 9:
                raise MiniLangError("integer literal too long")
            return int(tok.text)
        if tok.kind == "name":
            if tok.text not in self.env:
                raise MiniLangError(f"undefined variable {tok.text!r}")
            return self.env[tok.text]
        if tok.kind == "-":
            return -self._factor(depth + 1)
        if tok.kind == "(":
            value = self._expr(depth + 1)
            if self._take().kind != ")":
                raise MiniLangError("missing ')'")
            return value
        raise MiniLangError(f"unexpected token {tok.text!r}")


def _check_size(value: int) -> None:
    if abs(value) > MAX_ABS_VALUE:
        raise MiniLangError("value out of range")


def eval_expr(src: str, env: dict[str, int] | None = None) -> int:
    """Evaluate one expression with the given variables."""
    return _Parser(_tokenize(src), dict(env or {})).parse()


def run_program(src: str) -> int:
    """Run a whole program and return the value of its final ``?name`` query."""
    if len(src) > MAX_SOURCE_CHARS:
        raise MiniLangError("program too long")
    statements = src.split(";")
    env: dict[str, int] = {}
    for stmt in statements[:-1]:
        name, sep, expr = stmt.partition("=")
        if not sep or len(name) != 1 or not ("a" <= name <= "z"):
            raise MiniLangError(f"bad assignment {stmt!r}")
        env[name] = eval_expr(expr, env)
    query = statements[-1]
    if len(query) != 2 or query[0] != "?" or query[1] not in env:
        raise MiniLangError(f"bad query {query!r}")
    return env[query[1]]


def parse_int(text: str) -> int | None:
    """Parse a model's answer as a plain (optionally negative) integer; None when it is not one."""
    body = text[1:] if text.startswith("-") else text
    if not body or not body.isdigit() or len(body) > 9:
        return None
    return int(text)
