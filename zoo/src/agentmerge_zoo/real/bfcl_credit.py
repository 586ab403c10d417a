"""Dense partial credit for the BFCL tool agent's GRPO (the training reward; the score stays BFCL's verdict).

A group of sampled answers only teaches when their rewards differ. The first credit (0.2 parseable, + 0.3 right
functions, + 0.5 correct) left the pilot's groups at 0.2 each after 40 steps: the base writes parseable calls of
invented names (or the demonstrations' names) and almost never samples the exact function, so nothing in the
group pointed at the docs. This credit rewards each step towards an accepted answer on its own:

    credit = 0.1 · parseable
           + 0.1 · (share of the calls that name an offered function)
           + 0.1 · (name overlap: |calls ∩ expected| / max(|calls|, |expected|), names as multisets)
           + 0.1 · (key share: over the expected calls, the mean share of the arguments they must give that the
                    best call of that name names, whatever its value)
           + 0.2 · (value share: over the expected calls, the mean share of the arguments they must give that the
                    best call of that name passes with an accepted value)
           + 0.4 · correct (BFCL's checker)

so an accepted answer earns 1, an unparseable one 0, and a call of the right function that names its arguments with
half of their values right earns 0.6 (but see the names rule below). Arguments that may be left out (accepted
``""``) are not counted; a function with none to give has key and value shares of 1. An answer that calls a function
of the prompt's demonstrations (``shown``: never offered) earns 0: the second pilot's agent learned to copy a
demonstration's answer word for word, which a credit without that rule pays 0.1 every time. The key share is there
because the fourth pilot's agent, under a credit of 0.2 for the names and none for argument names, learned to call
the right function with no arguments at all (``[calculate_density()]``: 0.4 safe, where arguments risked an
unparseable answer); with the key share that answer earned 0.3 and naming the arguments 0.1 more.

**The names earn only with an argument.** Where the answer's calls give none of the arguments the expected calls
must give (key share 0), the two name terms are 0 too, so an empty call of the right function earns 0.1
(parseable) and one that names an argument 0.3 and more. The seventh pilot's agent, under the signature hint
(``skill_bfcl``), learned to copy the hint's form, ``[calculate_density(country)]``: BFCL reads a positional
argument as nothing, so that is the empty call again (0.3 under the previous credit), the attractor of three of
the four pilots before this rule; a function with no argument to give keeps its key share of 1 and the names.

**A positional argument earns nothing.** Under the rule above the eighth pilot's agent (temperature 0.7) copied
the signature hint literally, ``[calendar.create_event(title, date)]``, for the 0.1 of a parseable answer, by step
14 on every prompt: the hint is itself a call, and copying it is the one answer that sampling never breaks. BFCL
drops positional arguments when it decodes, so such a call can never carry an argument; an answer whose calls
pass one (:func:`positional`; calls inside a value, ``date=datetime(2027, 8, 18)``, are values) earns 0.

**An answer that does not decode** (trailing prose, a value that is no Python, a call cut off by the token limit)
loses the 0.1 of parseable and BFCL's 0.4, and nothing else: its names and arguments are read by pattern
(:func:`scanned`) and credited as above. The fifth pilot's agent, with everything lost when an answer did not
decode, still learned the empty call: writing arguments risked the whole credit; now it risks 0.1.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence, Set
from typing import Any

from agentmerge.api import BfclCall as Call
from agentmerge.api import BfclDecodeError as DecodeError
from agentmerge.api import bfcl_decode as decode
from agentmerge.api import bfcl_normalised as normalised
from agentmerge.api import bfcl_verdict as verdict

Expected = Mapping[str, Mapping[str, Sequence[Any]]]


def _same(value: Any, accepted: Sequence[Any]) -> bool:
    """A loose value match for shaping: equal after BFCL's string normalisation (numbers as written)."""
    key = normalised(str(value))
    return any(key == normalised(str(a)) for a in accepted)


def _must_give(accepted: Mapping[str, Sequence[Any]]) -> list[str]:
    """The arguments an answer must give (those without the accepted ``""`` that lets them be left out)."""
    return [name for name, values in accepted.items() if values and "" not in values]


def argument_share(call_args: Mapping[str, Any], accepted: Mapping[str, Sequence[Any]]) -> float:
    """The share of ``accepted``'s arguments that must be given which ``call_args`` gives with an accepted value."""
    given = _must_give(accepted)
    if not given:
        return 1.0
    return sum(name in call_args and _same(call_args[name], accepted[name]) for name in given) / len(given)


def key_share(call_args: Mapping[str, Any], accepted: Mapping[str, Sequence[Any]]) -> float:
    """The share of ``accepted``'s arguments that must be given which ``call_args`` names, whatever the value."""
    given = _must_give(accepted)
    return sum(name in call_args for name in given) / len(given) if given else 1.0


def name_overlap(calls: Sequence[Call], answer: Sequence[Expected]) -> float:
    """``|calls ∩ answer| / max(|calls|, |answer|)`` over the called names as multisets."""
    got = Counter(next(iter(c), "") for c in calls)
    want = Counter(next(iter(e)) for e in answer)
    return sum((got & want).values()) / max(sum(got.values()), sum(want.values()), 1)


Share = Callable[[Mapping[str, Any], Mapping[str, Sequence[Any]]], float]


def _arguments(calls: Sequence[Call], answer: Sequence[Expected], share: Share = argument_share) -> float:
    """Over the expected calls, the mean of ``share`` for the best call of the same name (0 where there is none)."""
    shares = []
    for expected in answer:
        name, accepted = next(iter(expected.items()))
        best = [share(c[name], accepted) for c in calls if name in c]
        shares.append(max(best, default=0.0))
    return sum(shares) / max(len(shares), 1)


def positional(output: str) -> bool:
    """Whether a call of the answer (the list's own calls, not calls inside a value) passes a positional argument,
    which BFCL's decoding drops without a word. ``False`` where the answer is no Python expression."""
    try:
        body = ast.parse(output.strip(), mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    calls = body.elts if isinstance(body, ast.List | ast.Tuple) else [body]
    return any(isinstance(c, ast.Call) and bool(c.args) for c in calls)


def called_names(output: str) -> set[str]:
    """The functions an answer calls (empty when it does not decode)."""
    try:
        return {next(iter(c), "") for c in decode(output)}
    except DecodeError:
        return set()


_CALL = re.compile(r"([A-Za-z_][\w.]*)\(([^()]*)\)?")
_ARG = re.compile(r"""(\w+)\s*=\s*('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|\[[^\]]*\]|[^,()]+)""")


def _value(text: str) -> Any:
    """A scanned argument value: a Python literal where it reads as one, else its text."""
    try:
        return ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text.strip().strip("'\"")


def scanned(output: str) -> list[Call]:
    """The calls an answer that does not decode still writes: each ``name(key=value, ...)`` found by pattern
    (a call cut off by the token limit included), for shaping only; BFCL's verdict never sees them."""
    return [{name: {k: _value(v) for k, v in _ARG.findall(args)}} for name, args in _CALL.findall(output)]


def credit(
    output: str,
    functions: Sequence[Mapping[str, Any]],
    answer: Sequence[Expected],
    mode: str,
    shown: Set[str] = frozenset(),
) -> float:
    """The training reward of one answer (module docstring), in [0, 1]; ``shown``: the demonstrations' functions."""
    try:
        calls, parsed = decode(output), True
    except DecodeError:
        calls, parsed = scanned(output), False
    offered = {f["name"] for f in functions}
    if not calls or any(next(iter(c), "") in shown - offered for c in calls) or positional(output):
        return 0.0
    on_list = sum(next(iter(c), "") in offered for c in calls) / len(calls)
    correct = parsed and verdict(output, functions, answer, mode).correct
    names, keys = name_overlap(calls, answer), _arguments(calls, answer, key_share)
    if keys == 0:  # no argument it must give is given: the names earn nothing (the empty-call attractor)
        on_list = names = 0.0
    total = 0.1 * parsed + 0.1 * on_list + 0.1 * names + 0.1 * keys + 0.2 * _arguments(calls, answer) + 0.4 * correct
    return round(total, 6)
