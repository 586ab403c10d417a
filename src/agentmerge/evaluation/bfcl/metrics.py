"""Per-category accuracy ± SE and BFCL's summaries, as metrics named ``bfcl.<category>``.

For a category with n answers of which k are right: accuracy p = k / n, standard error
sqrt(p (1 - p) / (n - 1)) (the sample standard deviation of the 0/1 verdicts over sqrt(n)), and the share of
answers that decode as one or more calls (``bfcl.<category>.parseable``; ``[]`` and prose are not).

BFCL's leaderboard summaries, over the categories scored:

    bfcl.non_live = (1/K) sum_c p_c                 over the non-live AST categories (unweighted)
    bfcl.live     = sum_c n_c p_c / sum_c n_c       over the live AST categories (weighted by item count)

with SE sqrt(sum_c se_c^2) / K and sqrt(sum_c n_c^2 se_c^2) / sum_c n_c. (Ir)relevance is reported on its
own, as BFCL does. BFCL's non-live "simple" also averages Java and JavaScript, which are not scored here, and
BFCL counts a category not run as 0; here a summary is over the categories scored (the record lists them).
``bfcl_avg``, the default objective of a sweep, is the unweighted mean of every scored category's accuracy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from agentmerge.evaluation.bfcl.checker import Verdict
from agentmerge.evaluation.bfcl.data import LIVE_AST, NON_LIVE_AST
from agentmerge.evaluation.evaluator import Score
from agentmerge.evaluation.scoring import mean_se


@dataclass(frozen=True)
class CategoryScore:
    category: str
    accuracy: float
    stderr: float
    count: int  # answers scored
    of: int  # items the category has
    parseable: float  # share of answers that decode as one or more calls


def category_score(category: str, verdicts: Sequence[Verdict], of: int) -> CategoryScore:
    accuracy, se = mean_se([v.correct for v in verdicts])
    parseable = sum(v.parseable for v in verdicts) / len(verdicts)
    return CategoryScore(category, accuracy, se, len(verdicts), of, parseable)


def summaries(scores: Mapping[str, CategoryScore]) -> dict[str, tuple[float, float, int]]:
    """``{"bfcl.non_live" / "bfcl.live": (mean, se, answers)}`` for the sides with a scored AST category."""
    out = {}
    non_live = [scores[c] for c in NON_LIVE_AST if c in scores]
    if non_live:
        k = len(non_live)
        se = math.sqrt(sum(s.stderr**2 for s in non_live)) / k
        out["bfcl.non_live"] = (sum(s.accuracy for s in non_live) / k, se, sum(s.count for s in non_live))
    live = [scores[c] for c in LIVE_AST if c in scores]
    if live:
        n = sum(s.count for s in live)
        se = math.sqrt(sum((s.count * s.stderr) ** 2 for s in live)) / n
        out["bfcl.live"] = (sum(s.count * s.accuracy for s in live) / n, se, n)
    return out


def as_score(scores: Mapping[str, CategoryScore], record: dict[str, object]) -> Score:
    """The metrics (``bfcl.<category>``, ``.parseable``, the summaries, ``bfcl_avg``) and the full record."""
    metrics: dict[str, float] = {}
    stderr: dict[str, float] = {}
    count: dict[str, int] = {}
    for c, s in scores.items():
        metrics[f"bfcl.{c}"], stderr[f"bfcl.{c}"], count[f"bfcl.{c}"] = s.accuracy, s.stderr, s.count
        metrics[f"bfcl.{c}.parseable"] = s.parseable
    for name, (mean, se, n) in summaries(scores).items():
        metrics[name], stderr[name], count[name] = mean, se, n
    metrics["bfcl_avg"] = sum(s.accuracy for s in scores.values()) / len(scores)
    full = {**record, "categories": {c: asdict(s) for c, s in scores.items()}, "metrics": metrics, "stderr": stderr}
    return Score(metrics, stderr, count, {**full, "count": count})
