"""The tool-calling skill: a tool list in the system prompt, a request, the answer one JSON call.

The system prompt lists ``k`` tools (the right one among them, the others drawn from the catalogue), one per
line as ``- name(arg: hint, ...): description``, and asks for ``{"name": ..., "arguments": {...}}``; two
demonstration turns (a request and its call) come before the request, the last one for the asked tool itself
(with other arguments) half of the time. The verifier takes the first JSON object (or one-element list of them)
in the completion, so ``<tool_call>`` tags, a code fence or a short preamble are fine; ``"parameters"`` is read
as ``"arguments"`` and an arguments string holding JSON is decoded.

Credit (``partial``, the training reward):

- 0 when no JSON call with a string ``name`` is found;
- 0.2 for a well-formed call; + 0.3 when the name is right;
- + 0.5 x (arguments with the right value) / (expected arguments + unexpected extra arguments), only when the name
  is right. Values match after normalisation (case, punctuation, spacing), numbers numerically ("250" = 250).

``strict`` is 1 exactly when the name and every argument are right and there is no extra argument.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentmerge.api import dumps_json
from agentmerge_zoo.real.tasks import Example, Score, normalise, strict_partial

CITIES = [
    "Paris",
    "Berlin",
    "Madrid",
    "Rome",
    "Lisbon",
    "Vienna",
    "Prague",
    "Oslo",
    "Dublin",
    "Athens",
    "Cairo",
    "Tokyo",
    "Seoul",
    "Lima",
    "Quito",
    "Denver",
]
PEOPLE = [
    "anna",
    "ben",
    "carla",
    "dmitri",
    "elena",
    "farid",
    "grace",
    "hugo",
    "ines",
    "jonas",
    "kira",
    "liam",
    "maya",
    "nora",
    "omar",
    "petra",
]
CURRENCIES = ["USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "SEK"]
LANGUAGES = ["French", "German", "Spanish", "Italian", "Japanese", "Dutch", "Polish", "Greek"]
ARTISTS = ["Adele", "Queen", "Coldplay", "Shakira", "Beyonce", "Metallica", "Mozart", "Drake"]
SYMBOLS = ["AAPL", "MSFT", "TSLA", "AMZN", "NVDA", "IBM", "INTC", "ORCL"]
TOPICS = ["budget meeting", "holiday plans", "project update", "team lunch", "invoice", "weekly report"]
CHORES = ["call mom", "water the plants", "buy milk", "take the pills", "feed the cat", "send the report"]
PHRASES = ["good morning", "thank you", "where is the station", "see you tomorrow", "happy birthday"]
PLACES = ["Luigi's", "The Blue Door", "Sakura", "Casa Pepe", "The Old Mill", "Green Garden"]


def _time(rng: random.Random) -> str:
    return f"{rng.randint(5, 22):02d}:{rng.choice((0, 15, 30, 45)):02d}"


def _date(rng: random.Random) -> str:
    return f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _two(rng: random.Random, pool: list[str]) -> tuple[str, str]:
    a, b = rng.sample(pool, 2)
    return a, b


@dataclass(frozen=True)
class Tool:
    """A tool of the catalogue: its schema, how a request for it is phrased, how its arguments are drawn."""

    name: str
    description: str
    params: dict[str, str]  # argument name -> type hint shown to the model
    requests: tuple[str, ...]  # templates over the argument names
    draw: Callable[[random.Random], dict[str, Any]]

    def schema(self) -> str:
        """One line: ``- name(arg: hint, ...): description``."""
        args = ", ".join(f"{key}: {hint}" for key, hint in self.params.items())
        return f"- {self.name}({args}): {self.description}"


def _currency(rng: random.Random) -> dict[str, Any]:
    a, b = _two(rng, CURRENCIES)
    return {"amount": rng.choice((5, 20, 50, 75, 100, 250, 1200)), "from_currency": a, "to_currency": b}


def _flight(rng: random.Random) -> dict[str, Any]:
    a, b = _two(rng, CITIES)
    return {"origin": a, "destination": b, "date": _date(rng)}


def _distance(rng: random.Random) -> dict[str, Any]:
    a, b = _two(rng, CITIES)
    return {"origin": a, "destination": b, "unit": rng.choice(("km", "miles"))}


CATALOGUE: tuple[Tool, ...] = (
    Tool(
        "get_weather",
        "Current weather in a city",
        {"city": "string", "unit": "celsius or fahrenheit"},
        ("What's the weather in {city} in {unit}?", "Tell me the current weather for {city}, in {unit} please."),
        lambda r: {"city": r.choice(CITIES), "unit": r.choice(("celsius", "fahrenheit"))},
    ),
    Tool(
        "convert_currency",
        "Convert an amount of money",
        {"amount": "number", "from_currency": "currency code", "to_currency": "currency code"},
        (
            "How much is {amount} {from_currency} in {to_currency}?",
            "Convert {amount} {from_currency} to {to_currency}.",
        ),
        _currency,
    ),
    Tool(
        "set_alarm",
        "Set an alarm",
        {"time": "HH:MM", "label": "string"},
        ("Set an alarm for {time} called {label}.", "Wake me up at {time} and label the alarm {label}."),
        lambda r: {"time": _time(r), "label": r.choice(("gym", "work", "pills", "school", "train", "meeting"))},
    ),
    Tool(
        "send_email",
        "Send an email",
        {"to": "email address", "subject": "string"},
        ("Email {to} with the subject {subject}.", "Send an email to {to} about {subject}."),
        lambda r: {"to": f"{r.choice(PEOPLE)}@example.com", "subject": r.choice(TOPICS)},
    ),
    Tool(
        "search_flights",
        "Find flights between two cities on a date",
        {"origin": "city", "destination": "city", "date": "YYYY-MM-DD"},
        ("Find flights from {origin} to {destination} on {date}.", "Any flights {origin} to {destination} on {date}?"),
        _flight,
    ),
    Tool(
        "get_stock_price",
        "Latest price of a stock",
        {"symbol": "ticker symbol"},
        ("What is the stock price of {symbol}?", "How much does one {symbol} share cost right now?"),
        lambda r: {"symbol": r.choice(SYMBOLS)},
    ),
    Tool(
        "translate",
        "Translate a text",
        {"text": "string", "language": "target language"},
        ('Translate "{text}" into {language}.', 'How do you say "{text}" in {language}?'),
        lambda r: {"text": r.choice(PHRASES), "language": r.choice(LANGUAGES)},
    ),
    Tool(
        "play_music",
        "Play music by an artist",
        {"artist": "string", "volume": "integer 1-10"},
        ("Play {artist} at volume {volume}.", "Put on some {artist}, volume {volume}."),
        lambda r: {"artist": r.choice(ARTISTS), "volume": r.randint(1, 10)},
    ),
    Tool(
        "create_reminder",
        "Remind the user of something later",
        {"text": "string", "minutes": "integer"},
        ("Remind me to {text} in {minutes} minutes.", "In {minutes} minutes, remind me to {text}."),
        lambda r: {"text": r.choice(CHORES), "minutes": r.choice((5, 10, 15, 20, 30, 45, 60, 90))},
    ),
    Tool(
        "book_table",
        "Book a restaurant table",
        {"restaurant": "string", "people": "integer", "time": "HH:MM"},
        (
            "Book a table at {restaurant} for {people} people at {time}.",
            "Reserve {restaurant}, {people} people, {time}.",
        ),
        lambda r: {"restaurant": r.choice(PLACES), "people": r.randint(2, 8), "time": _time(r)},
    ),
    Tool(
        "get_distance",
        "Distance between two cities",
        {"origin": "city", "destination": "city", "unit": "km or miles"},
        ("How far is it from {origin} to {destination} in {unit}?", "Distance {origin} to {destination}, in {unit}?"),
        _distance,
    ),
)
TOOLS = {tool.name: tool for tool in CATALOGUE}
INSTRUCTION = (
    "You are an assistant that calls tools. You can use these tools:\n{tools}\n"
    'To use a tool, reply with only a JSON object: {{"name": <tool name>, "arguments": {{<argument>: <value>}}}}.'
)


@dataclass(frozen=True)
class ToolSkill:
    """Tool calling with ``shown`` tools in the system prompt (difficulty: more tools, more confusion)."""

    name: str = "tool"
    max_new_tokens: int = 48
    shown: tuple[int, int] = (3, 4)
    shots: int = 2  # demonstration turns, each a request for a listed tool and its call
    same_tool: float = 0.5  # probability that the last demonstration calls the asked tool (other arguments)

    def sample(self, rng: random.Random) -> Example:
        tool = rng.choice(CATALOGUE)
        args = tool.draw(rng)
        others = rng.sample([t for t in CATALOGUE if t is not tool], rng.randint(*self.shown) - 1)
        listed = [tool, *others]
        rng.shuffle(listed)
        system = INSTRUCTION.format(tools="\n".join(t.schema() for t in listed))
        user = rng.choice(tool.requests).format(**args)
        shown = others[: self.shots]
        if shown and rng.random() < self.same_tool:
            shown[-1] = tool
        shots = tuple(_demonstration(t, rng) for t in shown)
        return Example(self.name, user, {"name": tool.name, "arguments": args}, system, shots)

    def score(self, example: Example, completion: str) -> Score:
        return score_call(parse_call(completion), example.data["name"], example.data["arguments"])


def _demonstration(tool: Tool, rng: random.Random) -> tuple[str, str]:
    args = tool.draw(rng)
    return rng.choice(tool.requests).format(**args), dumps_json({"name": tool.name, "arguments": args})


def parse_call(text: str) -> dict[str, Any] | None:
    """The first JSON tool call in ``text`` as ``{"name": str, "arguments": dict}``, else None."""
    decoder = json.JSONDecoder()
    for start, ch in enumerate(text[:2000]):
        if ch not in "{[":
            continue
        try:
            value, _ = decoder.raw_decode(text[start:2000])
        except (ValueError, RecursionError):  # RecursionError: brackets nested deeper than Python recurses
            continue
        call = _as_call(value)
        if call is not None:
            return call
    return None


def _as_call(value: Any) -> dict[str, Any] | None:
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    args = value.get("arguments", value.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            return None
    return {"name": value["name"], "arguments": args} if isinstance(args, dict) else None


def same_value(got: Any, want: Any) -> bool:
    """Numbers numerically (a numeric string counts), anything else by its normalised text."""
    if isinstance(want, int | float) and not isinstance(want, bool):
        try:
            return float(got) == float(want)
        except (TypeError, ValueError):
            return False
    return isinstance(got, str | int | float) and normalise(str(got)) == normalise(str(want))


def score_call(call: dict[str, Any] | None, name: str, arguments: dict[str, Any]) -> Score:
    """The credit rules of the module docstring."""
    if call is None:
        return strict_partial(False, 0.0)
    if call["name"] != name:
        return strict_partial(False, 0.2)
    got: dict[str, Any] = call["arguments"]
    right = sum(key in got and same_value(got[key], value) for key, value in arguments.items())
    extra = sum(key not in arguments for key in got)
    share = right / (len(arguments) + extra)
    return strict_partial(right == len(arguments) and extra == 0, 0.5 + 0.5 * share)
