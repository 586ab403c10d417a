"""Training questions in BFCL's format, generated: function docs as JSON schema, answers as accepted values.

The BFCL tool agent never sees BFCL's non-live items (its test). It trains on questions of this generator and on
BFCL's live categories. A generated item has BFCL's three parts:

- ``function``: the offered functions, each ``{"name", "description", "parameters": {"type": "dict",
  "properties": {...}, "required": [...]}}`` with BFCL's type words (integer, float, string, boolean, array);
- ``question``: one user turn;
- ``ground_truth``: one ``{function: {argument: [accepted values]}}`` per expected call, where an optional
  argument the question does not mention accepts ``""`` (omitted) or its default.

Kinds, as BFCL's non-live categories: ``simple`` (one function offered, one call), ``multiple`` (two to four
offered, one call), ``parallel`` (one offered, two or three calls of it), ``parallel_multiple`` (two to four
offered, two or three calls of two of them). A call is a clause (``convert 5 km to miles``); a question joins its
calls' clauses. Every random choice comes from the caller's ``random.Random``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

KINDS = ("simple", "multiple", "parallel", "parallel_multiple")

Value = tuple[Any, str]  # (the argument's value, how the question says it)
Draw = Callable[[random.Random], Value]


def ints(lo: int, hi: int) -> Draw:
    return lambda rng: (v := rng.randint(lo, hi), str(v))


def floats(lo: float, hi: float, digits: int = 1) -> Draw:
    return lambda rng: (v := round(rng.uniform(lo, hi), digits), str(v))


def words(options: Sequence[str]) -> Draw:
    return lambda rng: (v := rng.choice(options), v)


def phrased(options: Sequence[Value]) -> Draw:
    return lambda rng: rng.choice(options)


def lists(options: Sequence[str], lo: int = 2, hi: int = 3) -> Draw:
    def draw(rng: random.Random) -> Value:
        picked = rng.sample(list(options), rng.randint(lo, hi))
        return picked, ", ".join(picked[:-1]) + " and " + picked[-1]

    return draw


@dataclass(frozen=True)
class Param:
    name: str
    type: str  # BFCL's words: integer, float, string, boolean, array
    description: str
    draw: Draw
    required: bool = True
    default: Any = None
    items: str | None = None  # an array's item type

    def schema(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"type": self.type, "description": self.description}
        if self.items:
            doc["items"] = {"type": self.items}
        if self.default is not None:
            doc["default"] = self.default
        return doc


@dataclass(frozen=True)
class Function:
    name: str
    description: str
    params: tuple[Param, ...]
    clauses: tuple[str, ...]  # imperative fragments with {param} slots; a slot present = the argument is asked

    def doc(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "parameters": {
                "type": "dict",
                "properties": {p.name: p.schema() for p in self.params},
                "required": [p.name for p in self.params if p.required],
            },
        }


@dataclass(frozen=True)
class Call:
    """One expected call: its clause of the question and the accepted values of each argument."""

    clause: str
    answer: dict[str, dict[str, list[Any]]] = field(default_factory=dict)


def draw_call(fn: Function, rng: random.Random) -> Call:
    """A clause of ``fn`` with fresh values, and the answer BFCL would hold for it."""
    clause = rng.choice(fn.clauses)
    said: dict[str, str] = {}
    accepted: dict[str, list[Any]] = {}
    for p in fn.params:
        if "{" + p.name + "}" in clause:
            value, text = p.draw(rng)
            said[p.name] = text
            accepted[p.name] = [value]
        elif p.required:
            raise ValueError(f"clause {clause!r} of {fn.name} does not ask required {p.name}")
        else:
            accepted[p.name] = ["", p.default] if p.default is not None else [""]
    return Call(clause.format(**said), {fn.name: accepted})


def join_clauses(clauses: Sequence[str], rng: random.Random) -> str:
    """One user question from clauses: ``Convert ..., and find ....``"""
    first = clauses[0][0].upper() + clauses[0][1:]
    if len(clauses) == 1:
        return first + "."
    sep = rng.choice([", and ", "; also ", ". Then "])
    return sep.join([first, *clauses[1:]]) + "."


def generate(kind: str, rng: random.Random, catalogue: Sequence[Function] | None = None) -> dict[str, Any]:
    """One item of ``kind`` in BFCL's format: ``{"question", "function", "ground_truth", "kind"}``."""
    fns = list(catalogue if catalogue is not None else CATALOGUE)
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    multiple = kind in ("multiple", "parallel_multiple")
    offered = rng.sample(fns, rng.randint(2, 4) if multiple else 1)
    if kind == "simple" or kind == "multiple":
        calls = [draw_call(offered[0], rng)]
    elif kind == "parallel":
        calls = [draw_call(offered[0], rng) for _ in range(rng.randint(2, 3))]
    else:
        used = [offered[0], offered[1]] + ([rng.choice(offered[:2])] if rng.random() < 0.5 else [])
        calls = [draw_call(fn, rng) for fn in used]
    rng.shuffle(offered)
    return {
        "kind": kind,
        "question": [[{"role": "user", "content": join_clauses([c.clause for c in calls], rng)}]],
        "function": [fn.doc() for fn in offered],
        "ground_truth": [c.answer for c in calls],
    }


CITIES = ("Lyon", "Porto", "Krakow", "Ghent", "Bergen", "Tampere", "Graz", "Malmo", "Utrecht", "Cork", "Bilbao")
UNITS = ("celsius", "fahrenheit")
CURRENCIES = ("USD", "EUR", "GBP", "JPY", "CHF", "CAD", "SEK")
GENRES = ("jazz", "folk", "techno", "blues", "ambient", "reggae")
LANGS = ("French", "German", "Spanish", "Italian", "Dutch", "Polish")
ITEMS = ("apples", "rice", "milk", "eggs", "bread", "lentils", "tea", "onions")
NAMES = ("Mara", "Tobias", "Ines", "Kofi", "Yuki", "Arjun", "Lena", "Omar", "Sofia")
DECADES = phrased([(d, f"{d}s") for d in range(1950, 2030, 10)])
SHAPES = ("circle", "square", "hexagon", "triangle")

CATALOGUE: tuple[Function, ...] = (
    Function(
        "weather.forecast",
        "Get the weather forecast for a city for a number of days ahead.",
        (
            Param("city", "string", "Name of the city.", words(CITIES)),
            Param("days", "integer", "How many days ahead, 1 to 10.", ints(1, 10)),
            Param("unit", "string", "Temperature unit, celsius or fahrenheit.", words(UNITS), False, "celsius"),
        ),
        (
            "get the weather forecast for {city} for the next {days} days",
            "tell me the {days}-day forecast in {city} in {unit}",
            "show the forecast for {city}, {days} days ahead",
        ),
    ),
    Function(
        "convert_currency",
        "Convert an amount of money from one currency to another at today's rate.",
        (
            Param("amount", "float", "The amount to convert.", floats(1, 5000, 2)),
            Param("from_currency", "string", "ISO code of the source currency.", words(CURRENCIES)),
            Param("to_currency", "string", "ISO code of the target currency.", words(CURRENCIES)),
        ),
        (
            "convert {amount} {from_currency} to {to_currency}",
            "how much is {amount} {from_currency} in {to_currency}",
        ),
    ),
    Function(
        "geometry.area",
        "Compute the area of a regular shape from its size.",
        (
            Param("shape", "string", "The shape: circle, square, hexagon or triangle.", words(SHAPES)),
            Param("size", "float", "Radius of a circle, else the side length.", floats(0.5, 40)),
            Param("precision", "integer", "Decimal places of the result.", ints(0, 6), False, 2),
        ),
        (
            "compute the area of a {shape} of size {size}",
            "find the area of a {shape} with size {size}, rounded to {precision} decimal places",
        ),
    ),
    Function(
        "music.recommend",
        "Recommend songs of a genre, optionally limited to a decade.",
        (
            Param("genre", "string", "Music genre.", words(GENRES)),
            Param("count", "integer", "Number of songs.", ints(1, 20)),
            Param(
                "decade",
                "integer",
                "Decade such as 1980.",
                phrased([(d, f"{d}s") for d in range(1950, 2030, 10)]),
                False,
            ),
        ),
        (
            "recommend {count} {genre} songs",
            "suggest {count} {genre} tracks from the {decade}",
        ),
    ),
    Function(
        "translate_text",
        "Translate a short text into another language.",
        (
            Param(
                "text",
                "string",
                "The text to translate.",
                words(("good morning", "where is the station", "thank you very much", "see you tomorrow")),
            ),
            Param("target_language", "string", "The language to translate into.", words(LANGS)),
            Param("formal", "boolean", "Use the formal register.", phrased([(True, "formally")]), False, False),
        ),
        (
            "translate '{text}' into {target_language}",
            "translate '{text}' into {target_language} {formal}",
        ),
    ),
    Function(
        "shopping_list.add",
        "Add an item with a quantity to the shopping list.",
        (
            Param("item", "string", "The item to add.", words(ITEMS)),
            Param("quantity", "integer", "How many units.", ints(1, 12)),
        ),
        ("add {quantity} {item} to my shopping list", "put {item} on the shopping list, {quantity} of them"),
    ),
    Function(
        "calendar.create_event",
        "Create a calendar event on a date with a duration in minutes.",
        (
            Param("title", "string", "Title of the event.", words(("dentist", "team sync", "yoga", "book club"))),
            Param(
                "date",
                "string",
                "Date as YYYY-MM-DD.",
                phrased([(f"2027-0{m}-1{d}", f"2027-0{m}-1{d}") for m in range(1, 10) for d in range(10)]),
            ),
            Param("duration_minutes", "integer", "Length in minutes.", ints(15, 180), False, 60),
        ),
        (
            "schedule a {title} event on {date}",
            "create a {duration_minutes}-minute {title} on {date}",
        ),
    ),
    Function(
        "stats.mean",
        "Arithmetic mean of a list of numbers.",
        (Param("numbers", "array", "The numbers.", lists([str(i) for i in range(2, 60)], 3, 5), items="float"),),
        ("compute the mean of {numbers}", "average the numbers {numbers}"),
    ),
    Function(
        "physics.kinetic_energy",
        "Kinetic energy of a moving body in joules.",
        (
            Param("mass", "float", "Mass in kilograms.", floats(0.1, 500)),
            Param("velocity", "float", "Speed in metres per second.", floats(0.1, 90)),
        ),
        (
            "find the kinetic energy of a {mass} kg body moving at {velocity} m/s",
            "compute kinetic energy for mass {mass} kg and velocity {velocity} m/s",
        ),
    ),
    Function(
        "finance.loan_payment",
        "Monthly payment of a fixed-rate loan.",
        (
            Param("principal", "integer", "Loan amount.", ints(1000, 900000)),
            Param("annual_rate", "float", "Yearly interest rate in percent.", floats(0.5, 12, 2)),
            Param("years", "integer", "Term in years.", ints(1, 40)),
        ),
        (
            "calculate the monthly payment on a {principal} loan at {annual_rate}% for {years} years",
            "what is the monthly payment for borrowing {principal} over {years} years at {annual_rate} percent",
        ),
    ),
    Function(
        "contacts.send_message",
        "Send a text message to a contact.",
        (
            Param("recipient", "string", "Contact name.", words(NAMES)),
            Param(
                "message",
                "string",
                "Message body.",
                words(("running late", "call me back", "happy birthday", "lunch at noon?")),
            ),
            Param("urgent", "boolean", "Mark as urgent.", phrased([(True, "as urgent")]), False, False),
        ),
        ("send {recipient} the message '{message}'", "text {recipient} '{message}' {urgent}"),
    ),
    Function(
        "recipes.search",
        "Find recipes that use an ingredient, within a time limit.",
        (
            Param("ingredient", "string", "Main ingredient.", words(ITEMS)),
            Param("max_minutes", "integer", "Longest cooking time.", ints(10, 120)),
            Param("vegetarian", "boolean", "Vegetarian only.", phrased([(True, "vegetarian")]), False, False),
        ),
        (
            "find recipes with {ingredient} that take under {max_minutes} minutes",
            "look up {vegetarian} recipes using {ingredient}, at most {max_minutes} minutes",
        ),
    ),
    Function(
        "chem.molar_mass",
        "Molar mass of a chemical formula in g/mol.",
        (Param("formula", "string", "Chemical formula.", words(("H2O", "NaCl", "CO2", "C6H12O6", "NH3", "CH4"))),),
        ("get the molar mass of {formula}", "what is the molar mass of {formula}"),
    ),
    Function(
        "hotel.search",
        "Search hotels in a city for a number of nights and guests.",
        (
            Param("city", "string", "City.", words(CITIES)),
            Param("nights", "integer", "Number of nights.", ints(1, 14)),
            Param("guests", "integer", "Number of guests.", ints(1, 6), False, 1),
        ),
        (
            "search hotels in {city} for {nights} nights",
            "find a hotel in {city} for {guests} guests and {nights} nights",
        ),
    ),
    Function(
        "timer.set",
        "Start a countdown timer.",
        (
            Param("minutes", "integer", "Length of the timer in minutes.", ints(1, 90)),
            Param("label", "string", "Name of the timer.", words(("pasta", "tea", "laundry", "break")), False),
        ),
        ("set a timer for {minutes} minutes", "start a {minutes} minute timer called {label}"),
    ),
    Function(
        "math.gcd",
        "Greatest common divisor of two integers.",
        (
            Param("a", "integer", "First integer.", ints(2, 999)),
            Param("b", "integer", "Second integer.", ints(2, 999)),
        ),
        ("find the greatest common divisor of {a} and {b}", "compute gcd of {a} and {b}"),
    ),
    Function(
        "flights.status",
        "Status of a flight by its number.",
        (
            Param(
                "flight_number",
                "string",
                "Airline code and number.",
                phrased([(f"{c}{n}", f"{c}{n}") for c in ("LH", "AF", "KL", "IB") for n in (12, 345, 78, 901)]),
            ),
        ),
        ("check the status of flight {flight_number}", "is flight {flight_number} on time"),
    ),
    Function(
        "fitness.log_run",
        "Log a run with its distance and time.",
        (
            Param("distance_km", "float", "Distance in kilometres.", floats(1, 42)),
            Param("minutes", "integer", "Time in minutes.", ints(5, 300)),
        ),
        (
            "log a {distance_km} km run that took {minutes} minutes",
            "record my run: {distance_km} km in {minutes} minutes",
        ),
    ),
)
