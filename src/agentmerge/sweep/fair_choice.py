"""The fair protocol's choice of a method's best setting: one rule, used by the sweep's report and the zoo's bench.

Under the fair protocol every method that has an output scale (``Method.output_scale``) is tuned alike: its scale
runs over one shared grid, each setting is scored on validation, and the best setting is kept. Over candidates
``c`` with score ``s(c)`` (larger is better) and output scale ``v(c)``, the choice is

    best = argmax_c ( s(c), -|v(c) - 1|, -v(c) )

compared left to right: the highest score; among equal scores the scale nearest 1 (the merged task vector
taken as it is, the least extrapolation past or short of it), then the smaller scale. Candidates still equal
(or without a scale) go to the first in the order given. Scores are compared exactly; a NaN score ranks below
every number, and a candidate without a scale (``None``) below every candidate with one at the same score.

Example: over ``{scale: score}`` = ``{0.5: 0.3, 1.5: 0.3, 2.0: 0.2}`` 0.5 and 1.5 tie on the score and on the
distance to 1, so the smaller, 0.5, is kept; ``{0.75: 0.3, 1.5: 0.3, 2.0: 0.3}`` keeps 0.75.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

T = TypeVar("T")


def fair_key(score: float, scale: float | None) -> tuple[float, float, float]:
    """The sort key of the rule (module docstring): larger is the better choice."""
    s = -math.inf if math.isnan(score) else score
    if scale is None:
        return (s, -math.inf, -math.inf)
    return (s, -abs(scale - 1.0), -scale)


def fair_choice(candidates: Iterable[T], score: Callable[[T], float], scale: Callable[[T], float | None]) -> T | None:
    """The candidate the fair protocol keeps (module docstring); None when there is none."""
    best: T | None = None
    best_key: tuple[float, float, float] | None = None
    for c in candidates:
        key = fair_key(score(c), scale(c))
        if best_key is None or key > best_key:  # strictly better: the first of equals stays
            best, best_key = c, key
    return best


def choose_scale(scores: Mapping[float, float]) -> float | None:
    """The output scale chosen from ``{scale: validation score}``; None when no value was scored."""
    return fair_choice(scores, scores.__getitem__, float)
