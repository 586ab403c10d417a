"""Markdown of an evaluation on the user's tasks: scores per task and checkpoint, shares of gain kept, samples."""

from __future__ import annotations

import json
from typing import Any

from agentmerge.evaluation.scoring import EvalRun


def percent(mean: float, se: float) -> str:
    """``0.725, 0.05`` -> ``72.5 % ± 5.0``."""
    return f"{100 * mean:.1f} % ± {100 * se:.1f}"


def eval_markdown(run: EvalRun, samples: bool = True) -> str:
    """Scores (percent of outputs that match, ± standard error) per task and checkpoint; shares; samples."""
    cks = run.checkpoints
    head = ["task", "n", *[f"{c.label} ({c.role})" if c.role != "model" else c.label for c in cks]]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for t in run.tasks:
        lines.append(f"| {t} | {cks[0].count[t]} | " + " | ".join(percent(c.mean[t], c.se[t]) for c in cks) + " |")
    if len(run.tasks) > 1:
        means = [sum(c.mean.values()) / len(c.mean) for c in cks]
        lines.append("| mean of tasks | | " + " | ".join(f"{100 * m:.1f} %" for m in means) + " |")
    plain = [c.label for c in cks if not c.chat_template]
    if plain:
        lines.append(f"\nPrompts used as written (no chat template) for: {', '.join(plain)}.")
    lines += _shares_markdown(run.shares())
    if samples:
        lines += _samples_markdown(run)
    return "\n".join(lines) + "\n"


def _shares_markdown(shares: list[dict[str, Any]]) -> list[str]:
    if not shares:
        return []
    lines = [
        "",
        "Share of gain kept: (merge - base) / (specialist - base), averaged over the specialist's tasks "
        "(those where it gains the most over the base).",
        "",
        "| merge | specialist | its tasks | share of gain kept |",
        "|---|---|---|---:|",
    ]
    for s in shares:
        lines.append(f"| {s['merge']} | {s['specialist']} | {', '.join(s['tasks'])} | {100 * s['share']:.0f} % |")
    return lines


def _samples_markdown(run: EvalRun) -> list[str]:
    lines: list[str] = []
    for c in run.checkpoints:
        for s in c.samples:
            mark = "correct" if s.correct else "wrong"
            lines += [
                "",
                f"**{c.label} / {s.task}** ({mark})",
                f"- prompt: {json.dumps(s.prompt, ensure_ascii=False)}",
                f"- output: {json.dumps(s.output, ensure_ascii=False)}",
                f"- reference: {json.dumps(s.reference, ensure_ascii=False)}",
            ]
    return lines
