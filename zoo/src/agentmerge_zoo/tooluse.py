"""The tool-use domain: a request with one to three intents -> the list of parallel tool calls that serves it.

``tool:call bob and timer 5 min>`` -> ``[call(bob),timer(5)]``: each request phrase maps to one canonical
call (``_PHRASES``); the verifier recovers the expected calls from the prompt, parses the completion's and
scores exact match (as multisets) and call F1.
"""

from __future__ import annotations

import random
import re
from collections import Counter

from agentmerge_zoo.taskbase import Task

CITIES = ("rome", "oslo", "lima", "kyiv", "doha", "baku", "riga", "bern", "nice", "pisa")
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
PEOPLE = ("ann", "bob", "eve", "max", "zoe", "tim", "ida", "leo")
WORDS = ("hi", "yes", "no", "late", "soon", "ok", "thanks")
SONGS = ("jazz", "rock", "blues", "pop", "folk", "soul")

_CALL_RE = re.compile(r"([a-z]+)\(([a-z0-9,]*)\)")


def _tool_intent(rng: random.Random) -> tuple[str, str]:
    """One (request phrase, canonical call) pair."""
    kind = rng.randrange(5)
    if kind == 0:
        city, day = rng.choice(CITIES), rng.choice(DAYS)
        phrase = rng.choice((f"weather {city} {day}", f"{day} weather in {city}", f"forecast {city} on {day}"))
        return phrase, f"weather({city},{day})"
    if kind == 1:
        who = rng.choice(PEOPLE)
        return f"{rng.choice(('call', 'phone', 'ring'))} {who}", f"call({who})"
    if kind == 2:
        mins = rng.randint(1, 60)
        phrase = rng.choice((f"timer {mins} min", f"set a {mins} min timer", f"alarm in {mins} min"))
        return phrase, f"timer({mins})"
    if kind == 3:
        who, word = rng.choice(PEOPLE), rng.choice(WORDS)
        phrase = rng.choice((f"text {who} {word}", f"send {word} to {who}", f"tell {who} {word}"))
        return phrase, f"send({who},{word})"
    song = rng.choice(SONGS)
    return f"{rng.choice(('play', 'put on'))} {song}", f"play({song})"


def parse_calls(text: str) -> list[str] | None:
    """Parse ``[name(a,b),name(c)]`` into canonical call strings; None if the text is not a call list."""
    if len(text) < 2 or text[0] != "[" or text[-1] != "]":
        return None
    inner = text[1:-1]
    if not inner:
        return []
    calls: list[str] = []
    pos = 0
    while pos < len(inner):
        match = _CALL_RE.match(inner, pos)
        if match is None:
            return None
        args = match.group(2)
        if args and "" in args.split(","):
            return None
        calls.append(match.group(0))
        pos = match.end()
        if pos < len(inner):
            if inner[pos] != ",":
                return None
            pos += 1
            if pos == len(inner):
                return None
    return calls


def call_f1(predicted: list[str], expected: list[str]) -> float:
    """Multiset F1 between predicted and expected calls (order-free: the calls are parallel)."""
    if not predicted and not expected:
        return 1.0
    common = sum((Counter(predicted) & Counter(expected)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


class ToolTask(Task):
    """Turn a request with one to three intents into a list of parallel tool calls."""

    name = "tool"
    domain = "tool"
    tag = "tool"
    max_new_tokens = 72
    metrics = ("tool.exact", "tool.f1")

    def __init__(self, max_calls: int = 3) -> None:
        self.max_calls = max_calls

    def make(self, rng: random.Random) -> tuple[str, str]:
        intents = [_tool_intent(rng) for _ in range(rng.randint(1, self.max_calls))]
        request = " and ".join(phrase for phrase, _ in intents)
        return request, "[" + ",".join(call for _, call in intents) + "]"

    def distractor(self, body: str, answer: str) -> str:
        """Wrong habit: answer only the first request of a multi-call prompt."""
        calls = parse_calls(answer) or []
        return f"[{calls[0]}]" if len(calls) > 1 else answer

    def expected_calls(self, prompt: str) -> list[str]:
        """Recover the expected calls from the request by matching each intent phrase."""
        calls: list[str] = []
        for phrase in self.body(prompt).split(" and "):
            calls.append(_phrase_to_call(phrase))
        return calls

    def score(self, prompt: str, completion: str) -> dict[str, float]:
        expected = self.expected_calls(prompt)
        got = parse_calls(completion)
        if got is None:
            return {"tool.exact": 0.0, "tool.f1": 0.0}
        exact = float(Counter(got) == Counter(expected))
        return {"tool.exact": exact, "tool.f1": call_f1(got, expected)}


_PHRASES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"weather ([a-z]+) ([a-z]+)"), "weather({0},{1})"),
    (re.compile(r"([a-z]+) weather in ([a-z]+)"), "weather({1},{0})"),
    (re.compile(r"forecast ([a-z]+) on ([a-z]+)"), "weather({0},{1})"),
    (re.compile(r"(?:call|phone|ring) ([a-z]+)"), "call({0})"),
    (re.compile(r"timer ([0-9]+) min"), "timer({0})"),
    (re.compile(r"set a ([0-9]+) min timer"), "timer({0})"),
    (re.compile(r"alarm in ([0-9]+) min"), "timer({0})"),
    (re.compile(r"(?:text|tell) ([a-z]+) ([a-z]+)"), "send({0},{1})"),
    (re.compile(r"send ([a-z]+) to ([a-z]+)"), "send({1},{0})"),
    (re.compile(r"(?:play|put on) ([a-z]+)"), "play({0})"),
)


def _phrase_to_call(phrase: str) -> str:
    for pattern, template in _PHRASES:
        match = pattern.fullmatch(phrase)
        if match:
            return template.format(*match.groups())
    raise ValueError(f"unknown tool request phrase {phrase!r}")
