"""The code skill: write a short Python function for a one-line spec, checked on hidden inputs.

A spec is drawn from a family (arithmetic on an integer, a list of integers, a string) with random constants; its
reference implementation (trusted code of this module) gives the expected output of each of ``n_tests`` hidden
inputs drawn with the spec; the prompt shows one more input and its output as an example. The completion's first
fenced code block (else its whole text) is loaded by ``pysafe.load_program`` and its function ``f`` (else its
first function) run on each hidden input by the restricted interpreter: **model output is never executed as
Python**.

``partial`` = the share of hidden inputs answered right (the training reward), ``strict`` = all of them. A
program that leaves the subset or exceeds a limit answers none.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentmerge_zoo.real.pysafe import CodeError, Limits, extract_code, load_program, run_function
from agentmerge_zoo.real.tasks import Example, Score, strict_partial

SYSTEM = "You are a Python programmer. Reply with only the function, in a ```python code block."
WORDS = [
    "cat",
    "sun",
    "tree",
    "blue",
    "river",
    "stone",
    "apple",
    "light",
    "moon",
    "fish",
    "star",
    "road",
    "bird",
    "cake",
    "door",
    "rain",
]

Family = Callable[[random.Random], tuple[str, str, Callable[..., Any], Callable[[random.Random], tuple[Any, ...]]]]


def _int(rng: random.Random) -> tuple[int]:
    return (rng.randint(-20, 30),)


def _ints(rng: random.Random) -> tuple[list[int]]:
    return ([rng.randint(-9, 20) for _ in range(rng.randint(1, 7))],)


def _word(rng: random.Random) -> tuple[str]:
    return ("".join(rng.choice("abcdeilmnorst") for _ in range(rng.randint(1, 8))),)


def _sentence(rng: random.Random) -> tuple[str]:
    return (" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))),)


def _pair(rng: random.Random) -> tuple[int, int]:
    return rng.randint(-20, 30), rng.randint(-20, 30)


def _linear(rng: random.Random) -> tuple[str, str, Callable[..., Any], Callable[..., Any]]:
    a, b = rng.randint(2, 9), rng.randint(1, 20)
    spec = f"returns x multiplied by {a}, plus {b}, or 0 when x is negative"
    return "f(x)", spec, lambda x: a * x + b if x >= 0 else 0, _int


def _square(rng: random.Random) -> tuple[str, str, Callable[..., Any], Callable[..., Any]]:
    a = rng.randint(1, 30)
    spec = f"returns the square of x minus {a} when x is even, and x plus {a} when x is odd"
    return "f(x)", spec, lambda x: x * x - a if x % 2 == 0 else x + a, _int


def _sum_above(rng: random.Random) -> tuple[str, str, Callable[..., Any], Callable[..., Any]]:
    k = rng.randint(0, 9)
    spec = f"returns the sum of the numbers in the list xs that are greater than {k}"
    return "f(xs)", spec, lambda xs: sum(x for x in xs if x > k), _ints


def _count_multiples(rng: random.Random) -> tuple[str, str, Callable[..., Any], Callable[..., Any]]:
    k = rng.randint(2, 5)
    spec = f"returns how many numbers in the list xs are divisible by {k}"
    return "f(xs)", spec, lambda xs: sum(1 for x in xs if x % k == 0), _ints


def _extreme(rng: random.Random) -> tuple[str, str, Callable[..., Any], Callable[..., Any]]:
    if rng.random() < 0.5:
        return "f(xs)", "returns the largest number in the list xs", max, _ints
    return "f(xs)", "returns the smallest number in the list xs", min, _ints


def _scaled(rng: random.Random) -> tuple[str, str, Callable[..., Any], Callable[..., Any]]:
    k = rng.randint(2, 9)
    spec = f"returns a new list with every number of the list xs multiplied by {k}"
    return "f(xs)", spec, lambda xs: [k * x for x in xs], _ints


def _filtered(rng: random.Random) -> tuple[str, str, Callable[..., Any], Callable[..., Any]]:
    k = rng.randint(0, 9)
    spec = f"returns the list of the numbers in the list xs that are less than {k}, in order"
    return "f(xs)", spec, lambda xs: [x for x in xs if x < k], _ints


def _reversed(rng: random.Random) -> tuple[str, str, Callable[..., Any], Callable[..., Any]]:
    if rng.random() < 0.5:
        return "f(s)", "returns the string s reversed", lambda s: s[::-1], _word
    return "f(s)", "returns the string s in capital letters", lambda s: s.upper(), _word


def _count_letter(rng: random.Random) -> tuple[str, str, Callable[..., Any], Callable[..., Any]]:
    c = rng.choice("aeimnorst")
    return "f(s)", f'returns the number of times the letter "{c}" appears in the string s', lambda s: s.count(c), _word


def _repeat(rng: random.Random) -> tuple[str, str, Callable[..., Any], Callable[..., Any]]:
    k = rng.randint(2, 5)
    return "f(s)", f"returns the string s repeated {k} times", lambda s: s * k, _word


def _words(rng: random.Random) -> tuple[str, str, Callable[..., Any], Callable[..., Any]]:
    return "f(s)", "returns the number of words in the string s", lambda s: len(s.split()), _sentence


def _triangle(rng: random.Random) -> tuple[str, str, Callable[..., Any], Callable[..., Any]]:
    k = rng.randint(1, 3)
    spec = f"returns the sum of the integers from {k} to n inclusive (0 when n < {k})"
    return "f(n)", spec, lambda n: sum(range(k, n + 1)), lambda r: (r.randint(0, 40),)


def _divisible(rng: random.Random) -> tuple[str, str, Callable[..., Any], Callable[..., Any]]:
    a, b = rng.sample(range(2, 8), 2)
    spec = f"returns True if n is divisible by {a} but not by {b}, else False"
    return "f(n)", spec, lambda n: n % a == 0 and n % b != 0, lambda r: (r.randint(-30, 60),)


def _larger(rng: random.Random) -> tuple[str, str, Callable[..., Any], Callable[..., Any]]:
    k = rng.randint(1, 9)
    spec = f"returns the larger of a and b, minus {k}"
    return "f(a, b)", spec, lambda a, b: max(a, b) - k, _pair


def _odd_squares(rng: random.Random) -> tuple[str, str, Callable[..., Any], Callable[..., Any]]:
    parity = rng.choice(("odd", "even"))
    spec = f"returns the sum of the squares of the {parity} numbers in the list xs"
    rem = 1 if parity == "odd" else 0
    return "f(xs)", spec, lambda xs: sum(x * x for x in xs if x % 2 == rem), _ints


def _rises(rng: random.Random) -> tuple[str, str, Callable[..., Any], Callable[..., Any]]:
    spec = "returns how many numbers in the list xs are larger than the number just before them"
    return "f(xs)", spec, lambda xs: sum(1 for a, b in itertools.pairwise(xs) if b > a), _ints


def _first_index(rng: random.Random) -> tuple[str, str, Callable[..., Any], Callable[..., Any]]:
    k = rng.randint(0, 9)
    spec = f"returns the index of the first number in the list xs that is greater than {k}, or -1 if there is none"
    return "f(xs)", spec, lambda xs: next((i for i, x in enumerate(xs) if x > k), -1), _ints


def _running(rng: random.Random) -> tuple[str, str, Callable[..., Any], Callable[..., Any]]:
    spec = "returns the list of running totals of the list xs (the i-th item is the sum of the first i+1 numbers)"
    return "f(xs)", spec, lambda xs: [sum(xs[: i + 1]) for i in range(len(xs))], _ints


def _digit_sum(rng: random.Random) -> tuple[str, str, Callable[..., Any], Callable[..., Any]]:
    k = rng.randint(1, 9)
    spec = f"returns the sum of the decimal digits of the non-negative integer n, plus {k}"
    return "f(n)", spec, lambda n: sum(map(int, str(n))) + k, lambda r: (r.randint(0, 99999),)


def _long_words(rng: random.Random) -> tuple[str, str, Callable[..., Any], Callable[..., Any]]:
    k = rng.randint(2, 4)
    spec = f"returns the number of words in the string s that have more than {k} letters"
    return "f(s)", spec, lambda s: sum(1 for w in s.split() if len(w) > k), _sentence


def _vowels(rng: random.Random) -> tuple[str, str, Callable[..., Any], Callable[..., Any]]:
    c = rng.choice("*#-_")
    spec = f'returns the string s with every vowel (a, e, i, o, u) replaced by "{c}"'
    return "f(s)", spec, lambda s: "".join(c if ch in "aeiou" else ch for ch in s), _word


def _clamp(rng: random.Random) -> tuple[str, str, Callable[..., Any], Callable[..., Any]]:
    lo, hi = rng.randint(-5, 2), rng.randint(5, 12)
    spec = f"returns the list xs with every number below {lo} replaced by {lo} and every number above {hi} by {hi}"
    return "f(xs)", spec, lambda xs: [min(max(x, lo), hi) for x in xs], _ints


def _second(rng: random.Random) -> tuple[str, str, Callable[..., Any], Callable[..., Any]]:
    spec = "returns the difference between the largest and the smallest number in the list xs"
    return "f(xs)", spec, lambda xs: max(xs) - min(xs), _ints


FAMILIES: tuple[Family, ...] = (
    _linear,
    _square,
    _sum_above,
    _count_multiples,
    _filtered,
    _count_letter,
    _triangle,
    _divisible,
    _odd_squares,
    _rises,
    _first_index,
    _running,
    _digit_sum,
    _long_words,
    _vowels,
    _clamp,
)


@dataclass(frozen=True)
class CodeSkill:
    """Write ``f`` for a spec; ``n_tests`` hidden inputs per spec."""

    name: str = "code"
    max_new_tokens: int = 64
    n_tests: int = 5
    limits: Limits = field(default_factory=Limits)

    def sample(self, rng: random.Random) -> Example:
        signature, spec, reference, draw = rng.choice(FAMILIES)(rng)
        tests = []
        for _ in range(self.n_tests):
            args = draw(rng)
            tests.append([list(args), reference(*args)])
        shown = draw(rng)
        call = f"f({', '.join(map(repr, shown))})"
        user = f"Write a Python function {signature} that {spec}. Example: {call} returns {reference(*shown)!r}."
        return Example(self.name, user, {"tests": tests}, SYSTEM)

    def score(self, example: Example, completion: str) -> Score:
        passed = run_tests(extract_code(completion), example.data["tests"], self.limits)
        total = len(example.data["tests"])
        return strict_partial(passed == total, passed / total)


def run_tests(source: str, tests: list[list[Any]], limits: Limits) -> int:
    """How many ``[args, expected]`` pairs the program's ``f`` (else first function) answers right; 0 if invalid."""
    try:
        program = load_program(source, limits)
    except CodeError:
        return 0
    entry = program.entry("f")
    passed = 0
    for args, expected in tests:
        try:
            got = run_function(program, entry, args, limits)
        except CodeError:
            continue
        passed += _equal(got, expected)
    return passed


def _equal(got: Any, expected: Any) -> bool:
    """Equal as the spec means it: a tuple result equals a list, a bool is not an int."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(got) is type(expected) and got == expected
    if isinstance(got, tuple):
        got = list(got)
    return bool(type(got) is type(expected) and got == expected) or (
        isinstance(expected, int) and isinstance(got, float) and got == expected
    )
