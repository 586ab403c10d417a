"""The numbers of the BFCL lineup's report section: BFCL non-live per category and overall, beside the other
skills, for the base, the agents and every merge; and the paired differences on BFCL alone (``report`` renders).

The bfcl skill's test set is ``n / 4`` items of each category in ``TEST_CATEGORIES`` order (``BfclSkill.fixed_set``),
so a report's per-prompt ``values`` split into four consecutive blocks of equal length, one per category. A cell
of category c is, as every cell of the report (``aggregate.cell``), the mean over seeds of the per-seed accuracy
on c's items ± the SE over seeds, or with one seed that seed's accuracy ± its SE over c's prompts,
sqrt(p (1 - p) / (m - 1)) for m items (``mean_se``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentmerge_zoo.real.aggregate import cell, lineup, paired, paired_verdicts, row_labels, row_name
from agentmerge_zoo.real.evaluate import mean_se
from agentmerge_zoo.real.skill_bfcl import TEST_CATEGORIES
from agentmerge_zoo.real.suite import HELD_OUT

Cell = dict[str, float] | None


def by_category(values: Sequence[float]) -> list[list[float]]:
    """The bfcl test's per-prompt values as one list per category (``TEST_CATEGORIES``' order)."""
    k = len(TEST_CATEGORIES)
    per, left = divmod(len(values), k)
    if left or not per:
        raise ValueError(f"a bfcl test report of {len(values)} prompts: expected {k} categories of equal size")
    return [list(values[i * per : (i + 1) * per]) for i in range(k)]


def category_cells(reports: Sequence[dict[str, Any]]) -> list[dict[str, float]]:
    """Per category: its accuracy over the seeds' reports of one row (each report's ``bfcl`` values)."""
    split = [by_category(r["bfcl"]["values"]) for r in reports]
    out = []
    for c in range(len(TEST_CATEGORIES)):
        per_seed = [mean_se(s[c])[0] for s in split]
        out.append(cell(per_seed, mean_se(split[0][c])[1]))
    return out


def _row(reports: Sequence[dict[str, Any]], others: Sequence[str]) -> list[Cell]:
    """One row's cells: each category, BFCL overall, then ``others`` (None where a report lacks the skill)."""
    overall = cell([float(r["bfcl"]["strict"]) for r in reports], float(reports[0]["bfcl"]["strict_se"]))
    rest: list[Cell] = [
        cell([float(r[s]["strict"]) for r in reports], float(reports[0][s]["strict_se"]))
        if all(s in r for r in reports)
        else None
        for s in others
    ]
    return [*category_cells(reports), overall, *rest]


def rows_of(seeds: Sequence[dict[str, Any]], agg: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The rows (name, the seeds' reports) in the report's order (``row_labels``); a merge row where its reports
    have BFCL."""
    rows = [("base", [s["check"]["base"] for s in seeds])]
    rows += [(f"{k} agent", [s["check"]["agents"][k] for s in seeds]) for k in lineup(seeds)]
    for name in row_labels(seeds, agg)[len(rows) :]:
        have = [s["bench"]["reports"][name] for s in seeds if name in s["bench"]["reports"]]
        rows += [(name, have)] if have and all("bfcl" in r for r in have) else []
    return rows


def bfcl_differences(seeds: Sequence[dict[str, Any]], agg: dict[str, Any]) -> list[tuple[str, str, dict[str, float]]]:
    """The report's paired differences (RAM, RAM+ and the best method against their baselines) on BFCL alone:
    (view, "A-B", difference)."""
    out = []
    for kind, diffs in agg["differences"].items():
        for name in (n for n, d in diffs.items() if isinstance(d, dict)):
            a, b = name.split("-", 1)
            d = paired(seeds, row_name(a, kind), row_name(b, kind), ("bfcl",))
            out += [(kind, name, d)] if d is not None else []
    return out


def bfcl_table(seeds: Sequence[dict[str, Any]], agg: dict[str, Any]) -> tuple[list[str], list[tuple[str, list[Cell]]]]:
    """The columns (categories, BFCL overall, the other skills) and the rows (name, cells) of the section."""
    others = [s for s in (*lineup(seeds), *HELD_OUT) if s != "bfcl"]
    body = [(name, _row(reports, others)) for name, reports in rows_of(seeds, agg)]
    return [*TEST_CATEGORIES, "BFCL overall", *others], body


def _which(rows: dict[str, Any], method: str) -> str | None:
    """A seed's whole-test row of ``method`` (its defaults or its tuned row, whichever it scored)."""
    return next((n for n in rows if n.split(".")[0] == method), None)


WHOLE_PAIRS = (("ram", "base"), ("ram_plus", "base"), ("best", "base"), ("ram", "best"), ("ram_plus", "best"))


def whole_numbers(seeds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """results.json's ``bfcl_whole``: per row (base, the BFCL agent, each merge scored) the category and overall
    cells over the seeds that scored it, and the paired differences of ``WHOLE_PAIRS`` ("best": each seed's top
    method by the bench's objective) on the prompts every such seed scored both on."""
    done = [s for s in seeds if s.get("bfcl_whole", {}).get("run")]
    if not done:
        return {"run": False}
    per_seed = [s["bfcl_whole"]["rows"] for s in done]
    labels = list(dict.fromkeys(name for rows in per_seed for name in rows))
    table = {}
    for label in labels:
        reports = [{"bfcl": rows[label]} for rows in per_seed if label in rows]
        table[label] = {"cells": _row(reports, []), "seeds": len(reports)}
    diffs = {}
    for a, b in WHOLE_PAIRS:
        pairs = []
        for s, rows in zip(done, per_seed, strict=True):
            pick = {"base": "base", "best": (s["bfcl_whole"]["top"] or [None])[0]}
            ra, rb = pick.get(a) or _which(rows, a), pick.get(b) or _which(rows, b)
            if ra in rows and rb in rows and ra != rb:
                pairs.append((rows[ra]["values"], rows[rb]["values"]))
        if len(pairs) == len(done):
            diffs[f"{a}-{b}"] = paired_verdicts(pairs)
    n = done[0]["bfcl_whole"]["n"]
    tops = {str(s["seed"]): s["bfcl_whole"]["top"] for s in done}
    failed = {f"seed {s['seed']}: {k}": v for s in done for k, v in s["bfcl_whole"].get("failed", {}).items()}
    return {
        "run": True,
        "n": n,
        "seeds": [s["seed"] for s in done],
        "top": tops,
        "rows": table,
        "differences": diffs,
        "failed": failed,
    }
