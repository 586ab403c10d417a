"""The coding task's safe interpreter: correct values, and refusal of anything outside the language."""

from __future__ import annotations

import pytest

from agentmerge_zoo.minilang import MiniLangError, eval_expr, parse_int, run_program


@pytest.mark.parametrize(
    ("src", "value"),
    [
        ("a=3;?a", 3),
        ("a=3;b=a*2-1;?b", 5),
        ("a=2;b=a+a*3;?b", 8),
        ("a=2;b=(a+1)*3;?b", 9),
        ("a=4;b=-a+1;?b", -3),
        ("x=9;y=x-9;z=y*3;?z", 0),
    ],
)
def test_run_program_values(src: str, value: int) -> None:
    assert run_program(src) == value


@pytest.mark.parametrize(
    "src",
    [
        "",
        "a=3",
        "a=3;?b",
        "a=b;?a",
        "a=3;?a;",
        "ab=3;?ab",
        "a=__import__('os');?a",
        "a=3/1;?a",
        "a=(3;?a",
        "a=3)+1;?a",
        "a=9999999999;?a",
        "a=3;b=a" + "*a" * 40 + ";?b",
        "a=" + "(" * 50 + "1" + ")" * 50 + ";?a",
        "a=1;" * 200 + "?a",
    ],
)
def test_run_program_rejects(src: str) -> None:
    with pytest.raises(MiniLangError):
        run_program(src)


def test_eval_expr_uses_environment() -> None:
    assert eval_expr("a*b+1", {"a": 3, "b": 4}) == 13


@pytest.mark.parametrize(("text", "value"), [("7", 7), ("-12", -12), ("0", 0)])
def test_parse_int_accepts(text: str, value: int) -> None:
    assert parse_int(text) == value


@pytest.mark.parametrize("text", ["", "-", "1.0", " 1", "1 ", "a", "--1", "1-", "1234567890"])
def test_parse_int_rejects(text: str) -> None:
    assert parse_int(text) is None
