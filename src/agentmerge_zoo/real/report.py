"""docs/real/results.md and results.json from the seeds' ``result.json`` files."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentmerge_zoo.real.aggregate import aggregate
from agentmerge_zoo.real.suite import HELD_OUT, TRAINED
from agentmerge_zoo.report_md import table


def pct(cell: dict[str, float] | None, digits: int = 1) -> str:
    """``mean ± se`` in percent ("-" when missing)."""
    if not cell or math.isnan(cell["mean"]):
        return "-"
    se = "" if math.isnan(cell["se"]) else f" ± {100 * cell['se']:.{digits}f}"
    return f"{100 * cell['mean']:.{digits}f}{se}"


def _curve_summary(curve: Sequence[dict[str, float]]) -> str:
    if not curve:
        return "-"
    k = max(1, min(10, len(curve) // 3))
    first = sum(r["reward"] for r in curve[:k]) / k
    last = sum(r["reward"] for r in curve[-k:]) / k
    return f"{first:.2f} → {last:.2f}"


def agents_table(seeds: Sequence[dict[str, Any]]) -> list[str]:
    header = ["seed", "agent", "storage", "steps", "reward (first → last)", "base", "agent", "density %"]
    header += ["unique %", "drift", "s=1 / s=1.5 (val)", "converged"]
    rows = []
    for s in seeds:
        check, recipes = s["check"], {r["skill"]: r for r in s["config"]["recipes"]}
        for skill in TRAINED:
            base, agent = check["base"][skill], check["agents"][skill][skill]
            probe, conv = check["probe"][skill], check["convergence"][skill]
            sc = conv["scores"]
            rows.append(
                [
                    str(s["seed"]),
                    skill,
                    recipes[skill]["storage"],
                    str(len(s["curves"][skill])),
                    _curve_summary(s["curves"][skill]),
                    pct({"mean": base["strict"], "se": base["strict_se"]}),
                    pct({"mean": agent["strict"], "se": agent["strict_se"]}),
                    f"{100 * probe['density']:.1f}",
                    f"{100 * probe['overlap'][0]:.1f}",
                    f"{probe['drift']:.2e}",
                    f"{100 * sc['1']['strict']:.1f} / {100 * sc['1.5']['strict']:.1f}",
                    _verdict(conv),
                ]
            )
    return table(header, rows)


def _verdict(conv: dict[str, Any]) -> str:
    if "converged" not in conv:
        return "-"
    word = "yes" if conv["converged"] else "**no**"
    return f"{word} (+{100 * conv['gain_1.5']:.1f} vs 2 SE {100 * conv['two_se']:.1f})"


def method_table(rows: dict[str, dict[str, Any]], tuning: dict[str, Any] | None = None) -> list[str]:
    header = ["method", *TRAINED, "mean", "gain kept", *(f"{h} Δ" for h in HELD_OUT)]
    header += ["chosen scale"] if tuning is not None else []
    order = sorted(rows, key=lambda m: -rows[m]["trained_avg"]["mean"])
    out = []
    for method in order:
        row = rows[method]
        cells = [method, *(pct(row.get(s)) for s in TRAINED), pct(row["trained_avg"]), pct(row.get("gain_kept"), 0)]
        cells += [pct(row.get(f"{h}_delta")) for h in HELD_OUT]
        if tuning is not None:
            cells.append(tuning.get(method, "-"))
        out.append(cells)
    return table(header, out)


def _chosen(seeds: Sequence[dict[str, Any]]) -> dict[str, str]:
    chosen: dict[str, list[str]] = {}
    for s in seeds:
        for method, t in s["bench"]["tuning"].items():
            chosen.setdefault(method, []).append(f"{t['param']}={t['value']}")
    return {m: ", ".join(v) for m, v in chosen.items()}


def render(seeds: Sequence[dict[str, Any]], agg: dict[str, Any], command: str) -> str:
    lines = ["# The real zoo: SmolLM2-135M-Instruct agents merged with every method", ""]
    lines += [f"Seeds {agg['seeds']}, made by `{command}` (see [README.md](README.md) for the setup and budget).", ""]
    lines += ["## Agents", "", *agents_table(seeds), ""]
    lines += ["## Defaults (strict % on test)", "", *method_table(agg["tables"]["defaults"]), ""]
    lines += ["## Tuned (output scale chosen on validation)", ""]
    lines += [*method_table(agg["tables"]["tuned"], _chosen(seeds)), ""]
    lines += ["## Paired differences (trained-skill mean, points)", ""]
    for kind, diffs in agg["differences"].items():
        for name, d in diffs.items():
            if name != "best_baseline" and d:
                lines.append(f"- {kind}: {name} = {100 * d['mean']:+.1f} ± {100 * d['se']:.1f}")
    lines += [
        "",
        "## Pairs",
        "",
        *_simple(agg["pairs"]),
        "",
        "## Dilution (own skill)",
        "",
        *_simple(agg["dilution"]),
        "",
    ]
    return "\n".join(lines)


def _simple(rows: dict[str, Any]) -> list[str]:
    skills = [*TRAINED, *HELD_OUT]
    body = [[name, *(pct(r.get(s)) if r else "-" for s in skills)] for name, r in rows.items()]
    return table(["merge", *skills], body) if body else ["(none)"]


def write_results(work: Path, seeds: Sequence[int], docs: Path, command: str) -> tuple[Path, Path]:
    """Aggregate the finished seeds' results into ``docs/results.{json,md}``."""
    results = [json.loads((work / f"seed{s}" / "result.json").read_text()) for s in seeds]
    agg = aggregate(results)
    docs.mkdir(parents=True, exist_ok=True)
    payload = {"command": command, "aggregate": agg, "seeds": [_slim(r) for r in results]}
    (docs / "results.json").write_text(json.dumps(payload, indent=1) + "\n")
    (docs / "results.md").write_text(render(results, agg, command) + "\n")
    return docs / "results.json", docs / "results.md"


def _slim(result: dict[str, Any]) -> dict[str, Any]:
    """A seed's result without the per-prompt score lists (they stay in WORK)."""

    def strip(report: Any) -> Any:
        if isinstance(report, dict):
            return {k: strip(v) for k, v in report.items() if k != "values"}
        return report

    return strip(result)  # type: ignore[no-any-return]
