"""The regime map: per precision regime, how RAM and RAM+ fare against the best baseline and the specialists,
as a table, a one-line verdict per regime and a figure (``docs/regime-map.png``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from agentmerge_zoo.config import DOMAINS
from agentmerge_zoo.report_md import pm, table


def _num(x: Any) -> float:
    if x is None or x == "inf":
        return math.nan if x is None else math.inf
    return float(x)


def _pair(c: dict[str, Any]) -> tuple[float, float]:
    return _num(c["mean"]), _num(c["se"])


def cell(c: dict[str, Any] | None, digits: int = 1) -> str:
    return pm(c, 100.0, digits) if c else "n/a"


def is_fair(combined: dict[str, Any]) -> bool:
    """Whether some regime was benched under the fair protocol (defaults and tuned tables)."""
    return any("map_tuned" in res for res in combined["regimes"].values())


def map_rows(combined: dict[str, Any]) -> list[list[str]]:
    rows = []
    fair = is_fair(combined)
    for name, res in combined["regimes"].items():
        m = res.get("map", {})
        probe = res.get("probe", {}).get("agents", {})
        dens = " / ".join(f"{a['density']['mean'] * 100:.1f}" for a in probe.values())
        excess = " / ".join(f"{_num(e['mean']):.2f}" for e in m.get("overlap_excess", {}).values())
        spec = m.get("merge_minus_specialist", {})
        best_spec = " / ".join(cell(spec.get(d, {}).get("best_merge")) for d in DOMAINS)
        top_spec = " / ".join(
            f"{cell(spec.get(d, {}).get('best_on_domain_minus_specialist'))} ({spec.get(d, {}).get('best_on_domain')})"
            for d in DOMAINS
        )
        rows.append(
            [
                f"`{name}` ({len(res['seeds'])} seeds)",
                dens,
                excess,
                *(
                    _ram_cells(res)
                    if fair
                    else [f"{cell(m.get('ram_minus_best_baseline'))} (vs {m.get('best_baseline')})"]
                ),
                cell(m.get("ram_minus_linear")),
                cell(m.get("ram_plus_minus_ram"), 2),
                f"{best_spec} ({m.get('best_merge')})",
                top_spec,
            ]
        )
    return rows


def _ram_cells(res: dict[str, Any]) -> list[str]:
    """RAM − best baseline at defaults and tuned; a regime of the older protocol (only task arithmetic tuned) is
    neither, and says so."""
    m, t = res.get("map", {}), res.get("map_tuned")
    old = f"{cell(m.get('ram_minus_best_baseline'))} (vs {m.get('best_baseline')})"
    if not t:
        return ["n/a", f"{old}, older protocol: only task arithmetic tuned"]
    return [old, f"{cell(t.get('ram_minus_best_baseline'))} (vs {t.get('best_baseline')})"]


def regime_map_lines(combined: dict[str, Any], figure: str | None) -> list[str]:
    fair = is_fair(combined)
    header = [
        "regime",
        "density % (code / tool / memory)",
        "overlap excess: measured w.0 / independent w.0",
        "RAM − best baseline at defaults (pts)" if fair else "RAM − best baseline (pts)",
        *(["RAM − best baseline, tuned (pts)"] if fair else []),
        "RAM − linear (pts)",
        "RAM+ − RAM (pts)",
        "best merge − specialist, code / tool / memory (pts)",
        "best merge on that domain − specialist (pts)",
    ]
    lines = [
        "Per regime: paired (same-seed) differences of the agentic average, mean ± SE over seeds, in points. "
        "The best baseline is the non-RAM merge with the highest mean test agentic average (a choice that favours "
        "the baseline); the best merge is the same over every merge. The last column takes, per domain, the merge "
        "that scores highest on that domain (also selected on test: an upper bound for the synergy claim). "
        "Overlap excess below 1 means the agents update the same elements more often than independent masks "
        "would; 1 means independent."
        + (
            " At defaults every method runs as it comes; tuned, every method's output scale (RAM's included) is "
            "chosen on validation from one shared grid, and the other columns are the defaults'."
            if fair
            else ""
        ),
        "",
        *table(header, map_rows(combined)),
        "",
    ]
    lines += verdict_lines(combined)
    if figure:
        lines += [f"![regime map]({figure})", ""]
    return lines


def verdict(cell: dict[str, Any] | None) -> str:
    """'higher' / 'lower' when the paired mean is more than 2 SE away from 0, else 'no clear difference'."""
    if not cell:
        return "not measured"
    mean, se = _num(cell["mean"]), _num(cell["se"])
    if not math.isfinite(mean):
        return "not measured"
    if mean - 2 * se > 0:
        return f"higher by {mean * 100:.1f} ± {se * 100:.1f}"
    if mean + 2 * se < 0:
        return f"lower by {-mean * 100:.1f} ± {se * 100:.1f}"
    return f"no clear difference ({mean * 100:+.1f} ± {se * 100:.1f})"


def verdict_lines(combined: dict[str, Any]) -> list[str]:
    """Plain statements per regime (a difference counts when its paired mean is more than 2 SE from 0)."""
    lines = [
        "In words (a paired difference counts when it is more than 2 SE from zero; with 3 seeds, a rough rule):",
        "",
    ]
    for name, res in combined["regimes"].items():
        m = res.get("map", {})
        spec = m.get("merge_minus_specialist", {})
        beats = [
            f"{d} ({spec[d].get('best_on_domain')}: {verdict(spec[d].get('best_on_domain_minus_specialist'))})"
            for d in DOMAINS
            if d in spec
        ]
        lines.append(
            f"- `{name}`: RAM vs the best baseline ({m.get('best_baseline')}): "
            f"{verdict(m.get('ram_minus_best_baseline'))}; "
            f"RAM+ vs the best baseline: {verdict(m.get('ram_plus_minus_best_baseline'))}; "
            f"RAM+ vs RAM: {verdict(m.get('ram_plus_minus_ram'))}. "
            + _tuned_verdict(res)
            + "Best merge on each domain vs its specialist: "
            + "; ".join(beats)
            + "."
        )
    return [*lines, ""]


def _tuned_verdict(res: dict[str, Any]) -> str:
    """The tuned table's RAM and RAM+ against its best baseline (empty without a tuned table)."""
    t = res.get("map_tuned")
    if not t:
        return ""
    return (
        f"Tuned alike: RAM vs the best baseline ({t.get('best_baseline')}): {verdict(t.get('ram_minus_best_baseline'))}"
        f"; RAM+ vs the best baseline: {verdict(t.get('ram_plus_minus_best_baseline'))}. "
    )


def _map_points(combined: dict[str, Any]) -> list[tuple[str, float, dict[str, tuple[float, float]]]]:
    """Per regime: its name, mean overlap excess and the paired differences (mean, SE) the map plots."""
    points: list[tuple[str, float, dict[str, tuple[float, float]]]] = []
    for name, res in combined["regimes"].items():
        m = res.get("map", {})
        x = _num(m.get("overlap_excess_mean"))
        if not math.isfinite(x) or "ram_minus_best_baseline" not in m:
            continue
        ys: dict[str, tuple[float, float]] = {"RAM − best baseline": _pair(m["ram_minus_best_baseline"])}
        if res.get("map_tuned", {}).get("ram_minus_best_baseline"):
            ys["RAM − best baseline, tuned"] = _pair(res["map_tuned"]["ram_minus_best_baseline"])
        if m.get("ram_minus_linear"):
            ys["RAM − linear (averaging)"] = _pair(m["ram_minus_linear"])
        if m.get("ram_plus_minus_ram"):
            ys["RAM+ − RAM"] = _pair(m["ram_plus_minus_ram"])
        spec = [c for c in (m["merge_minus_specialist"][d].get("best_merge") for d in DOMAINS) if c]
        if spec:
            mean = sum(_num(c["mean"]) for c in spec) / len(spec)
            se = math.sqrt(sum(_num(c["se"]) ** 2 for c in spec)) / len(spec)
            ys["best merge − specialist (domain mean)"] = (mean, se)
        points.append((name, x, ys))
    return points


def plot_regime_map(combined: dict[str, Any], path: Path) -> Path | None:
    """x: mean overlap excess; y: RAM − best baseline, RAM+ − RAM, best merge − specialist (mean of domains)."""
    points = _map_points(combined)
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for label, marker in (
        ("RAM − best baseline", "o"),
        ("RAM − best baseline, tuned", "v"),
        ("RAM − linear (averaging)", "D"),
        ("RAM+ − RAM", "s"),
        ("best merge − specialist (domain mean)", "^"),
    ):
        rows = [(x, ys[label]) for _, x, ys in points if label in ys]
        if not rows:
            continue
        ax.errorbar(
            [r[0] for r in rows],
            [r[1][0] * 100 for r in rows],
            yerr=[r[1][1] * 100 for r in rows],
            fmt=marker,
            capsize=3,
            label=label,
        )
    for name, x, *_ in points:
        ax.annotate(name, (x, 0), textcoords="offset points", xytext=(3, -12), fontsize=8, rotation=20)
    ax.axhline(0, color="black", lw=0.8)
    ax.axvline(1, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("overlap excess: measured w.0 / independent-mask w.0 (mean of agents)")
    ax.set_ylabel("paired difference (pts)")
    ax.set_title("Where RAM wins: zoo precision regimes (mean ± SE over seeds)", fontsize=10)
    ax.text(
        0.01,
        0.01,
        "agentic average; merge − specialist: own-domain score, mean of the 3 domains",
        transform=ax.transAxes,
        fontsize=7,
        color="grey",
    )
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
