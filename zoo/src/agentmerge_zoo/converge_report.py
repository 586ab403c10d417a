"""The convergence check's tables: per agent, its own-domain score at each scale (mean over seeds), its
m(1.5) - m(1) against two standard errors and the verdict per seed (results.md, "Convergence check"), and the
rounds of the convergence loop (``zoo check --rounds``: which agents got more steps, and what the check said).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentmerge.api import dumps_json
from agentmerge_zoo.evaluate import mean_and_se


def aggregate_checks(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per domain over the records' ``convergence`` (one per seed): steps, score per scale (mean ± SE over seeds),
    and per seed the evaluation SEs, the gain m(1.5) - m(1), two SE of it and the verdict."""
    out: dict[str, Any] = {}
    for domain in records[0]["convergence"]:
        per = [r["convergence"][domain] for r in records]
        scales = list(per[0]["scores"])
        scores = {}
        for s in scales:
            mean, se = mean_and_se([p["scores"][s]["value"] for p in per])
            scores[s] = {"mean": mean, "se": se, "values": [p["scores"][s]["value"] for p in per]}
        out[domain] = {
            "metric": per[0]["metric"],
            "steps": [p["steps"] for p in per],
            "scores": scores,
            "eval_se": {s: [p["scores"][s]["se"] for p in per] for s in scales},
            "gain": [p["gain_1.5"] for p in per],
            "two_se": [p["two_se"] for p in per],
            "converged": [p["converged"] for p in per],
        }
    return out


def _pts(x: Any) -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{100 * x:+.1f}"


def _cell(entry: dict[str, Any], scale: str) -> str:
    """Mean over seeds ± SE over seeds (one seed: ± the evaluation's SE), in percent."""
    cell = entry["scores"][scale]
    se = cell["se"] if len(cell["values"]) > 1 else entry["eval_se"][scale][0]
    return f"{100 * cell['mean']:.1f} ± {100 * (se or 0.0):.1f}"


def _verdicts(entry: dict[str, Any]) -> str:
    words = {True: "yes", False: "**no**", None: "unknown"}
    return " / ".join(words[v] for v in entry["converged"])


def check_table(conv: dict[str, Any], first: Sequence[str] = ()) -> list[str]:
    """The table's lines; ``first`` are leading cells of every row (a round number)."""
    scales = list(next(iter(conv.values()))["scores"])
    head = [*(["round"] if first else []), "agent", "steps", *(f"s = {s}" for s in scales)]
    head += ["m(1.5) − m(1) (2 SE), per seed (pts)", "converged, per seed"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for domain, entry in conv.items():
        steps = " / ".join(str(s) for s in sorted(set(entry["steps"])))
        gains = " / ".join(
            f"{_pts(g)} ({_pts(t).lstrip('+')})" for g, t in zip(entry["gain"], entry["two_se"], strict=True)
        )
        cells = [*first, f"agent_{domain}", steps, *(_cell(entry, s) for s in scales), gains, _verdicts(entry)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def check_lines(res: dict[str, Any]) -> list[str]:
    """The regime's "Convergence check" section of results.md (nothing when the bench ran without it)."""
    conv = res.get("convergence")
    if not conv:
        return []
    return [
        "### Convergence check",
        "",
        "Each agent's own-domain score (mean of its domain's columns, validation) at θ0 + s·τ, mean over seeds ± "
        "SE over seeds (one seed: ± the evaluation's SE). An agent counts as converged when m(1.5) − m(1) ≤ 2 SE "
        "(the evaluation's, per seed): see `agentmerge converge` ([evaluate.md](evaluate.md)) and `zoo check` "
        "([zoo.md](zoo.md)).",
        "",
        *check_table(conv),
        "",
    ]


def rounds_lines(regime: str, history: Sequence[dict[str, Any]]) -> list[str]:
    """The convergence loop of one regime: one block of rows per round."""
    lines = [f"## Regime `{regime}`", ""]
    rows: list[str] = []
    for entry in history:
        conv = aggregate_checks([{"convergence": checks} for checks in entry["checks"].values()])
        table = check_table(conv, [str(entry["round"])])
        rows += table if not rows else table[2:]
    failing = history[-1]["failing"] if history else []
    steps = ", ".join(f"{d} {n}" for d, n in history[-1]["steps"].items()) if history else ""
    end = f"still failing after the last round: {', '.join(failing)}" if failing else "every agent passes"
    return [*lines, *rows, "", f"Final steps: {steps}; {end}.", ""]


def write_rounds(path: Path, regime: str, history: Sequence[dict[str, Any]], steps: str, command: str) -> Path:
    """``path`` (JSON: the regime's rounds and final steps) and its Markdown next to it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"regime": regime, "command": command, "steps": steps, "rounds": list(history)}
    path.write_text(dumps_json(data, indent=1) + "\n")
    md = path.with_suffix(".md")
    head = ["# Convergence loop", "", f"Command: `{command}`", ""]
    md.write_text("\n".join([*head, *rounds_lines(regime, history), f"`--steps {steps}`", ""]))
    return md
