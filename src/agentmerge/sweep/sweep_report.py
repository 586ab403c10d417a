"""``DIR/results.md``: the sweep's settings ranked by the objective (mean ± SE over seeds), the best, plots.

Records of one setting (method, parameters, models) differ only by seed; each table row is one setting
with the mean of its seeds' objective and the standard error of that mean (``±`` only where 2+ seeds
ran). Plots (matplotlib, when installed): bars with error bars of each method's best setting, and a heat
map of the objective for every method swept over exactly two parameters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentmerge.evaluation.eval_report import md_cell
from agentmerge.io.guards import jsontext
from agentmerge.methods.registry import METHODS
from agentmerge.sweep import evaluators
from agentmerge.sweep.fair_choice import fair_choice
from agentmerge.sweep.sweepfile import SweepConfig


def objective_of(cfg: SweepConfig, records: Sequence[dict[str, Any]]) -> str | None:
    """The metric trials are ranked by: the file's, the evaluator's default, or the only metric there is."""
    if cfg.objective:
        return cfg.objective
    default = evaluators.default_objective(cfg.evaluate)
    if default:
        return default
    names = {k for r in records if r.get("status") == "ok" for k in r.get("metrics", {})}
    return next(iter(names)) if len(names) == 1 else None


def score(cfg: SweepConfig, record: dict[str, Any], objective: str | None) -> float | None:
    """The record's objective, signed so that larger is better (None when it has none)."""
    value = record.get("metrics", {}).get(objective) if objective else None
    if not isinstance(value, int | float):
        return None
    return float(value) if cfg.direction == "max" else -float(value)


def best_record(cfg: SweepConfig, records: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The record with the best objective; never a trial a search stopped early (its metrics are a prefix's)."""
    objective = objective_of(cfg, records)
    whole = [r for r in records if not r.get("stopped_early")]
    scored = [(s, r) for r in whole if (s := score(cfg, r, objective)) is not None]
    return max(scored, key=lambda sr: sr[0])[1] if scored else None


@dataclass(frozen=True)
class Row:
    """One setting over its seeds."""

    method: str
    params: dict[str, Any]
    models: list[str]
    mean: float
    se: float | None  # None with one seed
    seeds: int
    metrics: dict[str, float]  # every metric's mean over the seeds
    name: str | None = None  # an explicit trial's name
    kept: list[float | None] | None = None  # per model: the share of its update kept, mean over seeds (``kept``)

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        params = ", ".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return f"{self.method}({params})" if params else self.method


def rows(cfg: SweepConfig, records: Sequence[dict[str, Any]]) -> list[Row]:
    """Settings ranked best first by the objective's mean over seeds."""
    objective = objective_of(cfg, records)
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if r.get("status") == "ok" and objective in r.get("metrics", {}):
            key = jsontext.dumps([r["method"], r["params"], r["models"], r.get("name")], sort_keys=True)
            groups.setdefault(key, []).append(r)
    out = []
    for group in groups.values():
        values = [float(r["metrics"][objective]) for r in group]
        names = set.intersection(*(set(r["metrics"]) for r in group))
        means = {m: sum(float(r["metrics"][m]) for r in group) / len(group) for m in sorted(names)}
        first = group[0]
        mean, se = _mean_se(values)
        kept = _kept_means(group)
        out.append(
            Row(first["method"], first["params"], first["models"], mean, se, len(group), means, first.get("name"), kept)
        )
    return sorted(out, key=lambda row: row.mean, reverse=cfg.direction == "max")


def _kept_means(group: Sequence[dict[str, Any]]) -> list[float | None] | None:
    """Per model, the mean over the group's records of ``kept`` (None where no record has a value); None unless
    every record has ``kept``."""
    if not all("kept" in r for r in group):
        return None
    columns = zip(*(r["kept"] for r in group), strict=True)
    return [sum(known) / len(known) if (known := [x for x in c if x is not None]) else None for c in columns]


def _mean_se(values: Sequence[float]) -> tuple[float, float | None]:
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def markdown(cfg: SweepConfig, records: Sequence[dict[str, Any]], plots: Sequence[str] = ()) -> str:
    """The whole results page."""
    objective = objective_of(cfg, records)
    ranked = rows(cfg, records)
    failed = [r for r in records if r.get("status") != "ok"]
    lines = [
        "# Sweep results\n",
        f"{len(records)} trials recorded ({len(failed)} failed); objective: `{objective}` ({cfg.direction}); "
        f"evaluator: `{cfg.evaluate}`; seeds: {', '.join(map(str, cfg.seeds))}.\n",
    ]
    if ranked:
        best = ranked[0]
        se = f" ± {best.se:.4g}" if best.se is not None else ""
        lines += [f"**Best:** `{best.label}` on {', '.join(best.models)}: {objective} = {best.mean:.4g}{se}.\n"]
        note = extrapolation_note(best.method, best.params)
        lines += [f"{note}\n"] if note else []
        lines += [_table(ranked, objective or ""), ""]
        lines += _fair(cfg, ranked) if cfg.output_scale else []
    lines += [f"![{Path(p).stem}]({p})\n" for p in plots]
    if failed:
        lines += ["## Failed trials\n", "| trial | setting | error |", "|---|---|---|"]
        lines += [f"| {r['trial']} | {md_cell(_setting(r))} | {md_cell(r.get('error', ''))} |" for r in failed]
        lines.append("")
    return "\n".join(lines)


def scale_of(method: str, params: dict[str, Any]) -> tuple[str | None, float | None]:
    """The method's output-scale parameter and its value in ``params`` (else its default); Nones without one."""
    name = METHODS[method].output_scale if method in METHODS else None
    given = METHODS[method].canonical(params) if name else {}  # results.jsonl of old runs say lambda / alpha
    value = given.get(name, METHODS[method].defaults().get(name)) if name else None
    return name, float(value) if isinstance(value, int | float) else None


def extrapolation_note(method: str, params: dict[str, Any]) -> str | None:
    """A pointer to the convergence check when the winner scales its merged task vector up (output scale > 1)."""
    name, value = scale_of(method, params)
    if value is None or value <= 1:
        return None
    return (
        f"Note: the best setting scales the merged task vector up ({name} = {value:g} > 1). Agents whose own "
        "score still rises past their own weights reward any merge that extrapolates; check them with "
        "`agentmerge converge BASE AGENT ... --evaluate SPEC` (docs/evaluate.md) before reading the ranking."
    )


def _fair(cfg: SweepConfig, ranked: Sequence[Row]) -> list[str]:
    """The fair protocol's two views per method and model set: at its defaults, and its tuned setting, chosen by
    the protocol's one rule (``fair_choice``: best mean, a tie to the output scale nearest 1, then the smaller)."""
    lines = ["## Defaults and tuned (one shared output-scale grid)\n"]
    lines += ["| method | models | defaults | tuned | tuned setting |", "|---|---|---|---|---|"]
    groups: dict[tuple[str, tuple[str, ...]], list[Row]] = {}
    for row in ranked:  # best first, so the table lists the method and model sets in the ranking's order
        if not row.name:
            groups.setdefault((row.method, tuple(row.models)), []).append(row)
    sign = 1.0 if cfg.direction == "max" else -1.0
    for (method, models), group in groups.items():
        tuned = fair_choice(group, lambda r: sign * r.mean, lambda r: scale_of(r.method, r.params)[1])
        default = next((r for r in group if _at_defaults(r)), None)
        label = f"`{md_cell(tuned.label)}`" if tuned else ""
        cells = [method, md_cell(", ".join(models)), _value(default), _value(tuned), label]
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def _at_defaults(row: Row) -> bool:
    method = METHODS[row.method]
    defaults = method.defaults()
    return not row.name and all(defaults.get(k) == v for k, v in method.canonical(row.params).items())


def _value(row: Row | None) -> str:
    if row is None:
        return "not run"
    return f"{row.mean:.4g}" + (f" ± {row.se:.2g}" if row.se is not None else "")


def _setting(r: dict[str, Any]) -> str:
    if r.get("name"):
        return f"{r['name']} seed {r.get('seed')}"
    params = ", ".join(f"{k}={v}" for k, v in sorted(r.get("params", {}).items()))
    return f"{r.get('method')}({params}) seed {r.get('seed')}"


def _table(ranked: Sequence[Row], objective: str) -> str:
    others = [m for m in ranked[0].metrics if m != objective][:6]
    kept = any(row.kept is not None for row in ranked)
    head = ["rank", "setting", "models", md_cell(objective), "seeds", *map(md_cell, others)]
    head += ["kept of each model's update"] if kept else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, row in enumerate(ranked, 1):
        value = f"{row.mean:.4g}" + (f" ± {row.se:.2g}" if row.se is not None else "")
        extra = [f"{row.metrics[m]:.4g}" if m in row.metrics else "" for m in others]
        extra += [_kept_text(row.kept)] if kept else []
        cells = [str(i), f"`{md_cell(row.label)}`", md_cell(", ".join(row.models)), value, str(row.seeds), *extra]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _kept_text(kept: list[float | None] | None) -> str:
    return "" if kept is None else " / ".join("-" if x is None else f"{x:.2f}" for x in kept)


def write_report(cfg: SweepConfig, records: Sequence[dict[str, Any]], root: Path) -> Path:
    """Write ``results.md`` (and its plots when matplotlib is installed) into ``root``."""
    plots = _plots(cfg, records, root)
    path = root / "results.md"
    path.write_text(markdown(cfg, records, plots))
    return path


def _plots(cfg: SweepConfig, records: Sequence[dict[str, Any]], root: Path) -> list[str]:
    ranked = rows(cfg, records)
    if not ranked:
        return []
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    objective = objective_of(cfg, records) or ""
    made: list[Path | None] = [_bars(plt, ranked, objective, root / "methods.png")]
    for method, values in cfg.methods.items():
        swept = sorted(k for k, v in values.items() if isinstance(v, list) and len(v) > 1)
        if len(swept) == 2:
            made.append(_heat(plt, [r for r in ranked if r.method == method], method, swept, objective, root))
    return [p.name for p in made if p is not None]


def _bars(plt: Any, ranked: Sequence[Row], objective: str, path: Path) -> Path:
    best: dict[str, Row] = {}
    for row in ranked:  # ranked best first: the first row of a method is its best
        best.setdefault(row.method, row)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(best)), 3.6))
    names = list(best)
    ax.bar(names, [best[m].mean for m in names], yerr=[best[m].se or 0.0 for m in names], capsize=4)
    ax.set_ylabel(objective)
    ax.set_title("best setting per method (± SE over seeds)")
    ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _heat(plt: Any, ranked: Sequence[Row], method: str, swept: list[str], objective: str, root: Path) -> Path | None:
    xs = sorted({r.params[swept[0]] for r in ranked if swept[0] in r.params})
    ys = sorted({r.params[swept[1]] for r in ranked if swept[1] in r.params})
    if len(xs) < 2 or len(ys) < 2:
        return None
    grid = [[math.nan] * len(xs) for _ in ys]
    for r in ranked:
        grid[ys.index(r.params[swept[1]])][xs.index(r.params[swept[0]])] = r.mean
    fig, ax = plt.subplots(figsize=(1.0 + 0.9 * len(xs), 1.0 + 0.7 * len(ys)))
    im = ax.imshow(grid, origin="lower", aspect="auto")
    ax.set_xticks(range(len(xs)), [str(x) for x in xs])
    ax.set_yticks(range(len(ys)), [str(y) for y in ys])
    ax.set_xlabel(swept[0])
    ax.set_ylabel(swept[1])
    ax.set_title(f"{method}: {objective}")
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    path = root / f"heat-{method}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
