"""The fair protocol's one rule for the best setting (``agentmerge.sweep.fair_choice``), as the sweep's page uses it.

The zoo's bench uses the same function (``tests/zoo/test_fair.py``)."""

from __future__ import annotations

import itertools
import math
import random

from agentmerge.sweep.fair_choice import choose_scale, fair_choice
from agentmerge.sweep.sweep_report import markdown
from agentmerge.sweep.sweepfile import sweep_from_dict


def naive(scores: dict[float, float]) -> float:
    """The rule spelled out: the best scores, then the nearest to 1 of those, then the smallest of those."""
    top = max(scores.values())
    best = [v for v, s in scores.items() if s == top]
    nearest = min(abs(v - 1.0) for v in best)
    return min(v for v in best if abs(v - 1.0) == nearest)


def test_the_rule_on_known_answers() -> None:
    assert choose_scale({0.5: 0.2, 1.0: 0.3, 2.0: 0.4}) == 2.0  # the best score wins, however far from 1
    assert choose_scale({0.5: 0.4, 1.0: 0.4, 2.0: 0.4}) == 1.0  # identical merges: the default scale
    assert choose_scale({0.5: 0.3, 1.5: 0.3, 2.0: 0.2}) == 0.5  # as near to 1: the smaller
    assert choose_scale({0.75: 0.3, 1.5: 0.3, 2.0: 0.3}) == 0.75
    assert choose_scale({0.5: math.nan, 2.0: 0.1}) == 2.0  # NaN ranks below every number
    assert choose_scale({}) is None


def test_the_rule_matches_the_naive_one_in_any_order() -> None:
    rng = random.Random(0)
    grid = [0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0]
    for _ in range(200):
        scores = {v: rng.choice([0.1, 0.2, 0.3]) for v in rng.sample(grid, rng.randint(1, len(grid)))}
        want = naive(scores)
        for order in itertools.islice(itertools.permutations(scores), 6):
            assert choose_scale({v: scores[v] for v in order}) == want


def test_equal_candidates_go_to_the_first_and_a_missing_scale_ranks_last() -> None:
    rows = [("a", 0.3, 1.0), ("b", 0.3, 1.0), ("c", 0.3, None)]
    assert fair_choice(rows, lambda r: r[1], lambda r: r[2]) == ("a", 0.3, 1.0)
    assert fair_choice(rows[::-1], lambda r: r[1], lambda r: r[2]) == ("b", 0.3, 1.0)
    assert fair_choice(rows[2:], lambda r: r[1], lambda r: r[2]) == ("c", 0.3, None)
    assert fair_choice([], lambda r: 0.0, lambda r: None) is None


def _page(scores: dict[float, float], direction: str) -> str:
    cfg = sweep_from_dict(
        {"base": "b", "models": ["a1"], "methods": {"ram": {}}, "output_scale": sorted(scores),
         "evaluate": "zoo", "direction": direction, "objective": "loss"}
    )  # fmt: skip
    records = [
        {"status": "ok", "method": "ram", "params": {"scale": v}, "models": ["a1"], "seed": 0, "trial": f"t{v}",
         "metrics": {"loss": s}}
        for v, s in scores.items()
    ]  # fmt: skip
    return markdown(cfg, records)


def test_the_sweep_page_breaks_a_tie_by_the_same_rule() -> None:
    """1.5 is recorded first and ranks first among the tied; the rule keeps 0.5 (as near to 1, smaller)."""
    page = _page({1.5: 0.7, 0.5: 0.7, 1.0: 0.2}, "max")
    assert "| ram | a1 | 0.2 | 0.7 | `ram(scale=0.5)` |" in page
    page = _page({1.5: 0.1, 0.5: 0.1, 1.0: 0.4, 3.0: 0.05}, "min")  # smaller is better: 3.0 wins outright
    assert "| ram | a1 | 0.4 | 0.05 | `ram(scale=3.0)` |" in page
