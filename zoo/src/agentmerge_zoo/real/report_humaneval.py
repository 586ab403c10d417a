"""The real zoo report's HumanEval numbers (``humaneval``'s rows of each seed): pass@1 per row on the subset every
row is scored on and on the full set where it was, and paired differences against the base (``report`` renders).

A cell is, as every cell of the report (``aggregate.cell``), the mean over the seeds that scored the row on that
set of their pass@1 ± the SE over those seeds, or with one seed its pass@1 ± the SE over problems,
sqrt(p (1 - p) / (m - 1)). A paired difference A - base is taken on the same problems: per seed the mean over
the set of x_A,p - x_base,p (x = 1 when problem p passes); with one seed ± its SE over problems, with several the
mean over seeds ± the SE over seeds. On the subset every row has one; on the full set only the rows scored on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentmerge_zoo.real.aggregate import cell, paired_verdicts, row_labels, row_name
from agentmerge_zoo.real.evaluate import mean_se

SETS = ("subset", "full")
NOT_RUN_LINE = (
    "HumanEval was not run: the models' code runs only when `agentmerge zoo real run` is given "
    '`--humaneval-allow-code-execution` (README.md, "HumanEval").'
)


def ran(seeds: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The seeds whose run scored HumanEval."""
    return [s for s in seeds if s.get("humaneval", {}).get("run")]


def set_cell(rows: Sequence[dict[str, Any]], which: str) -> dict[str, float] | None:
    """pass@1 over the seeds' rows scored on ``which`` ("subset" or "full"); None where none was."""
    have = [r[which] for r in rows if r.get(which)]
    if not have:
        return None
    return cell([mean_se(v)[0] for v in have], mean_se(have[0])[1])


def to_base(seeds: Sequence[dict[str, Any]], name: str, which: str) -> dict[str, float] | None:
    """name - base on ``which``'s problems (module docstring); None unless every seed scored both on it."""
    pairs = [(s["humaneval"]["rows"].get(name, {}).get(which), s["humaneval"]["rows"]["base"][which]) for s in seeds]
    if not pairs or any(not a or not b for a, b in pairs):
        return None
    return paired_verdicts(pairs)


def humaneval_numbers(seeds: Sequence[dict[str, Any]], agg: dict[str, Any]) -> dict[str, Any]:
    """results.json's ``humaneval``: the cells of every row, which rows have the full set, differences to base."""
    done = ran(seeds)
    if not done:
        return {"run": False}
    rows: dict[str, Any] = {}
    for label in row_labels(done, agg):
        per = [s["humaneval"]["rows"][label] for s in done if label in s["humaneval"]["rows"]]
        if per:
            rows[label] = {w: set_cell(per, w) for w in SETS} | {"seeds": len(per)}
            rows[label]["full_seeds"] = sum(bool(r.get("full")) for r in per)
    diffs: dict[str, Any] = {}
    for kind, found in agg["differences"].items():
        for method in dict.fromkeys(("ram", "ram_plus", found.get("best"))):
            name = row_name(method, kind) if method else None
            for which in SETS if name in rows else ():
                if (d := to_base(done, str(name), which)) is not None:
                    diffs[f"{name}-base.{which}"] = d
    first = done[0]["humaneval"]
    sizes = {"subset": first["subset"], "full": first["full"], "top": {s["seed"]: s["humaneval"]["top"] for s in done}}
    failed = {f"seed {s['seed']}: {n}": why for s in done for n, why in s["humaneval"].get("failed", {}).items()}
    sizes |= {"sandbox": sorted({n for s in done for n in s["humaneval"].get("sandbox", [])}), "failed": failed}
    return {"run": True, "seeds": [s["seed"] for s in done], **sizes, "rows": rows, "differences": diffs}


def humaneval_lines(numbers: dict[str, Any], n_seeds: int, pct: Any, table: Any) -> list[str]:
    """The report's "HumanEval pass@1" section (``pct`` and ``table``: the report's cell and table renderers)."""
    lines = ["## HumanEval pass@1 (held out; greedy, % on the same problems per column)", ""]
    if not numbers.get("run"):
        return [*lines, NOT_RUN_LINE, ""]
    subset, full = numbers["subset"], numbers["full"]
    top = "; ".join(f"seed {s}: {', '.join(t) or 'none'}" for s, t in numbers["top"].items())
    lines += [
        f"Every row on the first {subset} problems of one fixed seeded order; the base, the agents and each seed's "
        f"top methods by the bench's objective ({top}) also on the first {full}, which hold those {subset}. A "
        f'"-" in the {full} column: not scored on it; only the {subset}-problem column compares every row. '
        f"Seeds scored: {', '.join(map(str, numbers['seeds']))} of {n_seeds}.",
        "",
    ]
    body = [[name, *humaneval_texts(numbers, name, pct)] for name in numbers["rows"]]
    lines += [*table(["row", f"first {subset}", f"first {full}"], body), ""]
    lines += ["Paired differences against the base (points, on the same problems):", ""]
    diffs = [
        f"- {k.replace('.subset', f' (first {subset})').replace('.full', f' (first {full})')} = "
        f"{100 * d['mean']:+.1f} ± {100 * d['se']:.1f}"
        for k, d in numbers["differences"].items()
    ]
    lines += [*(diffs or ["(none)"]), ""]
    lines += [f"Not scored (its merge or run failed): {name}: {why}" for name, why in numbers["failed"].items()]
    notes = "; ".join(numbers["sandbox"]) or "none"
    return [*lines, f"What the sandbox could not isolate on the machine that ran it: {notes}.", ""]


def humaneval_texts(numbers: dict[str, Any], name: str, pct: Any) -> list[str]:
    """A row's subset and full cells as text (``pct``), "-" where it has none; a full cell over fewer seeds than
    the subset's says how many."""
    row = numbers.get("rows", {}).get(name)
    if not row:
        return ["-", "-"]
    full = pct(row["full"])
    if row["full"] and row["full_seeds"] < row["seeds"]:
        full += f" ({row['full_seeds']} of {row['seeds']} seeds)"
    return [pct(row["subset"]), full]
