"""The search study over seeds (docs/search.md): search vs the tuned baseline on test, per seed and paired.

Reads each seed's search folder (``search.json`` and ``results.jsonl`` of ``agentmerge search``, as
``scripts/zoo_search_run.sh`` writes them) and prints a markdown table: per seed the baseline's and the best
point's validation and test objective, their test difference ± its SE paired over the objective's metrics, and
the best-so-far validation score after a few budgets; then the mean difference over seeds ± its SE over seeds
(sd / sqrt(seeds)).

    python scripts/search_seeds_table.py LABEL=DIR [LABEL=DIR ...] [--budgets 12,24,50,100,200] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any


def best_so_far(records: list[dict[str, Any]], objective: str, budgets: list[int]) -> dict[int, float | None]:
    """The best full trial's objective among the first ``b`` recorded trials, for each budget ``b``."""
    out: dict[int, float | None] = {}
    for b in budgets:
        scores = [
            r["metrics"][objective]
            for r in records[:b]
            if r.get("status") == "ok" and not r.get("stopped_early") and objective in r.get("metrics", {})
        ]
        out[b] = max(scores) if scores and len(records) >= b else None
    return out


def baseline_validation(folder: Path, objective: str) -> float | None:
    """The tuned baseline's best validation score: its sweep's records, copied beside the search's
    (``baseline-sweep.jsonl``) or where ``scripts/zoo_search_run.sh`` leaves them (``../baseline``)."""
    sweep = next(
        (f for f in (folder / "baseline-sweep.jsonl", folder.parent / "baseline" / "results.jsonl") if f.is_file()),
        None,
    )
    if sweep is None:
        return None
    rows = [json.loads(line) for line in sweep.read_text().splitlines() if line.strip()]
    return max((r["metrics"][objective] for r in rows if r.get("status") == "ok"), default=None)


def seed_row(label: str, folder: Path, budgets: list[int]) -> dict[str, Any]:
    data = json.loads((folder / "search.json").read_text())
    objective = data["objective"]
    log = folder / "results.jsonl"  # absent from a folder that keeps only the report
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.is_file() else []
    test, diff = data["test"], data["test"]["difference"]
    return {
        "seed": label,
        "trials": len(records) or None,
        "val_search": data["best"]["validation"],
        "val_baseline": baseline_validation(folder, objective),
        "test_search": test["best"]["metrics"][objective],
        "test_baseline": test["baseline"]["metrics"][objective],
        "diff": diff["value"],
        "se_paired": diff.get("se_paired"),
        "best_so_far": best_so_far(records, objective, budgets),
        "baseline": test["keys"]["baseline"],
    }


def fmt(x: float | None, digits: int = 4) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="LABEL=DIR: a search folder (with search.json) per seed")
    parser.add_argument("--budgets", default="12,24,50,100,200")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    budgets = [int(b) for b in args.budgets.split(",")]
    rows = [seed_row(*(run.split("=", 1)[0], Path(run.split("=", 1)[1])), budgets) for run in args.runs]
    longest = max((r["trials"] or 0 for r in rows), default=0)
    budgets = [b for b in budgets if b <= longest] or budgets  # no column that every seed leaves empty
    print(
        "| seed | trials | baseline | val: baseline | val: search | test: baseline | test: search | "
        "search − baseline (± SE paired over metrics) | " + " | ".join(f"best val @{b}" for b in budgets) + " |"
    )
    print("|" + "---|" * (8 + len(budgets)))
    for r in rows:
        cells = [
            r["seed"],
            str(r["trials"] or "-"),
            f"`{r['baseline']}`",
            fmt(r["val_baseline"]),
            fmt(r["val_search"]),
            fmt(r["test_baseline"]),
            fmt(r["test_search"]),
            f"{r['diff']:+.4f} ± {fmt(r['se_paired'])}",
            *(fmt(r["best_so_far"][b]) for b in budgets),
        ]
        print("| " + " | ".join(cells) + " |")
    diffs = [r["diff"] for r in rows]
    mean = sum(diffs) / len(diffs)
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1) / len(diffs)) if len(diffs) > 1 else None
    print(f"\nsearch − baseline on test over {len(diffs)} seeds: {mean:+.4f} ± {fmt(se)} (SE over seeds)")
    if args.json:
        args.json.write_text(json.dumps({"seeds": rows, "mean_diff": mean, "se_over_seeds": se}, indent=1) + "\n")


if __name__ == "__main__":
    main()
