"""The many-agent study's tables and curves (docs/many/results.{md,json}, many-agents.png) from its seed records.

Retained gain of a merge of the agents of domains S (the curves' y axis):

    kept(m, S) = sum_{d in S} (score_m(d) - score_base(d)) / sum_{d in S} (score_agent_d(d) - score_base(d))

with score(d) the mean of domain d's metrics: the share of the specialists' summed gain over the base that the
merge keeps (1 = every specialist's gain, 0 = the base). A sum rather than a mean of per-domain ratios, so a
specialist with a small gain does not blow the ratio up. Per seed the subsets of one size are averaged; cells are
mean ± SE over seeds, and differences are paired (the same seed and subsets).

A study run under the fair protocol (``fair.py``: rows ``LABEL.tuned``) gets two views, **defaults** (every
method at its defaults, what a user gets out of the box) and **tuned** (every output scale chosen on validation,
per subset, from one grid); an older study has one view, as it ran.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentmerge.api import dumps_json
from agentmerge_zoo.fair import defaults_view, has_tuned, tuned_view
from agentmerge_zoo.report_md import pm, table
from agentmerge_zoo.results import Stat, domain_score, is_baseline, stat

CROWDING_KEYS = ("unique", "shared", "shared_independent", "conflict")
REFERENCES = ("ram", "task_arithmetic")


def gain_kept(rows: dict[str, dict[str, float]], domains: Sequence[str], label: str) -> float:
    """Share of the specialists' summed gain over the base that the merge ``label`` keeps."""
    base = rows["base"]
    num = sum(domain_score(rows[label], d) - domain_score(base, d) for d in domains)
    den = sum(domain_score(rows[f"agent_{d}"], d) - domain_score(base, d) for d in domains)
    return num / den if den > 0 else math.nan


def _sizes(records: Sequence[dict[str, Any]]) -> list[int]:
    return sorted({len(s["domains"]) for s in records[0]["subsets"].values()})


def _by_size(record: dict[str, Any], size: int) -> list[dict[str, Any]]:
    return [s for s in record["subsets"].values() if len(s["domains"]) == size]


def _methods(records: Sequence[dict[str, Any]]) -> list[str]:
    """Merge rows present in every subset of every seed, in plan order."""
    first = next(iter(records[0]["subsets"].values()))
    labels = [k for k in first["rows"] if k != "base" and not k.startswith("agent_")]
    return [m for m in labels if all(m in s["rows"] for r in records for s in r["subsets"].values())]


Value = Callable[[dict[str, Any]], float]  # one subset's record -> a number
Records = list[dict[str, Any]]


def _seed_mean(record: dict[str, Any], size: int, value: Value) -> float:
    values = [float(value(s)) for s in _by_size(record, size)]
    return sum(values) / len(values)


def _at(*keys: str) -> Value:
    """The number at ``subset[k0][k1]...`` of a subset's record."""

    def value(subset: dict[str, Any]) -> float:
        node: Any = subset
        for key in keys:
            node = node[key]
        return float(node)

    return value


def _curve(records: Sequence[dict[str, Any]], sizes: list[int], value: Value) -> dict[str, Stat]:
    return {str(n): stat([_seed_mean(r, n, value) for r in records]) for n in sizes}


def aggregate_many(records: Sequence[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """Per view (module docstring): the retained gain per method and the paired differences, against N; the
    crowding, the values chosen on validation and the specialists."""
    sizes = _sizes(records)
    out: dict[str, Any] = {"meta": meta, "seeds": [r["seed"] for r in records], "sizes": sizes}
    out["subsets"] = {str(n): [s["domains"] for s in _by_size(records[0], n)] for n in sizes}
    if has_tuned([s for r in records for s in r["subsets"].values()]):
        views = {"defaults": _view(records, defaults_view), "tuned": _view(records, tuned_view)}
    else:
        views = {"as run": list(records)}
    out["views"] = {name: _curves(view, sizes) for name, view in views.items()}
    out["crowding"] = {k: _curve(records, sizes, _at("crowding", k)) for k in CROWDING_KEYS}
    out["chosen"] = _chosen(records, sizes)
    out["specialists"] = _specialists(records)
    return out


def _view(records: Sequence[dict[str, Any]], view: Callable[[Records], Records]) -> Records:
    """The seed records with every subset's rows seen through ``view`` (``fair.defaults_view`` / ``tuned_view``)."""
    out = []
    for record in records:
        names, subs = list(record["subsets"]), list(record["subsets"].values())
        out.append({**record, "subsets": dict(zip(names, view(subs), strict=True))})
    return out


def _curves(records: Sequence[dict[str, Any]], sizes: list[int]) -> dict[str, Any]:
    """The retained gain of each method, and its paired difference from each reference method, against N."""
    methods = _methods(records)

    curves: dict[str, Any] = {"kept": {m: _curve(records, sizes, _kept(m)) for m in methods}}
    curves["minus"] = {
        ref: {m: _curve(records, sizes, _minus(m, ref)) for m in methods if m != ref}
        for ref in REFERENCES
        if ref in methods
    }
    curves["best"] = _best_baseline(records, sizes, methods, curves["kept"])
    return curves


def _best_baseline(
    records: Sequence[dict[str, Any]], sizes: list[int], methods: list[str], kept: dict[str, dict[str, Stat]]
) -> dict[str, Any]:
    """Per N, the baseline (not RAM, RAM+, RAM-TIES or a RAM variant) with the highest mean retained gain over
    seeds (chosen on test, as the bench's best baseline), and each RAM-family row's paired difference from it."""
    baselines = [m for m in methods if is_baseline(m)]
    rams = [m for m in methods if not is_baseline(m)]
    out: dict[str, Any] = {"label": {}, "minus": {m: {} for m in rams}}
    for n in sizes:
        finite = [m for m in baselines if math.isfinite(kept[m][str(n)]["mean"])]
        if not finite:
            continue
        best = max(finite, key=lambda m: kept[m][str(n)]["mean"])
        out["label"][str(n)] = best
        for m in rams:
            out["minus"][m][str(n)] = stat([_seed_mean(r, n, _minus(m, best)) for r in records])
    return out


def _kept(label: str) -> Value:
    return lambda s: gain_kept(s["rows"], s["domains"], label)


def _minus(label: str, ref: str) -> Value:
    """A subset's retained gain of ``label`` minus that of ``ref`` (a paired difference)."""
    return lambda s: gain_kept(s["rows"], s["domains"], label) - gain_kept(s["rows"], s["domains"], ref)


def _chosen(records: Sequence[dict[str, Any]], sizes: list[int]) -> dict[str, dict[str, Stat]]:
    """The output scale chosen on validation, averaged over a size's subsets (``best``; task arithmetic's
    ``best_lambda`` in older results, as ``fair.chosen_scale`` reads it)."""
    out: dict[str, dict[str, Stat]] = {}
    first = next(iter(records[0]["subsets"].values()))
    for label, chosen in first["val"].items():
        key = "best" if "best" in chosen else "best_lambda"
        if key in chosen:
            out[label] = _curve(records, sizes, _at("val", label, key))
    return out


def _specialists(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Stat]]:
    """Each specialist's own-domain score and its gain over the base (domain means, over seeds)."""
    domains = [k.removeprefix("agent_") for k in records[0]["zoo"] if k.startswith("agent_")]
    out = {}
    for d in domains:
        own = [domain_score(r["zoo"][f"agent_{d}"], d) for r in records]
        base = [domain_score(r["zoo"]["base"], d) for r in records]
        out[d] = {"base": stat(base), "agent": stat(own), "gain": stat([a - b for a, b in zip(own, base, strict=True)])}
    return out


# ----------------------------------------------------------------------------------------------------- markdown


def render_many(res: dict[str, Any], figure: str | None) -> str:
    sizes = [str(n) for n in res["sizes"]]
    cols = [f"N = {n}" for n in sizes]
    meta = res["meta"]
    counts = ", ".join(sizes[:-1]) + f" and {sizes[-1]}" if len(sizes) > 1 else sizes[0]
    lines = [
        f"# Many-agent study: merges of {counts} agents",
        "",
        "Generated by `agentmerge zoo many`; do not edit by hand. The six-domain zoo of [zoo.md](../zoo.md) (code,",
        f"tool, memory, math, sort, search; regime `{meta['regime']}`), seeds {', '.join(map(str, res['seeds']))}. "
        "Each cell is mean ± SE over seeds of the average over a size's subsets.",
        "",
        f"Command: `{meta['command']}`",
        "",
        *(_steps_lines(meta["steps"], meta["regime"]) if meta.get("steps") else []),
        "## The specialists",
        "",
        *table(
            ["domain", "base (%)", "specialist (%)", "gain (pts)"],
            [[d, pm(e["base"]), pm(e["agent"]), pm(e["gain"])] for d, e in res["specialists"].items()],
        ),
        "",
    ]
    for name, curves in res["views"].items():
        lines += _view_lines(name, curves, sizes, cols, len(res["views"]) > 1)
    lines += ["## Crowding of the masks, against N", "", *_crowding_lines(res, sizes, cols)]
    if res["chosen"]:
        lines += ["## Values chosen on validation", ""]
        rows = [[label, *[pm(c[n], 1.0, 2) for n in sizes]] for label, c in res["chosen"].items()]
        lines += [*table(["tuned (λ or scale)", *cols], rows), ""]
    lines += ["## Subsets", ""]
    lines += [f"- N = {n}: " + ", ".join("+".join(s) for s in res["subsets"][n]) for n in sizes]
    if figure:
        lines += ["", f"![many-agent curves]({figure})"]
    return "\n".join(lines) + "\n"


def _steps_lines(steps: dict[str, int], regime: str) -> list[str]:
    """The agents' RL steps (the recipe's, or what the convergence loop settled on) and where the loop's check
    table per agent is."""
    text = "Agents' RL steps: " + ", ".join(f"{d} {n}" for d, n in steps.items()) + "."
    text += f" The convergence check of every agent at these steps: `docs/convergence/six-{regime}.md` (`zoo check"
    text += " --suite six --rounds 3`, written by `scripts/zoo_fair_run.sh`)."
    return [text, ""]


VIEW_TEXT = {
    "defaults": "Every method at its defaults (task arithmetic λ 1, RAM scale 1): what a user gets out of the box.",
    "tuned": "Every method with an output scale (task arithmetic, TIES λ; TSV-M, Iso-C α; RAM, RAM+ scale) at the "
    "value chosen on validation for each subset, from one grid by one rule (`fair.py`); a method without one "
    "(linear, RAM-TIES) and the RAM variant keep their defaults.",
}


def _view_lines(name: str, curves: dict[str, Any], sizes: list[str], cols: list[str], titled: bool) -> list[str]:
    """The retained-gain table of one view and its paired differences."""
    title = "## Share of the specialists' gain kept, against N" + (f": {name}" if titled else "")
    lines = [title, ""]
    lines += [VIEW_TEXT[name], ""] if name in VIEW_TEXT else []
    lines += ["kept = Σ_d (merge − base) / Σ_d (specialist − base) over the merged agents' domains, in percent.", ""]
    lines += table(["method", *cols], [[m, *[pm(c[n]) for n in sizes]] for m, c in curves["kept"].items()])
    lines.append("")
    lines += _best_lines(curves.get("best", {}), sizes, cols, f", {name}" if titled else "")
    for ref, entries in curves["minus"].items():
        lines += [f"### Paired differences from `{ref}` (points of gain kept{f', {name}' if titled else ''})", ""]
        lines += table(["method", *cols], [[m, *[pm(c[n]) for n in sizes]] for m, c in entries.items()])
        lines.append("")
    return lines


def _best_lines(best: dict[str, Any], sizes: list[str], cols: list[str], suffix: str) -> list[str]:
    """RAM's rows against the best baseline of each N (paired, points of gain kept)."""
    if not best.get("label"):
        return []
    lines = [f"### RAM against the best baseline of each N (points of gain kept{suffix})", ""]
    rows = [["best baseline", *[f"`{best['label'].get(n, 'n/a')}`" for n in sizes]]]
    rows += [[f"{m} − best", *[pm(c[n]) if n in c else "n/a" for n in sizes]] for m, c in best["minus"].items()]
    return [*lines, *table(["", *cols], rows), ""]


def _crowding_lines(res: dict[str, Any], sizes: list[str], cols: list[str]) -> list[str]:
    names = {
        "unique": "unique (one agent moved it), % of elements",
        "shared": "shared (2+ agents), % of elements",
        "shared_independent": "shared if masks were independent, %",
        "conflict": "sign conflict, % of the shared region",
    }
    rows = [[names[k], *[pm(res["crowding"][k][n]) for n in sizes]] for k in CROWDING_KEYS]
    text = (
        "RAM's mask |τ| > 1e-5. RAM divides each agent's update in the shared region by the overlap count; "
        "in a sign conflict a plain mean cancels updates (what `shared: elect` avoids)."
    )
    return [text, "", *table(["share", *cols], rows), ""]


def plot_many(res: dict[str, Any], path: Path) -> None:
    """Retained gain per method against N, a panel per view, and the crowding shares (last panel)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [str(n) for n in res["sizes"]]
    xs = [int(n) for n in sizes]
    views = res["views"]
    fig, axes = plt.subplots(1, len(views) + 1, figsize=(5.5 * (len(views) + 1), 4.2))
    for ax, (name, curves) in zip(axes, views.items(), strict=False):
        for method, curve in curves["kept"].items():
            ys = [100 * curve[n]["mean"] for n in sizes]
            es = [100 * curve[n]["se"] for n in sizes]
            ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=method)
        ax.set(xlabel="agents merged (N)", ylabel="specialists' gain kept (%)", xticks=xs, title=name)
        ax.axhline(100, color="grey", lw=0.8, ls=":")
        ax.legend(fontsize=7)
    right = axes[-1]
    for key in CROWDING_KEYS:
        curve = res["crowding"][key]
        right.plot(xs, [100 * curve[n]["mean"] for n in sizes], marker="o", label=key)
    right.set(xlabel="agents merged (N)", ylabel="%", xticks=xs, title="mask crowding")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_many(res: dict[str, Any], docs: Path) -> tuple[Path, Path]:
    """results.json, many-agents.png and results.md under ``docs``."""
    docs.mkdir(parents=True, exist_ok=True)
    json_path, md_path, png = docs / "results.json", docs / "results.md", docs / "many-agents.png"
    json_path.write_text(dumps_json(res, indent=1) + "\n")
    plot_many(res, png)
    md_path.write_text(render_many(res, png.name))
    return json_path, md_path
