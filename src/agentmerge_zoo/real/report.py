"""docs/real/results.md and results.json from the seeds' ``result.json`` files."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentmerge.io import jsontext
from agentmerge.methods.deltas import kept_by_count
from agentmerge_zoo.real.aggregate import aggregate, has_scale, row_name
from agentmerge_zoo.real.suite import HELD_OUT, TRAINED
from agentmerge_zoo.regime_report import PAPER_FIG2
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


def probe_table(seeds: Sequence[dict[str, Any]]) -> list[str]:
    """Per seed and agent: density, w.0 / w.1 / w.2 (the share of its updated elements that 0, 1, 2 other agents
    also updated) measured and under independent masks, RAM+'s rho and lambda, what RAM keeps of the agent counted
    by element (``kept_by_count``) and measured on the bench's RAM merge, next to the paper's Figure 2."""
    header = ["seed", "agent", "density %", "w.0 / w.1 / w.2 % measured", "independent masks", "rho", "RAM+ lambda"]
    header += ["RAM keeps: by count / measured", "paper Fig. 2: density %, w.0 / w.1 / w.2 %"]
    rows = []
    for s in seeds:
        for skill in TRAINED:
            probe = s["check"]["probe"][skill]
            paper_d, paper_w = PAPER_FIG2[f"agent_{skill}"]
            rows.append(
                [
                    str(s["seed"]),
                    skill,
                    f"{100 * probe['density']:.1f}",
                    _shares(probe["overlap"]),
                    _shares(probe["independent"]) if "independent" in probe else "-",
                    f"{float(probe['rho']):.2f}" if probe.get("rho") is not None else "-",  # null: no unique part
                    f"{probe['lambda']:.3f}" if "lambda" in probe else "-",
                    f"{kept_by_count(probe['overlap']):.2f} / {_ram_kept(s, skill)}",
                    f"{paper_d}, {' / '.join(f'{w}' for w in paper_w)}",
                ]
            )
    return table(header, rows)


def _ram_kept(seed: dict[str, Any], skill: str) -> str:
    """What the seed's default RAM merge kept of the skill's agent (``bench.kept``), or "-" when not measured."""
    agents = seed["bench"].get("kept", {}).get("ram", {}).get("agents", [])  # in TRAINED's order
    return f"{agents[TRAINED.index(skill)]['kept']:.2f}" if agents else "-"


def _shares(values: Sequence[float]) -> str:
    return " / ".join(f"{100 * v:.1f}" for v in values)


def kept_table(tables: dict[str, dict[str, Any]]) -> list[str]:
    """The share of each agent's own-skill gain that each merge keeps, defaults and tuned."""
    header = ["merge", *(f"{k} gain kept %" for k in TRAINED), "mean %"]
    rows = []
    for kind in ("defaults", "tuned"):
        for method, row in sorted(tables[kind].items(), key=lambda kv: -kv[1]["trained_avg"]["mean"]):
            if kind == "tuned" and not has_scale(method):
                continue  # its defaults row, listed above
            cells = [pct(row.get(f"{k}_kept"), 0) for k in TRAINED]
            rows.append([row_name(method, kind), *cells, pct(row.get("gain_kept"), 0)])
    return table(header, rows)


def kept_note(seeds: Sequence[dict[str, Any]]) -> str:
    """Which seeds each skill's gain-kept column is over: those whose agent beat the base on that skill's test."""
    parts = []
    for skill in TRAINED:
        beat = [
            str(s["seed"])
            for s in seeds
            if s["check"]["agents"][skill][skill]["strict"] > s["check"]["base"][skill]["strict"]
        ]
        parts.append(f"{skill} {', '.join(beat) or 'none'}")
    return (
        "A skill's column is over the seeds whose agent beat the base on that skill's test prompts (a share of a "
        "gain ≤ 0 has no meaning), ± SE only where two or more are: " + "; ".join(parts) + "."
    )


def differences(agg: dict[str, Any]) -> list[str]:
    """The paired differences as lines, each naming the view and the methods."""
    lines = []
    for kind, diffs in agg["differences"].items():
        tied = f" (tied with {', '.join(diffs['tied'])})" if diffs.get("tied") else ""
        best, baseline = diffs.get("best"), diffs.get("best_baseline")
        lines.append(f"- {kind}: best method {best}{tied}, best baseline (not RAM) {baseline}")
        for name, d in diffs.items():
            if name not in ("best_baseline", "best", "tied") and d:
                prompts = f" over seeds (± {100 * d['prompt_se']:.1f} over prompts)" if "prompt_se" in d else ""
                lines.append(f"- {kind}: {name} = {100 * d['mean']:+.1f} ± {100 * d['se']:.1f}{prompts}")
    return lines


def plot_curves(seeds: Sequence[dict[str, Any]], path: Path) -> Path | None:
    """Each agent's GRPO reward per step (moving mean over 5 steps), one panel per skill; None without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(TRAINED), figsize=(4 * len(TRAINED), 3), squeeze=False)
    for ax, skill in zip(axes[0], TRAINED, strict=True):
        for s in seeds:
            rewards = [float(r["reward"]) for r in s["curves"][skill]]
            windows = [rewards[max(0, i - 4) : i + 1] for i in range(len(rewards))]
            smooth = [sum(w) / len(w) for w in windows]
            ax.plot(range(1, len(rewards) + 1), smooth, label=f"seed {s['seed']}")
        ax.set_title(f"{skill} agent")
        ax.set_xlabel("GRPO step")
        ax.set_ylabel("training reward (moving mean of 5)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _verdict(conv: dict[str, Any]) -> str:
    if "converged" not in conv:
        return "-"
    word = "yes" if conv["converged"] else "**no**"
    return f"{word} ({100 * conv['gain_1.5']:+.1f} vs 2 SE {100 * conv['two_se']:.1f})"


def method_table(rows: dict[str, dict[str, Any]], n_seeds: int, tuning: dict[str, Any] | None = None) -> list[str]:
    """One row per method, best trained-skill mean first; a method benched in fewer seeds says how many."""
    header = ["method", *TRAINED, "mean", "gain kept", *(f"{h} Δ" for h in HELD_OUT)]
    header += ["chosen scale"] if tuning is not None else []
    order = sorted(rows, key=lambda m: -rows[m]["trained_avg"]["mean"])
    out = []
    for method in order:
        row = rows[method]
        seeds = int(row["trained_avg"]["seeds"])
        name = method if seeds == n_seeds else f"{method} ({seeds} of {n_seeds} seeds)"
        cells = [name, *(pct(row.get(s)) for s in TRAINED), pct(row["trained_avg"]), pct(row.get("gain_kept"), 0)]
        cells += [pct(row.get(f"{h}_delta")) for h in HELD_OUT]
        if tuning is not None:
            cells.append(tuning.get(method, "-"))
        out.append(cells)
    return table(header, out)


TUNED_NOTE = (
    "Each method with an output scale at the value chosen on validation (per seed); a method without one has "
    "nothing to tune and stands here at its defaults, so the best method is chosen among all of them."
)

KEPT_NOTE = (
    "kept = <Δ, τ_i> / <τ_i, τ_i> over the elements agent i updated (Δ = merge − base, τ_i = agent − base): 1 "
    "carries the agent's update whole, 1/3 averages it with two unrelated ones, 0 drops it; w.k over the elements "
    "it updated with exactly k other agents (`agentmerge probe --merged`); mean over seeds."
)


def weight_kept_table(kept: dict[str, dict[str, Any]], order: Sequence[str]) -> list[str]:
    """Per default merge (in ``order``, the defaults table's): what it kept of each agent's update, overall and
    per overlap region, and the share of its delta outside every agent's updates."""
    header = ["merge", *(f"{s}: kept (w.0 / w.1 / w.2)" for s in TRAINED), "|Δ|² outside %"]
    rows = []
    for method in [m for m in order if m in kept]:
        row = kept[method]
        cells = [f"{a['kept']:.2f} ({' / '.join(_two(x) for x in a['by_region'])})" for a in row["agents"].values()]
        rows.append([method, *cells, f"{100 * row['outside']:.1f}"])
    return table(header, rows) if rows else ["(not measured)"]


def _two(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.2f}"


def failures(seeds: Sequence[dict[str, Any]]) -> list[str]:
    """One line per failed trial or measurement of any seed (none: no line)."""
    return [f"- seed {s['seed']}: {name}: {why}" for s in seeds for name, why in s["bench"]["failed"].items()]


def _chosen(seeds: Sequence[dict[str, Any]], methods: Sequence[str]) -> dict[str, str]:
    """Each tuned method's chosen scale per seed; a method without an output scale says it runs at defaults."""
    chosen: dict[str, list[str]] = {}
    for s in seeds:
        for method, t in s["bench"]["tuning"].items():
            chosen.setdefault(method, []).append(f"{t['param']}={t['value']}")
    fixed = {m: "no output scale: its defaults" for m in methods if not has_scale(m)}
    return fixed | {m: ", ".join(v) for m, v in chosen.items()}


def render(seeds: Sequence[dict[str, Any]], agg: dict[str, Any], command: str) -> str:
    lines = ["# The real zoo: SmolLM2-135M-Instruct agents merged with every method", ""]
    lines += [f"Seeds {agg['seeds']}, made by `{command}` (see [README.md](README.md) for the setup and budget).", ""]
    lines += ["## Agents", "", *agents_table(seeds), ""]
    lines += ["Reward curves: [curves.png](curves.png).", ""]
    lines += ["## Probe against the paper's Figure 2", "", *probe_table(seeds), ""]
    lines += ["## Defaults (strict % on test)", "", *method_table(agg["tables"]["defaults"], len(seeds)), ""]
    lines += ["## Tuned (output scale chosen on validation)", "", TUNED_NOTE, ""]
    lines += [*method_table(agg["tables"]["tuned"], len(seeds), _chosen(seeds, list(agg["tables"]["tuned"]))), ""]
    lines += ["## Paired differences (trained-skill mean, points)", "", *differences(agg), ""]
    lines += ["## Share of each agent's gain that the merge keeps", "", *kept_table(agg["tables"]), ""]
    lines += [kept_note(seeds), ""]
    order = sorted(agg["tables"]["defaults"], key=lambda m: -agg["tables"]["defaults"][m]["trained_avg"]["mean"])
    lines += ["## What each default merge kept of each agent's update (weight space)", "", KEPT_NOTE, ""]
    lines += [*weight_kept_table(agg.get("kept", {}), order), ""]
    lines += ["## Failed", "", *failures(seeds), ""] if failures(seeds) else []
    lines += [
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
    (docs / "results.json").write_text(jsontext.dumps(payload, indent=1) + "\n")
    (docs / "results.md").write_text(render(results, agg, command) + "\n")
    plot_curves(results, docs / "curves.png")
    return docs / "results.json", docs / "results.md"


def _slim(result: dict[str, Any]) -> dict[str, Any]:
    """A seed's result without the per-prompt score lists (they stay in WORK)."""

    def strip(report: Any) -> Any:
        if isinstance(report, dict):
            return {k: strip(v) for k, v in report.items() if k != "values"}
        return report

    return strip(result)  # type: ignore[no-any-return]
