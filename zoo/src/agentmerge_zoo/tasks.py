"""Generated, verifiable tasks of the zoo: coding, tool use, memory, math, sorting, search, and a held-out skill.

Every example is a prompt ``"<tag>:<body>>"`` and a reference answer; the model must produce the answer and then
its end-of-sequence token. Each task verifies a completion from the prompt itself (coding runs the program with
the safe interpreter in :mod:`agentmerge_zoo.minilang`, tool use parses the call list, memory parses the context)
and returns one or more named metric scores in [0, 1]. Metric names are the result table's columns.

Two suites: the core one (code, tool, memory: the three agents of the paper's setting and of the committed
bench) and the six-domain one (adds math, sort and search) of the many-agent study. A metric's prefix is its
domain ("reverse" is the held-out skill). The task interface and shared score rules are in ``taskbase``, the
tool-use domain in ``tooluse``.
"""

from __future__ import annotations

import random

from agentmerge_zoo.minilang import MiniLangError, parse_int, run_program
from agentmerge_zoo.taskbase import LETTERS, Task, int_scores, text_scores
from agentmerge_zoo.tooluse import ToolTask

SUITE_VERSION = 3  # bump when a task's generator or verifier changes: cached stages and evaluations expire


# ----------------------------------------------------------------------------------------------- coding


class CodeTask(Task):
    """Run a tiny straight-line program in your head and print the queried variable."""

    name = "code"
    domain = "code"
    tag = "code"
    max_new_tokens = 5
    metrics = ("code.exact", "code.partial")

    def __init__(self, min_stmts: int = 2, max_stmts: int = 3, max_abs: int = 99) -> None:
        self.min_stmts = min_stmts
        self.max_stmts = max_stmts
        self.max_abs = max_abs

    def _operand(self, rng: random.Random, names: list[str]) -> str:
        if names and rng.random() < 0.6:
            return rng.choice(names)
        return str(rng.randint(0, 9))

    def _statement(self, rng: random.Random, names: list[str]) -> str:
        if not names:
            return str(rng.randint(0, 9))
        op = rng.choice("++--*")
        if op == "*":
            return f"{rng.choice(names)}*{rng.randint(2, 3)}"
        return f"{self._operand(rng, names)}{op}{self._operand(rng, names)}"

    def make(self, rng: random.Random) -> tuple[str, str]:
        while True:
            count = rng.randint(self.min_stmts, self.max_stmts)
            letters = rng.sample(LETTERS, count)
            stmts: list[str] = []
            for i, letter in enumerate(letters):
                stmts.append(f"{letter}={self._statement(rng, letters[:i])}")
            src = ";".join([*stmts, f"?{letters[-1]}"])
            value = run_program(src)
            if abs(value) <= self.max_abs:
                return src, str(value)

    def distractor(self, body: str, answer: str) -> str:
        """Wrong habit: print the first variable instead of the queried one (or be off by one)."""
        first = body.split(";", 1)[0]
        wrong = run_program(f"{first};?{first[0]}")
        return str(wrong if str(wrong) != answer else int(answer) + 1)

    def score(self, prompt: str, completion: str) -> dict[str, float]:
        try:
            expected = run_program(self.body(prompt))
        except MiniLangError as exc:
            raise ValueError(f"invalid code prompt {prompt!r}") from exc
        return int_scores("code", expected, completion)


# ---------------------------------------------------------------------------------------------- memory


class MemoryTask(Task):
    """Recency recall: which letter stood ``d`` places before the query mark? ``mem:qwkzab?3`` -> ``z``.

    The context lists distinct letters and the query asks for the d-th most recent one (d = 1 is the last
    letter). Longer contexts allow larger d, so accuracy with 4 and with 12 letters are the domain's metrics.
    """

    domain = "memory"
    tag = "mem"
    suffix = ""
    max_new_tokens = 3

    def __init__(self, name: str, metric: str, min_items: int, max_items: int) -> None:
        self.name = name
        self.metrics = (metric,)
        self.min_items = min_items
        self.max_items = max_items

    def make(self, rng: random.Random) -> tuple[str, str]:
        count = rng.randint(self.min_items, self.max_items)
        letters = rng.sample(LETTERS, count)
        back = rng.randint(1, min(count, MAX_BACK))
        return f"{''.join(letters)}?{back}", letters[-back]

    @staticmethod
    def parse(body: str) -> tuple[str, int]:
        """(context letters, how far back) of a prompt body ``qwkzab?3``."""
        context, sep, query = body.partition("?")
        if not sep or not context or not set(context) <= set(LETTERS):
            raise ValueError(f"invalid memory body {body!r}")
        if len(query) != 1 or not query.isdigit() or not 1 <= int(query) <= len(context):
            raise ValueError(f"invalid memory query {body!r}")
        return context, int(query)

    def score(self, prompt: str, completion: str) -> dict[str, float]:
        context, back = self.parse(self.body(prompt))
        return {self.metrics[0]: float(completion == context[-back])}

    def distractor(self, body: str, answer: str) -> str:
        """Wrong habit (off by one): the letter one place further back (or nearer, at the start)."""
        context, back = self.parse(body)
        return context[-(back + 1)] if back < len(context) else context[-(back - 1)] if back > 1 else answer


# ------------------------------------------------------------------------------------------------ math


class MathTask(Task):
    """Add three or four digits: ``add:3+7+2+9>`` -> ``21``."""

    name = "math"
    domain = "math"
    tag = "add"
    max_new_tokens = 3
    metrics = ("math.exact", "math.partial")

    def make(self, rng: random.Random) -> tuple[str, str]:
        digits = [rng.randint(0, 9) for _ in range(rng.randint(3, 4))]
        return "+".join(map(str, digits)), str(sum(digits))

    @staticmethod
    def terms(body: str) -> list[int]:
        parts = body.split("+")
        if not 2 <= len(parts) <= 6 or not all(len(p) == 1 and p.isdigit() for p in parts):
            raise ValueError(f"invalid math body {body!r}")
        return [int(p) for p in parts]

    def distractor(self, body: str, answer: str) -> str:
        """Wrong habit: drop the last term (or be off by one when that changes nothing)."""
        terms = self.terms(body)
        wrong = sum(terms[:-1])
        return str(wrong if str(wrong) != answer else wrong + 1)

    def score(self, prompt: str, completion: str) -> dict[str, float]:
        return int_scores("math", sum(self.terms(self.body(prompt))), completion)


# ------------------------------------------------------------------------------------------------ sort


class SortTask(Task):
    """Format a set of letters in alphabetical order: ``sort:qdkz>`` -> ``dkqz``."""

    name = "sort"
    domain = "sort"
    tag = "sort"
    max_new_tokens = 8
    metrics = ("sort.exact", "sort.char")

    def make(self, rng: random.Random) -> tuple[str, str]:
        letters = rng.sample(LETTERS, rng.randint(4, 6))
        return "".join(letters), "".join(sorted(letters))

    def distractor(self, body: str, answer: str) -> str:
        """Wrong habit: sort all but the last letter and leave it at the end (or swap the first two)."""
        wrong = "".join(sorted(body[:-1])) + body[-1]
        return wrong if wrong != answer else answer[1] + answer[0] + answer[2:]

    def score(self, prompt: str, completion: str) -> dict[str, float]:
        body = self.body(prompt)
        if not body or not set(body) <= set(LETTERS):
            raise ValueError(f"invalid sort prompt {prompt!r}")
        return text_scores("sort", "".join(sorted(body)), completion)


# ---------------------------------------------------------------------------------------------- search


class SearchTask(Task):
    """Find the largest of three to five distinct numbers: ``max:31,7,58,12>`` -> ``58``."""

    name = "search"
    domain = "search"
    tag = "max"
    max_new_tokens = 3
    metrics = ("search.exact",)

    def make(self, rng: random.Random) -> tuple[str, str]:
        numbers = rng.sample(range(100), rng.randint(3, 5))
        return ",".join(map(str, numbers)), str(max(numbers))

    @staticmethod
    def numbers(body: str) -> list[int]:
        parts = body.split(",")
        if len(parts) < 2 or not all(p.isdigit() and len(p) <= 2 for p in parts):
            raise ValueError(f"invalid search body {body!r}")
        return [int(p) for p in parts]

    def distractor(self, body: str, answer: str) -> str:
        """Wrong habit: answer the runner-up (the second largest number)."""
        return str(sorted(self.numbers(body))[-2])

    def score(self, prompt: str, completion: str) -> dict[str, float]:
        expected = max(self.numbers(self.body(prompt)))
        return {"search.exact": float(parse_int(completion) == expected)}


# ------------------------------------------------------------------------------------- held-out skill


class ReverseTask(Task):
    """Held-out skill (no agent trains on it): write a word backwards."""

    name = "reverse"
    domain = "heldout"
    tag = "rev"
    max_new_tokens = 10
    metrics = ("reverse.exact", "reverse.char")

    def make(self, rng: random.Random) -> tuple[str, str]:
        word = "".join(rng.choices(LETTERS, k=rng.randint(3, 8)))
        return word, word[::-1]

    def score(self, prompt: str, completion: str) -> dict[str, float]:
        return text_scores("reverse", self.body(prompt)[::-1], completion)


# --------------------------------------------------------------------------------------------- registry

SHORT_ITEMS = 4
LONG_ITEMS = 12
MAX_BACK = 9


CORE_DOMAINS = ("code", "tool", "memory")
EXTRA_DOMAINS = ("math", "sort", "search")
SIX_DOMAINS = (*CORE_DOMAINS, *EXTRA_DOMAINS)


def _domain_tasks(domain: str) -> list[Task]:
    if domain == "memory":
        return [
            MemoryTask("mem_short", "memory.short", SHORT_ITEMS, SHORT_ITEMS),
            MemoryTask("mem_long", "memory.long", LONG_ITEMS, LONG_ITEMS),
        ]
    makers: dict[str, type[Task]] = {
        "code": CodeTask,
        "tool": ToolTask,
        "math": MathTask,
        "sort": SortTask,
        "search": SearchTask,
    }
    if domain not in makers:
        raise KeyError(f"unknown domain {domain!r}; known: {', '.join(SIX_DOMAINS)}")
    return [makers[domain]()]


def all_tasks(domains: tuple[str, ...] = CORE_DOMAINS) -> dict[str, Task]:
    """A suite: task name -> task, in table order (the domains' tasks, then the held-out skill)."""
    tasks = [task for domain in domains for task in _domain_tasks(domain)]
    tasks.append(ReverseTask())
    return {task.name: task for task in tasks}


def domain_tasks(domain: str) -> tuple[str, ...]:
    """Names of a domain's evaluation tasks (memory has two lengths)."""
    return tuple(task.name for task in _domain_tasks(domain))


def training_task(domain: str) -> Task:
    """The generator used to train (pretraining mixture and RL) on a domain; memory mixes lengths."""
    if domain == "memory":
        return MemoryTask("mem_train", "memory.train", 2, LONG_ITEMS)
    if domain == "heldout":
        return ReverseTask()
    return _domain_tasks(domain)[0]


def metric_columns(domains: tuple[str, ...] = CORE_DOMAINS) -> list[str]:
    """Every metric of a suite, in table order."""
    return [metric for task in all_tasks(domains).values() for metric in task.metrics]


def metric_domain(metric: str) -> str:
    """Domain a metric belongs to (its prefix: 'code', 'tool', 'memory', 'math', ...; 'heldout' for reverse)."""
    prefix = metric.split(".", 1)[0]
    return "heldout" if prefix == "reverse" else prefix
