"""Our BFCL checker, decoder and prompt against BFCL's own (``bfcl-eval`` installed with --no-deps in a temporary
folder): every verdict on the ground truths and their perturbations must be the same."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from agentmerge.errors import ConfigError
from agentmerge.evaluation.bfcl import data, prompt
from agentmerge.evaluation.bfcl.checker import mode_of, verdict
from agentmerge.evaluation.wheeldata import BFCL_WHEEL, wheel_path
from bfcl_reference import bfcl_modules, bfcl_verdict, install

PER_AST_CATEGORY = 100  # seeded items per AST category (all of the small ones)
PER_RELEVANCE_CATEGORY = 40


@pytest.fixture(scope="module")
def bfcl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    try:
        wheel = wheel_path(BFCL_WHEEL)
    except ConfigError as exc:  # only where the index cannot be reached and no copy is named
        pytest.skip(f"the pinned BFCL wheel cannot be had here: {exc}")
    target = tmp_path_factory.mktemp("bfcl-eval")
    install(wheel, target)
    with bfcl_modules(target) as modules:
        yield modules


def _items() -> list[data.Item]:
    out = []
    for category in data.CATEGORIES:
        n = PER_RELEVANCE_CATEGORY if "relevance" in category else PER_AST_CATEGORY
        out += data.subset(data.load_category(category), n, seed=7)
    return out


def _call(name: str, args: dict[str, Any]) -> str:
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})"


def _chosen(accepted: dict[str, list[Any]], optional: bool) -> dict[str, Any]:
    """One accepted value per argument (the first that is not ""); optional ones only when ``optional``."""
    out = {}
    for k, values in accepted.items():
        real = [v for v in values if v != ""]
        if real and (optional or "" not in values):
            out[k] = real[0]
    return out


def _wrong(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 12345
    if isinstance(value, str):
        return value + " zzz"
    if isinstance(value, list):
        return [*value, "zzz"]
    if isinstance(value, dict):
        return {**value, "zzz": 1}
    return "zzz"


def _perturbed(item: data.Item, rng: random.Random) -> Iterator[str]:
    """Ground truth as calls, and the perturbations the issue names (plus a few decoding cases)."""
    calls = [(next(iter(e)), dict(next(iter(e.values())))) for e in item.answer or ()]
    plain = [_call(n, _chosen(a, False)) for n, a in calls]
    full = [_call(n, _chosen(a, True)) for n, a in calls]
    yield "[" + ", ".join(plain) + "]"
    yield "[" + ", ".join(full) + "]"
    yield ", ".join(plain)  # missing brackets
    yield "```python\n[" + ", ".join(full) + "]\n```"
    yield "I would call " + ", ".join(plain)  # prose
    yield "[]"
    yield "[" + ", ".join(reversed(full)) + "]"  # reordered parallel
    yield "[" + ", ".join(full[:-1]) + "]"  # a call short
    yield "[" + ", ".join([*full, full[0]]) + "]"  # a call too many
    name, accepted = calls[0]
    args = _chosen(accepted, True)
    rest = ", ".join(full[1:])
    tail = f", {rest}]" if rest else "]"
    yield "[" + _call(name, {**args, "unexpected_arg": 1}) + tail  # extra argument
    others = [f["name"] for f in item.functions if f["name"] != name]
    yield "[" + _call(others[0] if others else "not_" + name, args) + tail  # wrong function
    if args:
        key = rng.choice(sorted(args))
        yield "[" + _call(name, {**args, key: _wrong(args[key])}) + tail  # wrong value
        yield "[" + _call(name, {k: v for k, v in args.items() if k != key}) + tail  # missing argument
        yield "[" + f"{name}({args[key]!r}, " + _call("", {k: v for k, v in args.items() if k != key})[1:] + tail
        value = args[key]
        if isinstance(value, str):
            yield "[" + _call(name, {**args, key: value.upper() + ". "}) + tail  # normalisation
        if isinstance(value, float) and value.is_integer():
            yield "[" + _call(name, {**args, key: int(value)}) + tail  # int for float
        if isinstance(value, int) and not isinstance(value, bool):
            yield "[" + _call(name, {**args, key: float(value)}) + tail  # float for int
            yield "[" + _call(name, {**args, key: str(value)}) + tail  # string for int
            yield "[" + _call(name, {**args, key: -value}).replace(f"={-value!r}", f"=+{value!r}") + tail
        if isinstance(value, list):
            yield "[" + _call(name, {**args, key: tuple(value)}) + tail  # tuple for list
            yield "[" + _call(name, {**args, key: []}) + tail  # empty list


def _relevance_outputs(item: data.Item) -> Iterator[str]:
    f = item.functions[0]
    required = {p: "x" for p in f["parameters"].get("required", [])}
    yield "[]"
    yield "I cannot answer this with the functions given."
    yield "[" + _call(f["name"], required) + "]"
    yield _call(f["name"], {})
    yield "none"


def test_prompt_is_bfcls(bfcl: Any) -> None:
    for category in data.CATEGORIES:
        item = data.load_category(category)[3]
        entry = {"id": item.id, "function": [dict(f) for f in item.functions]}
        theirs = bfcl.chat([dict(m) for m in item.messages], bfcl.with_hint(entry["function"], category), item.id)
        assert prompt.chat(item) == theirs, category
    assert prompt.system_prompt(item.functions) == bfcl.system_prompt(
        bfcl.default_format, prompt.hinted(item.functions)
    )


def test_every_verdict_agrees_with_bfcls_checker(bfcl: Any) -> None:
    rng = random.Random(0)
    seen: Counter[tuple[str, bool]] = Counter()
    disagree = []
    for item in _items():
        entry = {"id": item.id, "function": [dict(f) for f in item.functions]}
        answer = [dict(e) for e in item.answer] if item.answer else None
        outputs = _relevance_outputs(item) if item.answer is None else _perturbed(item, rng)
        for output in outputs:
            ours = verdict(output, item.functions, item.answer, mode_of(item.category)).correct
            theirs = bfcl_verdict(bfcl, output, entry, answer, item.category)
            seen[(item.category, theirs)] += 1
            if ours != theirs:
                disagree.append((item.id, output, ours, theirs))
    total = sum(seen.values())
    assert total >= 2000, total
    assert not disagree, f"{len(disagree)} of {total} verdicts differ, e.g. {disagree[:3]}"
    for category in data.CATEGORIES:  # both verdicts occur in every category
        assert seen[(category, True)] > 0 and seen[(category, False)] > 0, category


def _doc(name: str, **types: str) -> dict[str, Any]:
    props: dict[str, Any] = {k: {"type": t, "description": k} for k, t in types.items()}
    for v in props.values():
        if v["type"] == "array":
            v["items"] = {"type": "string"}
    return {"name": name, "description": "d", "parameters": {"type": "dict", "properties": props, "required": ["x"]}}


ODD = _doc("f", x="integer", s="string", tags="array")
ODD_ANSWER = [{"f": {"x": [-5], "s": ["", "abc"], "tags": ["", ["a"]]}}]
PAIR = [{"f": {"x": [1, 2]}}, {"f": {"x": [1]}}]


@pytest.mark.parametrize(
    ("output", "answer", "mode", "right"),
    [
        ("[f(x=+5)]", ODD_ANSWER, "simple", True),  # unary plus read as minus
        ("[f(x=~5)]", ODD_ANSWER, "simple", True),
        ("[f(3, x=-5)]", ODD_ANSWER, "simple", True),  # positional argument dropped
        ("[f(-5)]", ODD_ANSWER, "simple", False),
        ("[f(x=-5, tags=[])]", ODD_ANSWER, "simple", True),  # [] for an optional array
        ("[f(x=-5, s='A-B C')]", ODD_ANSWER, "simple", True),  # normalisation
        ("[f(x=1), f(x=2)]", PAIR, "parallel", False),  # greedy matching
        ("[f(x=2), f(x=1)]", PAIR, "parallel", True),
    ],
)
def test_bfcls_odd_rules_are_followed(bfcl: Any, output: str, answer: Any, mode: str, right: bool) -> None:
    category = {"simple": "simple_python", "parallel": "parallel"}[mode]
    assert bfcl_verdict(bfcl, output, {"function": [ODD]}, answer, category) is right
    assert verdict(output, [ODD], answer, mode).correct is right
