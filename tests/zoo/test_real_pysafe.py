"""The code skill's restricted interpreter: Python's semantics on the subset, limits, and hostile programs."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentmerge_zoo.real.pysafe import CodeError, Limits, extract_code, load_program, run_function
from agentmerge_zoo.real.skill_code import CodeSkill, run_tests
from agentmerge_zoo.real.tasks import Example

# Trusted programs written here: the reference is CPython running them (the interpreter must agree).
PROGRAMS = {
    "sum_even": ("def f(xs):\n    return sum(x for x in xs if x % 2 == 0)", [[1, 2, 3, 4, -6]]),
    "loop_while": (
        "def f(n):\n    t = 0\n    i = 1\n    while i <= n:\n        t += i\n        i += 1\n    return t",
        [10],
    ),
    "for_else": (
        "def f(xs):\n    for x in xs:\n        if x > 5:\n            break\n    else:\n        return -1\n    return x",
        [[1, 7, 9]],
    ),
    "continue": (
        "def f(xs):\n    out = []\n    for x in xs:\n        if x < 0:\n            continue\n        out.append(x * 2)\n    return out",
        [[3, -1, 4]],
    ),
    "slices": ("def f(s):\n    return s[::-1].upper() + s[1:3] + s[-1]", ["hello"]),
    "methods": (
        "def f(s):\n    w = s.split()\n    w.sort(reverse=True)\n    return '-'.join(w).replace('a', '4')",
        ["banana apple cherry"],
    ),
    "comprehension": ("def f(xs):\n    return [a * b for a in xs for b in xs if a < b]", [[1, 2, 3]]),
    "unpack": ("def f(xs):\n    a, b = xs[0], xs[-1]\n    return [b, a] if a < b else (a, b)", [[1, 5]]),
    "helper": ("def g(x):\n    return x * x\n\ndef f(xs):\n    return max(g(x) for x in xs) - min(xs)", [[-3, 2]]),
    "recursion": ("def f(n):\n    return 1 if n <= 1 else n * f(n - 1)", [6]),
    "builtins": (
        "def f(xs):\n    return [len(xs), abs(-3), sorted(xs), list(reversed(xs)), any(xs), all(xs), round(7 / 2)] + list(range(2, 9, 3))",
        [[3, 0, 2]],
    ),
    "enumerate_zip": (
        "def f(xs):\n    return [i * x for i, x in enumerate(xs)] + [a + b for a, b in zip(xs, xs[1:])]",
        [[4, 5, 6]],
    ),
    "ints_strs": ("def f(n):\n    return int(str(n)[::-1]) + n // 7 - n % 7 + 2 ** 10", [1234]),
    "boolops": ("def f(a, b):\n    return (a and b) or (not a and 'x') or None", [0, 3]),
    "compare_chain": ("def f(x):\n    return 1 < x <= 5 and x not in [2, 3] and x != 4", [5]),
    "item_assign": ("def f(xs):\n    ys = list(xs)\n    ys[0] = 99\n    ys[-1] += 1\n    return ys", [[1, 2, 3]]),
    "ifexp_float": ("def f(x):\n    return x / 4 if x > 0 else -x", [10]),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_interpreter_agrees_with_python(name: str) -> None:
    source, args = PROGRAMS[name]
    namespace: dict[str, Any] = {}
    exec(compile(source, name, "exec"), namespace)  # trusted test code, the reference
    expected = namespace["f"](*[list(a) if isinstance(a, list) else a for a in args])
    if isinstance(expected, list):  # documented: a list inside a container is stored as a tuple
        expected = [tuple(v) if isinstance(v, list) else v for v in expected]
    program = load_program(source)
    assert run_function(program, "f", args) == expected


def test_arguments_are_copied() -> None:
    xs = [1, 2]
    program = load_program("def f(xs):\n    xs.append(3)\n    return len(xs)")
    assert run_function(program, "f", [xs]) == 3
    assert xs == [1, 2]


@pytest.mark.parametrize(
    "source",
    [
        "import os\ndef f(x):\n    return os.getcwd()",
        "def f(x):\n    return __import__('os')",
        "def f(x):\n    return eval('1')",
        "def f(x):\n    return exec('x = 1')",
        "def f(x):\n    return open('/etc/passwd')",
        "def f(x):\n    return x.__class__",
        "def f(x):\n    return getattr(x, 'real')",
        "def f(x):\n    return (lambda y: y)(x)",
        "def f(x):\n    return {'a': x}",
        "def f(x):\n    return f'{x}'",
        "def f(x):\n    global y\n    return x",
        "def f(x):\n    try:\n        return x\n    except Exception:\n        return 0",
        "def f(x):\n    with x:\n        return 1",
        "class A:\n    pass\ndef f(x):\n    return A()",
        "@staticmethod\ndef f(x):\n    return x",
        "def f(x, *a):\n    return x",
        "def f(x):\n    def g():\n        return 1\n    return g()",
        "def f(x):\n    return [].__len__()",
        "def f(x):\n    _y = 1\n    return _y",
        "def f(x):\n    return sorted(x, key=len)",
        "def f(x):\n    return x @ x",
        "x = 1",
        "not python at all (",
    ],
)
def test_outside_the_subset_is_refused(source: str) -> None:
    with pytest.raises(CodeError):
        program = load_program(source)
        run_function(program, program.entry("f"), [[1]])


@pytest.mark.parametrize(
    ("source", "arg"),
    [
        ("def f(x):\n    while True:\n        x += 1", 0),  # an infinite loop: the step limit
        ("def f(x):\n    return 'a' * 10 ** 9", 0),  # a huge string, refused before it is built
        ("def f(x):\n    return [0] * 10 ** 9", 0),
        ("def f(x):\n    return list(range(10 ** 9))", 0),
        ("def f(x):\n    return 10 ** 10 ** 10", 0),  # a huge integer
        ("def f(x):\n    return 10 ** 13", 0),
        ("def f(x):\n    s = 'ab'\n    for i in range(20):\n        s = s + s\n    return len(s)", 0),
        ("def f(x):\n    return f(x)", 0),  # unbounded recursion: the call limit
        ("def f(x):\n    a = []\n    b = [a]\n    a.append(b)\n    return a", 0),  # a value that contains itself
        ("def f(x):\n    return 1 / 0", 0),
        ("def f(x):\n    return [1][5]", 0),
        ("def f(x):\n    return 'a' + 1", 0),
        ("def f(x):\n    return str([1, 2])", 0),
        ("def f(x):\n    return 'ab'.replace('a', 'a' * 900).replace('a', 'a' * 900)", 0),
        ("def f(x):\n    return ''.join(['x' * 900, 'y' * 900])", 0),
        ("def f(x):\n    break", 0),
    ],
)
def test_limits_stop_runaway_programs(source: str, arg: Any) -> None:
    program = load_program(source)
    with pytest.raises(CodeError):
        run_function(program, "f", [arg])


def test_source_and_depth_limits() -> None:
    with pytest.raises(CodeError, match="too long"):
        load_program("def f(x):\n    return x" + " + 1" * 1000)
    deep = "def f(x):\n    return " + "[" * 60 + "x" + "]" * 60
    with pytest.raises(CodeError):
        load_program(deep, Limits())  # nested too deeply (or refused by the parser itself)
    with pytest.raises(CodeError, match="time limit"):
        run_function(
            load_program("def f(x):\n    while True:\n        x += 1"),
            "f",
            [0],
            Limits(max_steps=10**9, max_seconds=0.05),
        )


def test_extract_code_takes_the_first_fence_or_the_text() -> None:
    text = "Sure!\n```python\ndef f(x):\n    return x\n```\nThen:\n```python\ndef g(): pass\n```"
    assert extract_code(text) == "def f(x):\n    return x\n"
    assert extract_code("```py\ndef f(x):\n    return 2") == "def f(x):\n    return 2"  # cut off by the token limit
    assert extract_code("def f(x):\n    return 3") == "def f(x):\n    return 3"


def test_entry_is_f_else_the_first_function() -> None:
    tests = [[[2], 4], [[3], 6]]
    assert run_tests("def double(x):\n    return 2 * x", tests, Limits()) == 2
    assert run_tests("def g(x):\n    return 0\n\ndef f(x):\n    return x + x", tests, Limits()) == 2
    assert run_tests('"""Doubles."""\ndef f(x):\n    return x * 2', tests, Limits()) == 2
    assert run_tests("def f(x):\n    return x * 2\nprint(f(2))", tests, Limits()) == 0  # top-level code refuses all


HOSTILE = [
    "__import__('os').system('touch {sentinel}')",
    "```python\nimport os\nos.system('touch {sentinel}')\ndef f(xs):\n    return 0\n```",
    "```python\ndef f(xs):\n    return __import__('os').system('touch {sentinel}')\n```",
    "```python\ndef f(xs):\n    return eval(\"__import__('os').system('touch {sentinel}')\")\n```",
    "```python\ndef f(xs):\n    return open('{sentinel}', 'w').write('x')\n```",
    "```python\ndef f(xs):\n    return [].__class__.__base__.__subclasses__()\n```",
    "```python\ndef f(xs):\n    while True:\n        xs.append(1)\n```",
    "```python\ndef f(xs):\n    return 'x' * 10 ** 12\n```",
    "```python\ndef f(xs):\n    return f(xs)\n```",
    "```python\ndef f(xs):\n    s = 'ab'\n    while True:\n        s = s + s\n```",
]
_WATCHED = ("exec", "os.system", "subprocess.Popen", "os.posix_spawn", "os.exec", "os.fork", "open", "socket.")
_events: list[str] = []
_recording = [False]


def _audit(event: str, _args: tuple[Any, ...]) -> None:
    if _recording[0] and event.startswith(_WATCHED):
        _events.append(event)


sys.addaudithook(_audit)


@pytest.fixture
def audited() -> Iterator[list[str]]:
    _events.clear()
    _recording[0] = True
    try:
        yield _events
    finally:
        _recording[0] = False


@pytest.mark.parametrize("template", HOSTILE)
def test_hostile_completion_scores_zero_and_executes_nothing(template: str, tmp_path: Path, audited: list[str]) -> None:
    sentinel = tmp_path / "pwned"
    skill = CodeSkill()
    example = Example("code", "Write f.", {"tests": [[[[1, 2]], 3], [[[0]], 0]]})
    score = skill.score(example, template.format(sentinel=sentinel))
    assert score == {"strict": 0.0, "partial": 0.0}
    assert not sentinel.exists()
    assert audited == []  # no exec of a code object, no process, no file opened, no socket


def test_the_audit_hook_would_see_an_execution(tmp_path: Path, audited: list[str]) -> None:
    """The hostile test can fail: running the same text as Python is seen (and creates the file)."""
    sentinel = tmp_path / "pwned"
    exec(f"open({str(sentinel)!r}, 'w').close()")  # what a verifier must never do with model output
    assert sentinel.exists()
    assert "exec" in audited and "open" in audited
