"""A search's ``DIR/results.md``: the trials, the best-so-far curve, the best point per group, the test comparison.

Read from ``results.jsonl`` (the trials, in the order they finished) and ``search.json`` (``finish.py``: the best
point, its files, the test scores). Plots (matplotlib, when installed): ``best-so-far.png`` (each trial's
validation objective and the best so far, against the trial's rank) and ``weights.png`` (the best point's weight
per agent and layer group as a heat map, for a space with ``per_agent: {weight: ...}``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentmerge.sweep.finish import read_summary
from agentmerge.sweep.sweep_report import objective_of, score
from agentmerge.sweep.sweepfile import SweepConfig


def curve(cfg: SweepConfig, records: Sequence[dict[str, Any]], objective: str) -> list[tuple[float | None, float]]:
    """Per trial, in the order they finished: its objective (None: failed; a stopped trial's: its first items')
    and the best so far (of the trials that scored every item)."""
    out: list[tuple[float | None, float]] = []
    best = -math.inf
    for r in records:
        s = score(cfg, r, objective)
        best = max(best, s) if s is not None and not r.get("stopped_early") else best
        sign = 1.0 if cfg.direction == "max" else -1.0
        out.append((None if s is None else sign * s, sign * best))
    return out


def group_table(point: dict[str, float], n_agents: int) -> tuple[list[str], list[str], list[list[float | None]]]:
    """The best point per group: group names, column names (``weight[i]``, per-group parameters), the values."""
    groups: list[str] = []
    columns: list[str] = [f"weight[{i}]" for i in range(n_agents) if any(k.startswith(f"weight.{i}.") for k in point)]
    for key in point:
        if key.startswith("weight."):
            group = key.split(".", 2)[2]
        elif "." in key:
            name, group = key.split(".", 1)
            columns += [name] if name not in columns else []
        else:
            continue
        groups += [group] if group not in groups else []
    cells = [[_cell_of(point, col, g) for col in columns] for g in groups]
    return groups, columns, cells


def _cell_of(point: dict[str, float], column: str, group: str) -> float | None:
    if column.startswith("weight["):
        return point.get(f"weight.{column[7:-1]}.{group}")
    return point.get(f"{column}.{group}")


def markdown(cfg: SweepConfig, records: Sequence[dict[str, Any]], summary: dict[str, Any], plots: list[str]) -> str:
    assert cfg.space is not None
    objective = objective_of(cfg, records) or "?"
    ok = [r for r in records if r.get("status") == "ok"]
    seconds = [float(r.get("seconds", 0.0)) for r in records]
    lines = [
        f"# Search: {cfg.space.method}, {cfg.search.kind}, {cfg.search.n_trials} trials (seed {cfg.search.seed})",
        "",
        f"Fitness: `{cfg.evaluate}` ({objective}, {cfg.direction}); "
        f"test: `{cfg.test or 'none'}`, scored once at the end.",
        f"{len(records)} trials recorded, {len(records) - len(ok)} failed; "
        f"{_mean(seconds):.2f} s per trial (merge and validation), {sum(seconds):.0f} s of trial time in all.",
        "",
    ]
    lines += _best_lines(cfg, summary, objective)
    lines += _test_lines(summary, objective)
    lines += _early_lines(cfg, summary)
    warning = (summary.get("noise") or {}).get("warning")
    lines += [f"**Warning:** {warning}.", ""] if warning else []
    lines += [f"![{p}]({p})" for p in plots] + ([""] if plots else [])
    lines += ["## Trials (in the order they finished)", "", f"| # | {objective} | best so far | seconds | status |"]
    lines.append("|---:|---:|---:|---:|---|")
    for i, (r, (value, best)) in enumerate(zip(records, curve(cfg, records, objective), strict=True), 1):
        shown = "-" if value is None else f"{value:.4f}"
        lines.append(f"| {i} | {shown} | {best:.4f} | {r.get('seconds', 0):.2f} | {_status(r)} |")
    return "\n".join(lines) + "\n"


def _status(record: dict[str, Any]) -> str:
    if record.get("stopped_early"):
        return f"stopped early ({record.get('items')} of {record.get('items_total')} items)"
    return str(record["status"])


def _early_lines(cfg: SweepConfig, summary: dict[str, Any]) -> list[str]:
    rule, early = cfg.search.early_stop, summary.get("early_stop")
    if rule is None or not early:
        return []
    saved, full, short = early["seconds_saved"], early["full_trial_eval_seconds"], early["stopped_trial_eval_seconds"]
    estimate = (
        f"{early['items_unscored']} items left unscored; about {saved:.1f} s of evaluation saved (a full trial's "
        f"evaluation took a median {full:.2f} s, a stopped one's {short:.2f} s on average)"
        if saved is not None
        else f"{early['items_unscored']} items left unscored"
    )
    return [
        f"Early stopping (first {rule.first} items, margin {rule.margin:g}): {early['stopped']} trials stopped "
        f"early; {estimate}. A stopped trial's score is that of its first items; it is never the best point.",
        "",
    ]


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _best_lines(cfg: SweepConfig, summary: dict[str, Any], objective: str) -> list[str]:
    best = summary.get("best")
    if not best:
        return ["No trial finished.", ""]
    lines = [
        f"## Best point: {objective} = {best['validation']:.4f} on validation",
        "",
        f"Merge config: `{best['yaml']}` (`agentmerge merge {best['yaml']} --out X` gives `{best['folder']}/` "
        "byte for byte); merged: `" + best["folder"] + "/`.",
        "",
    ]
    point = best["point"]
    globals_ = {k: v for k, v in point.items() if "." not in k}
    if globals_:
        lines += ["Global: " + ", ".join(f"{k} = {v:.4g}" for k, v in sorted(globals_.items())), ""]
    groups, columns, cells = group_table(point, len(cfg.models))
    if groups:
        lines += ["| group | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
        for g, row in zip(groups, cells, strict=True):
            lines.append(f"| {g} | " + " | ".join("-" if v is None else f"{v:.3f}" for v in row) + " |")
        lines += ["", "Agents: " + ", ".join(f"[{i}] {m}" for i, m in enumerate(cfg.models)), ""]
    return lines


def _test_lines(summary: dict[str, Any], objective: str) -> list[str]:
    test = summary.get("test")
    if not test:
        return []
    lines = [f"## Test (`{test['evaluator']}`), scored once", "", f"| merge | {objective} | ± SE |", "|---|---:|---:|"]
    for name in ("best", "baseline"):
        if name in test:
            se = test[name]["stderr"].get(objective)
            label = f"{name} ({summary[name]['key']})" if name == "baseline" else "best point"
            lines.append(f"| {label} | {test[name]['metrics'][objective]:.4f} | {_se(se)} |")
    d = test.get("difference")
    if d:
        lines.append(f"| best - baseline | {d['value']:+.4f} | {_se(d['se_paired'] or d['se_unpaired'])} |")
        how = (
            f"paired over {len(d['paired_over'])} metrics ({', '.join(d['paired_over'])})"
            if d["se_paired"] is not None
            else "from the evaluator's errors (unpaired)"
            if d["se_unpaired"] is not None
            else "none: one metric and no standard errors"
        )
        also = d["se_unpaired"] if d["se_paired"] is not None else None
        how += f"; from the evaluator's errors (unpaired, an upper bound): {also:.4f}" if also is not None else ""
        lines += ["", f"SE of the difference: {how}."]
    return [*lines, ""]


def _se(se: float | None) -> str:
    return "-" if se is None else f"{se:.4f}"


def write_search_report(cfg: SweepConfig, records: Sequence[dict[str, Any]], root: Path) -> Path:
    """``results.md`` and its plots for a search."""
    summary = read_summary(root)
    plots = _plots(cfg, records, summary, root)
    path = root / "results.md"
    path.write_text(markdown(cfg, records, summary, plots))
    return path


def _plots(cfg: SweepConfig, records: Sequence[dict[str, Any]], summary: dict[str, Any], root: Path) -> list[str]:
    objective = objective_of(cfg, records)
    if objective is None or not records:
        return []
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    made = [_curve_plot(plt, curve(cfg, records, objective), objective, root / "best-so-far.png")]
    best = summary.get("best")
    if best and any(k.startswith("weight.") for k in best["point"]):
        made.append(_weights_plot(plt, best["point"], len(cfg.models), root / "weights.png"))
    return [p.name for p in made]


def _curve_plot(plt: Any, points: list[tuple[float | None, float]], objective: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6.0, 3.6))
    xs = [i for i, (v, _) in enumerate(points, 1) if v is not None]
    ax.scatter(xs, [v for v, _ in points if v is not None], s=10, alpha=0.5, label="trial")
    ax.plot(range(1, len(points) + 1), [b for _, b in points], color="C1", label="best so far")
    ax.set_xlabel("trial")
    ax.set_ylabel(f"{objective} (validation)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _weights_plot(plt: Any, point: dict[str, float], n_agents: int, path: Path) -> Path:
    groups, columns, cells = group_table(point, n_agents)
    agents = [i for i, c in enumerate(columns) if c.startswith("weight[")]
    grid = [[math.nan if cells[g][a] is None else cells[g][a] for g in range(len(groups))] for a in agents]
    fig, ax = plt.subplots(figsize=(max(4.5, 1.5 + 0.8 * len(groups)), 1.6 + 0.5 * len(agents)))
    im = ax.imshow(grid, aspect="auto", cmap="viridis")
    ax.set_xticks(range(len(groups)), groups, rotation=30)
    ax.set_yticks(range(len(agents)), [columns[a] for a in agents])
    ax.set_title("best point: weight (agent x layer group)", fontsize=10)
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def search_lines(root: Path) -> list[str]:
    """What a search wrote, for the command's summary: the best point's files and the test comparison."""
    summary = read_summary(root)
    best, test = summary.get("best"), summary.get("test") or {}
    if not best:
        return []
    objective = summary.get("objective", "")
    lines = [f"best point: {root / best['yaml']} (merged: {root / best['folder']})"]
    if test:
        parts = [f"{k} {test[k]['metrics'][objective]:.4f}" for k in ("best", "baseline") if k in test]
        d = test.get("difference")
        if d:
            se = d["se_paired"] if d["se_paired"] is not None else d["se_unpaired"]
            parts.append(f"difference {d['value']:+.4f}" + (f" ± {se:.4f}" if se is not None else ""))
        lines.append(f"test ({test['evaluator']}, {objective}): " + ", ".join(parts))
    return lines
