"""The BFCL-format training generator: well-formed docs, answers that name every parameter, kinds as BFCL's."""

from __future__ import annotations

import json
import random

import pytest

from agentmerge_zoo.real.bfcl_gen import CATALOGUE, KINDS, draw_call, generate

TYPES = {"integer": int, "float": float, "string": str, "boolean": bool, "array": list}


@pytest.mark.parametrize("kind", KINDS)
def test_items_are_bfcl_shaped(kind: str) -> None:
    rng = random.Random(7)
    for _ in range(60):
        item = generate(kind, rng)
        offered = {f["name"]: f for f in item["function"]}
        calls = item["ground_truth"]
        assert len(offered) == 1 if kind in ("simple", "parallel") else 2 <= len(offered) <= 4
        assert len(calls) == 1 if kind in ("simple", "multiple") else 2 <= len(calls) <= 3
        called = {next(iter(c)) for c in calls}
        assert called <= set(offered)
        if kind == "parallel_multiple":
            assert len(called) == 2
        for call in calls:
            ((name, args),) = call.items()
            doc = offered[name]["parameters"]
            assert doc["type"] == "dict" and set(args) == set(doc["properties"])
            for arg, accepted in args.items():
                spec = doc["properties"][arg]
                required = arg in doc["required"]
                assert not (required and "" in accepted), (name, arg, accepted)
                for v in accepted:
                    if v != "":
                        want = TYPES[spec["type"]]
                        assert isinstance(v, want) or (want is float and isinstance(v, int)), (arg, v)
        text = item["question"][0][0]["content"]
        assert text[0].isupper() and text.endswith(".")
        json.dumps(item)  # JSON-ready


def test_a_mentioned_value_is_in_the_question() -> None:
    rng = random.Random(3)
    fn = next(f for f in CATALOGUE if f.name == "math.gcd")
    call = draw_call(fn, rng)
    a, b = call.answer["math.gcd"]["a"][0], call.answer["math.gcd"]["b"][0]
    assert str(a) in call.clause and str(b) in call.clause


def test_seeded_and_varied() -> None:
    one = [generate("parallel", random.Random(11)) for _ in range(3)]
    assert one[0] == one[1] == one[2]
    rng = random.Random(11)
    questions = {generate("simple", rng)["question"][0][0]["content"] for _ in range(200)}
    assert len(questions) > 150
    with pytest.raises(ValueError, match="kind must be one of"):
        generate("live_simple", rng)
