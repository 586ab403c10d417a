"""Markdown of an evaluation on the user's tasks: scores per task and checkpoint, shares of gain kept, samples."""

from __future__ import annotations

from typing import Any

from agentmerge.evaluation.scoring import EvalRun
from agentmerge.io.guards import jsontext


def md_cell(text: object) -> str:
    """``text`` as one markdown table cell: ``|`` escaped, line breaks and other control characters as spaces."""
    flat = "".join(" " if (ord(c) < 32 or c in "\x7f\u2028\u2029\x85") else c for c in str(text))
    return flat.replace("\\", "\\\\").replace("|", "\\|")


def percent(mean: float, se: float) -> str:
    """``0.725, 0.05`` -> ``72.5 % ± 5.0``."""
    return f"{100 * mean:.1f} % ± {100 * se:.1f}"


def eval_markdown(run: EvalRun, samples: bool = True) -> str:
    """Scores (percent of outputs that match, ± standard error) per task and checkpoint; shares; samples."""
    cks = run.checkpoints
    head = ["task", "n", *[f"{md_cell(c.label)} ({c.role})" if c.role != "model" else md_cell(c.label) for c in cks]]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for t in run.tasks:
        cells = " | ".join(percent(c.mean[t], c.se[t]) for c in cks)
        lines.append(f"| {md_cell(t)} | {cks[0].count[t]} | {cells} |")
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
        tasks = md_cell(", ".join(s["tasks"]))
        lines.append(f"| {md_cell(s['merge'])} | {md_cell(s['specialist'])} | {tasks} | {100 * s['share']:.0f} % |")
    return lines


def _samples_markdown(run: EvalRun) -> list[str]:
    lines: list[str] = []
    for c in run.checkpoints:
        for s in c.samples:
            mark = "correct" if s.correct else "wrong"
            lines += [
                "",
                f"**{c.label} / {s.task}** ({mark})",
                f"- prompt: {jsontext.dumps(s.prompt, ensure_ascii=False)}",
                f"- output: {jsontext.dumps(s.output, ensure_ascii=False)}",
                f"- reference: {jsontext.dumps(s.reference, ensure_ascii=False)}",
            ]
    return lines
