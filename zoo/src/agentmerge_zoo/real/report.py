"""docs/real/results.md and results.json from the seeds' ``result.json`` files, for their lineup (the trained skills
in each ``result.json``'s ``config.recipes``; a lineup with the BFCL agent adds BFCL per category, ``report_bfcl``;
HumanEval pass@1 where the run scored it, ``report_humaneval``)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentmerge.api import dumps_json, kept_by_count
from agentmerge_zoo.real.aggregate import aggregate, has_scale, lineup, row_name
from agentmerge_zoo.real.report_bfcl import bfcl_differences, bfcl_table, whole_numbers
from agentmerge_zoo.real.report_humaneval import humaneval_lines, humaneval_numbers, humaneval_texts
from agentmerge_zoo.real.skill_bfcl import TEST_CATEGORIES
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
        for skill in lineup([s]):
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
        trained = lineup([s])
        for skill in trained:
            probe = s["check"]["probe"][skill]
            rows.append(
                [
                    str(s["seed"]),
                    skill,
                    f"{100 * probe['density']:.1f}",
                    _shares(probe["overlap"]),
                    _shares(probe["independent"]) if "independent" in probe else "-",
                    f"{float(probe['rho']):.2f}" if probe.get("rho") is not None else "-",
                    f"{probe['lambda']:.3f}" if probe.get("lambda") is not None else "-",
                    f"{kept_by_count(probe['overlap']):.2f} / {_ram_kept(s, trained.index(skill))}",
                    _paper(skill),
                ]
            )
    return table(header, rows)


def _paper(skill: str) -> str:
    """The paper's Figure 2 figures of the agent of ``skill`` ("-" for an agent the paper has not)."""
    if f"agent_{skill}" not in PAPER_FIG2:
        return "-"
    density, shares = PAPER_FIG2[f"agent_{skill}"]
    return f"{density}, {' / '.join(f'{w}' for w in shares)}"


def _ram_kept(seed: dict[str, Any], index: int) -> str:
    """What the seed's default RAM merge kept of its agent ``index`` (``bench.kept``), or "-" when not measured."""
    agents = seed["bench"].get("kept", {}).get("ram", {}).get("agents", [])  # in the lineup's order
    kept = agents[index]["kept"] if agents else None  # None: the agent updated nothing
    return "-" if kept is None else f"{kept:.2f}"


def _shares(values: Sequence[float]) -> str:
    return " / ".join(f"{100 * v:.1f}" for v in values)


def kept_table(tables: dict[str, dict[str, Any]], trained: Sequence[str] = TRAINED) -> list[str]:
    """The share of each agent's own-skill gain that each merge keeps, defaults and tuned."""
    header = ["merge", *(f"{k} gain kept %" for k in trained), "mean %"]
    rows = []
    for kind in ("defaults", "tuned"):
        for method, row in sorted(tables[kind].items(), key=lambda kv: -kv[1]["trained_avg"]["mean"]):
            if kind == "tuned" and not has_scale(method):
                continue  # its defaults row, listed above
            cells = [pct(row.get(f"{k}_kept"), 0) for k in trained]
            rows.append([row_name(method, kind), *cells, pct(row.get("gain_kept"), 0)])
    return table(header, rows)


def kept_note(seeds: Sequence[dict[str, Any]]) -> str:
    """Which seeds each skill's gain-kept column is over: those whose agent beat the base on that skill's test."""
    parts = []
    for skill in lineup(seeds):
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

    trained = lineup(seeds)
    fig, axes = plt.subplots(1, len(trained), figsize=(4 * len(trained), 3), squeeze=False)
    for ax, skill in zip(axes[0], trained, strict=True):
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


def method_table(
    rows: dict[str, dict[str, Any]],
    n_seeds: int,
    tuning: dict[str, Any] | None = None,
    trained: Sequence[str] = TRAINED,
) -> list[str]:
    """One row per method, best trained-skill mean first; a method benched in fewer seeds says how many."""
    header = ["method", *trained, "mean", "gain kept", *(f"{h} Δ" for h in HELD_OUT)]
    header += ["chosen scale"] if tuning is not None else []
    order = sorted(rows, key=lambda m: -rows[m]["trained_avg"]["mean"])
    out = []
    for method in order:
        row = rows[method]
        seeds = int(row["trained_avg"]["seeds"])
        name = method if seeds == n_seeds else f"{method} ({seeds} of {n_seeds} seeds)"
        cells = [name, *(pct(row.get(s)) for s in trained), pct(row["trained_avg"]), pct(row.get("gain_kept"), 0)]
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


def weight_kept_table(
    kept: dict[str, dict[str, Any]], order: Sequence[str], trained: Sequence[str] = TRAINED
) -> list[str]:
    """Per default merge (in ``order``, the defaults table's): what it kept of each agent's update, overall and
    per overlap region, and the share of its delta outside every agent's updates."""
    header = ["merge", *(f"{s}: kept (w.0 / w.1 / w.2)" for s in trained), "|Δ|² outside %"]
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
    trained = lineup(seeds)
    lines = ["# The real zoo: SmolLM2-135M-Instruct agents merged with every method", ""]
    lines += [f"Seeds {agg['seeds']}, made by `{command}` (see [README.md](README.md) for the setup and budget).", ""]
    lines += [] if trained == TRAINED else [f"Lineup: {', '.join(trained)} (one agent each), capitals held out.", ""]
    lines += ["## Agents", "", *agents_table(seeds), ""]
    lines += ["Reward curves: [curves.png](curves.png).", ""]
    lines += ["## Probe against the paper's Figure 2", "", *probe_table(seeds), ""]
    lines += ["## Defaults (strict % on test)", "", *method_table(agg["tables"]["defaults"], len(seeds), None, trained)]
    lines += ["", "## Tuned (output scale chosen on validation)", "", TUNED_NOTE, ""]
    tuning = _chosen(seeds, list(agg["tables"]["tuned"]))
    lines += [*method_table(agg["tables"]["tuned"], len(seeds), tuning, trained), ""]
    lines += ["## Paired differences (trained-skill mean, points)", "", *differences(agg), ""]
    lines += bfcl_section(seeds, agg) if "bfcl" in trained else []
    lines += whole_section(agg["bfcl_whole"]) if agg.get("bfcl_whole", {}).get("run") else []
    lines += humaneval_lines(agg.get("humaneval", {}), len(seeds), pct, table)
    lines += ["## Share of each agent's gain that the merge keeps", "", *kept_table(agg["tables"], trained), ""]
    lines += [kept_note(seeds), ""]
    order = sorted(agg["tables"]["defaults"], key=lambda m: -agg["tables"]["defaults"][m]["trained_avg"]["mean"])
    lines += ["## What each default merge kept of each agent's update (weight space)", "", KEPT_NOTE, ""]
    lines += [*weight_kept_table(agg.get("kept", {}), order, trained), ""]
    lines += ["## Failed", "", *failures(seeds), ""] if failures(seeds) else []
    lines += ["## Pairs", "", *_simple(agg["pairs"], trained), ""]
    lines += ["## Dilution (own skill)", "", *_simple(agg["dilution"], trained), ""]
    return "\n".join(lines)


BFCL_NOTE = (
    "Strict % on BFCL v4 non-live (AST), per category (n = {per} each) and overall, next to the other skills' "
    "test prompts: base and agents from the convergence check, merges from the bench (docs/real/bfcl.md)."
)


def bfcl_section(seeds: Sequence[dict[str, Any]], agg: dict[str, Any]) -> list[str]:
    """The "BFCL per category" section of a lineup with the BFCL agent (``report_bfcl``'s numbers)."""
    header, body = bfcl_table(seeds, agg)
    he = agg.get("humaneval", {})
    rows = [[name, *(pct(c) for c in cells)] for name, cells in body]
    if he.get("run"):  # HumanEval beside BFCL: every row on the subset, some on the full set ("-": not scored)
        header = [*header, f"HumanEval (first {he['subset']})", f"HumanEval (first {he['full']})"]
        rows = [[*row, *humaneval_texts(he, row[0], pct)] for row in rows]
    per = len(seeds[0]["check"]["base"]["bfcl"]["values"]) // len(TEST_CATEGORIES)
    lines = ["## BFCL per category (strict % on test)", "", BFCL_NOTE.format(per=per), ""]
    lines += [*table(["row", *header], rows), ""]
    lines += ["Paired differences on BFCL alone (points; one seed: over its prompts, else over seeds):", ""]
    diffs = [
        f"- {k}: {n} on BFCL = {100 * d['mean']:+.1f} ± {100 * d['se']:.1f}" for k, n, d in bfcl_differences(seeds, agg)
    ]
    return [*lines, *(diffs or ["(none)"]), ""]


WHOLE_NOTE = (
    "Strict % on BFCL v4 non-live, {per} items of each category (a fixed seeded subset, the same for every row): "
    "the base, the BFCL agent, each seed's top {top} methods by the bench's objective and RAM and RAM+, each at "
    "its better row (docs/real/bfcl.md). Top methods per seed: {tops}."
)


def whole_section(numbers: dict[str, Any]) -> list[str]:
    """The "BFCL whole test" section (``report_bfcl.whole_numbers``)."""
    per = numbers["n"] // len(TEST_CATEGORIES)
    tops = "; ".join(f"seed {k}: {', '.join(v) or '-'}" for k, v in numbers["top"].items())
    top = max((len(v) for v in numbers["top"].values()), default=0)
    lines = [f"## BFCL whole test (strict %, {per} per category)", "", WHOLE_NOTE.format(per=per, top=top, tops=tops)]
    body = [[name, *(pct(c) for c in r["cells"]), str(r["seeds"])] for name, r in numbers["rows"].items()]
    lines += ["", *table(["row", *TEST_CATEGORIES, "BFCL overall", "seeds"], body), ""]
    lines += ["Paired differences on the whole test (points; one seed: over its prompts, else over seeds):", ""]
    diffs = [f"- {k}: {100 * d['mean']:+.1f} ± {100 * d['se']:.1f}" for k, d in numbers["differences"].items()]
    failed = [f"- failed: {k}: {v}" for k, v in numbers["failed"].items()]
    return [*lines, *(diffs or ["(none)"]), *failed, ""]


def _simple(rows: dict[str, Any], trained: Sequence[str]) -> list[str]:
    skills = [*trained, *HELD_OUT]
    body = [[name, *(pct(r.get(s)) if r else "-" for s in skills)] for name, r in rows.items()]
    return table(["merge", *skills], body) if body else ["(none)"]


def write_results(
    work: Path, seeds: Sequence[int], docs: Path, command: str, expect: Sequence[str] | None = None
) -> tuple[Path, Path]:
    """Aggregate the finished seeds' results into ``docs/results.{json,md}``; with ``expect``, the seeds' lineup
    must be that one (``--lineup``: a report of the wrong zoo's work folder is refused before anything is written)."""
    from agentmerge import ConfigError

    results = [json.loads((work / f"seed{s}" / "result.json").read_text()) for s in seeds]
    if expect is not None and (found := lineup(results)) != tuple(expect):
        raise ConfigError(
            f"{work}: the seeds' agents are {', '.join(found)}, not {', '.join(expect)}: pass the matching --lineup"
        )
    agg = aggregate(results)
    agg["humaneval"] = humaneval_numbers(results, agg)
    agg["bfcl_whole"] = whole_numbers(results)
    docs.mkdir(parents=True, exist_ok=True)
    payload = {"command": command, "aggregate": agg, "seeds": [_slim(r) for r in results]}
    (docs / "results.json").write_text(dumps_json(payload, indent=1) + "\n")
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
