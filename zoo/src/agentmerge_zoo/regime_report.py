"""The combined results page over precision regimes: the regime map, then every regime's tables.

``docs/results.json`` holds ``{"regimes": {name: aggregate}}`` (each aggregate as ``results.aggregate`` makes
it, with its own command, seeds and timing); ``docs/results.md`` is rendered from it, and ``docs/regime-map.png``
plots the map. A regime that has not been run yet is simply absent; one run on fewer seeds says so.
The map itself (table, verdicts, figure) is drawn by ``regime_map``; a fair bench (``fair.py``) adds the tuned
table next to the defaults one and RAM − best baseline under both.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from agentmerge.api import dumps_json
from agentmerge_zoo.config import DOMAINS, REGIMES
from agentmerge_zoo.converge_report import check_lines
from agentmerge_zoo.fair import TUNED, chosen_scale, is_tuned, read_key
from agentmerge_zoo.regime_map import cell, is_fair, plot_regime_map, regime_map_lines
from agentmerge_zoo.report_md import (
    comparison_lines,
    dilution_table,
    gains_table,
    main_table,
    pm,
    probe_figure,
    probe_table,
    retention_table,
    table,
)
from agentmerge_zoo.results import is_ablation, is_variant, jsonable

FULL_SEEDS = 3
RESUME_COMMAND = "PYTHONPATH=src nohup nice -n 10 bash scripts/zoo_full_run.sh > full-run.log 2>&1 &"
FAIR_RESUME_COMMAND = "PYTHONPATH=src nohup nice -n 10 bash scripts/zoo_fair_run.sh > fair-run.log 2>&1 &"

# The paper's Figure 2 (Qwen2.5-7B agents): density and w.0 / w.1 / w.2 in percent.
PAPER_FIG2 = {
    "agent_code": (3.2, (6.3, 49.1, 44.6)),
    "agent_tool": (46.2, (40.8, 56.1, 3.1)),
    "agent_memory": (54.3, (47.5, 49.9, 2.6)),
}


def load_combined(docs: Path) -> dict[str, Any]:
    """The existing combined results (regimes run before are kept), or an empty one."""
    path = docs / "results.json"
    if path.is_file():
        data: dict[str, Any] = _restore(json.loads(path.read_text()))
        if "regimes" in data:
            return data
    return {"regimes": {}}


def _restore(value: Any) -> Any:
    """Undo ``jsonable``: "inf" / "-inf" back to floats, None back to NaN."""
    if value is None:
        return math.nan
    if value in ("inf", "-inf"):
        return math.inf if value == "inf" else -math.inf
    if isinstance(value, dict):
        return {k: _restore(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_restore(v) for v in value]
    return value


def write_combined(combined: dict[str, Any], docs: Path) -> tuple[Path, Path]:
    """Write results.json, results.md and the regime-map figure into ``docs``."""
    docs.mkdir(parents=True, exist_ok=True)
    json_path, md_path = docs / "results.json", docs / "results.md"
    ordered = {k: combined["regimes"][k] for k in REGIMES if k in combined["regimes"]}
    combined = {**combined, "regimes": ordered}
    json_path.write_text(dumps_json(jsonable(combined), indent=1) + "\n")
    figure = plot_regime_map(combined, docs / "regime-map.png")
    md_path.write_text(render_combined(combined, figure.name if figure else None))
    return json_path, md_path


def render_combined_from_json(docs: Path) -> Path:
    combined = load_combined(docs)
    figure = plot_regime_map(combined, docs / "regime-map.png")
    md_path = docs / "results.md"
    md_path.write_text(render_combined(combined, figure.name if figure else None))
    return md_path


def probe_vs_paper(res: dict[str, Any]) -> list[str]:
    rows = []
    for label, a in res.get("probe", {}).get("agents", {}).items():
        paper_d, paper_o = PAPER_FIG2[label]
        meas = " / ".join(f"{c['mean'] * 100:.1f}" for c in a["overlap"])
        ind = " / ".join(f"{c['mean'] * 100:.1f}" for c in a["independent"])
        drift = f"{a['drift']['mean']:.2e}" if "drift" in a else "n/a"
        paper = f"{paper_d:.1f} | {' / '.join(f'{v:.1f}' for v in paper_o)}"
        rows.append([label, pm(a["density"]), drift, meas, ind, paper])
    header = [
        "agent",
        "density %",
        "drift (mean abs τ)",
        "w.0 / w.1 / w.2 % measured",
        "independent masks",
        "paper Fig. 2: density % | w.0 / w.1 / w.2 %",
    ]
    return table(header, rows)


def magnitude_lines(res: dict[str, Any]) -> list[str]:
    mag = res.get("probe", {}).get("magnitude")
    if not mag:
        return []
    rows = []
    for q in mag:
        cells = [f"{q['quartile']} ({q['mean_abs_w0']['mean']:.3g})"]
        for a in q["agents"]:
            cells.append(f"{cell(a['density'])} | {cell(a['w0'])} | {cell(a['w0_independent'])}")
        rows.append(cells)
    labels = [a["agent"] for a in mag[0]["agents"]]
    header = ["|w0| quartile (mean abs w0)", *[f"{x}: density | w.0 | w.0 indep." for x in labels]]
    return [
        "Per tensor, elements split into quartiles of the base weight's magnitude; independent w.0 uses the "
        "densities of the same tensor-quartile, so a gap that closes within quartiles is explained by |w0|.",
        "",
        *table(header, rows),
        "",
    ]


def ablation_lines(res: dict[str, Any]) -> list[str]:
    abl = res.get("ablation") or {}
    if not abl:
        return []
    rows = [
        [label, cell(e["agentic_avg"]), cell(e["minus_ram"], 2), *[cell(e[d]) for d in DOMAINS]]
        for label, e in abl.items()
    ]
    header = ["RAM+ setting", "agentic avg", "− RAM (paired, pts)", *[f"{d} (domain avg)" for d in DOMAINS]]
    return [
        "Paper form λᵢ = 1 + r·clip(ρᵢ, 0, α) over r and α; `authors_R1.2` is the released code's "
        "1 + (R − 1)·min(ρ, 1) with R = 1.2 (equal to r = 0.2, α = 1).",
        "",
        *table(header, rows),
        "",
    ]


def variant_lines(res: dict[str, Any]) -> list[str]:
    """The RAM variants against RAM, RAM+ and the best baseline (paired by seed, points)."""
    variants = res.get("variants") or {}
    if not variants:
        return []
    refs = list(next(iter(variants.values()))["minus"])
    rows = [
        [
            f"`{label}`",
            cell(e["agentic_avg"]),
            *[cell(e["minus"][ref]) for ref in refs],
            *[cell(e[d]) for d in DOMAINS],
        ]
        for label, e in variants.items()
    ]
    header = ["variant", "agentic avg", *[f"− {ref} (pts)" for ref in refs], *[f"{d} (domain avg)" for d in DOMAINS]]
    return [
        'Each variant of docs/methods.md ("RAM variants") as a 3-agent merge; paired (same-seed) differences of the '
        "agentic average. A difference counts when it is more than 2 SE from zero.",
        "",
        *table(header, rows),
        "",
        *_chosen_lines(variants),
    ]


def _chosen_lines(variants: dict[str, Any]) -> list[str]:
    """The values tuned variants chose on validation, per seed."""
    chosen = [
        f"`{label}` " + ", ".join(f"{v:g}" for v in e["chosen"])
        for label, e in variants.items()
        if e.get("chosen") and all(isinstance(v, float) and math.isfinite(v) for v in e["chosen"])
    ]
    return [f"- chosen on validation, per seed: {'; '.join(chosen)}.", ""] if chosen else []


def pairs_lines(res: dict[str, Any]) -> list[str]:
    pairs = res.get("pairs") or {}
    lines: list[str] = []
    for pair, entry in pairs.items():
        domains = entry["domains"]
        rows = [
            [label, *[cell(cells[d]) for d in domains], cell(cells["avg"])] for label, cells in entry["rows"].items()
        ]
        lams = ", ".join(f"{v:g}" for v in read_key(entry, "ta_scale", []) if isinstance(v, float) and math.isfinite(v))
        lines += [f"**{pair}** (task arithmetic λ per seed: {lams})", ""]
        lines += table(["model", *[f"{d} (domain avg)" for d in domains], "pair avg (its metric columns)"], rows)
        diffs = "; ".join(f"{k}: {cell(v)}" for k, v in entry["diffs"].items())
        lines += ["", f"Paired differences of the pair average (pts): {diffs}.", ""]
    return lines


def tuned_rows(res: dict[str, Any]) -> dict[str, Any]:
    """The tuned table: every non-ablation, non-variant row, its tuned cells where it has them, labelled with the
    values chosen on validation per seed."""
    rows: dict[str, Any] = {}
    choice = res.get("tuned_choice", {})
    for label, cells in res["rows"].items():
        if is_ablation(label) or is_variant(label) or is_tuned(label):
            continue
        if label + TUNED not in res["rows"]:
            rows[label] = cells
            continue
        c = choice.get(label, {})
        values = ", ".join(f"{v:g}" for v in c.get("values", []) if isinstance(v, float) and math.isfinite(v))
        rows[f"{label} ({c.get('param')} {values})"] = res["rows"][label + TUNED]
    return rows


def main_tables(res: dict[str, Any]) -> list[str]:
    """One main table, or under the fair protocol two: every method at its defaults, and tuned."""
    main = {**res, "rows": {k: v for k, v in res["rows"].items() if not is_ablation(k) and not is_tuned(k)}}
    if "map_tuned" not in res:
        return ["### Main table (3 agents)", "", *main_table(main), "", *comparison_lines(main), ""]
    tuned = {**res, "rows": tuned_rows(res), "comparisons": res.get("comparisons_tuned", [])}
    return [
        "### Main table at defaults (3 agents)",
        "",
        "Every method at its defaults (the bench's own parameters; task arithmetic at λ 1): what a user gets out "
        "of the box.",
        "",
        *main_table(main),
        "",
        *comparison_lines(main),
        "",
        "### Main table tuned (3 agents)",
        "",
        "Every method with an output scale (`Method.output_scale`) has it chosen on validation from one shared "
        "grid by one rule (the highest validation agentic average; a tie goes to the value nearest 1); the values "
        "chosen per seed follow the label. A method without an output scale is its defaults row.",
        "",
        *main_table(tuned),
        "",
        *comparison_lines(tuned),
        "",
    ]


def regime_section(name: str, res: dict[str, Any]) -> list[str]:
    retention = {**res, "retention": {k: v for k, v in res["retention"].items() if not is_ablation(k)}}
    recipes = res["config"]["recipes"]
    recipe_rows = [
        [r["domain"], r["storage"], r["export"], f"{r['lr']:g}", str(r["steps"]), str(r["prompts_per_step"])]
        for r in recipes
    ]
    lines = [
        f"## Regime `{name}`",
        "",
        f"{REGIMES[name]}.",
        "",
        f"Command: `{res['command']}`. Seeds: {res['seeds']}; {res['config']['n_test']} test prompts per task; "
        f"{res.get('wall_seconds', 0.0) / 60:.1f} min for this regime in that command "
        "(stages, merges and evaluations already cached are reused, so an aggregating rerun is short).",
        "",
        *table(["agent", "storage", "export", "lr", "steps", "prompts/step"], recipe_rows),
        "",
        "### Specialists against the base (own domain)",
        "",
        *gains_table(res),
        "",
        *check_lines(res),
        *main_tables(res),
        "### Share of each specialist's gain that the merge keeps",
        "",
        *retention_table(retention),
        "",
        "### Probe against the paper's Figure 2 and independent masks",
        "",
        *probe_vs_paper(res),
        "",
        *probe_table(res),
        "",
        *probe_figure(res),
        "",
        "### Overlap by base-weight magnitude",
        "",
        *magnitude_lines(res),
        "### Dilution ablation",
        "",
        "θ₀ + s·(the agent's unique updates only), scored on the agent's own domain.",
        "",
        *dilution_table(res),
        "",
    ]
    return lines + _regime_notes(res)


def _regime_notes(res: dict[str, Any]) -> list[str]:
    """The regime's optional parts: RAM+ ablation, two-agent merges, chosen lambdas, skipped merges."""
    lines: list[str] = []
    abl = ablation_lines(res)
    if abl:
        lines += ["### RAM+ ablation", "", *abl]
    variants = variant_lines(res)
    if variants:
        lines += ["### RAM variants", "", *variants]
    pairs = pairs_lines(res)
    if pairs:
        lines += ["### Two-agent merges (the paper's second table)", "", *pairs]
    pairs = pairs_lines({"pairs": res.get("pairs_tuned")})
    if pairs:
        lines += ["### Two-agent merges, tuned", "", "Each output scale chosen on the pair's validation.", "", *pairs]
    lambdas = [f"{v:g}" for e in read_key(res, "task_arithmetic_scale", []) if (v := chosen_scale(e)) is not None]
    if lambdas:
        lines.append(f"- task_arithmetic λ chosen on validation, per seed: {', '.join(lambdas)}.")
    for label, note in res["skipped"].items():
        lines.append(f"- `{label}` not in the table: {note}")
    lines.append("")
    return lines


def render_combined(combined: dict[str, Any], figure: str | None) -> str:
    regimes = combined["regimes"]
    missing = [r for r in REGIMES if r not in regimes]
    lines = [
        "# Zoo benchmark results: precision regimes",
        "",
        "How much of each RL-trained agent's skill survives a merge, on the CPU zoo of [zoo.md](zoo.md), with the",
        "agents' training precision as the variable. Generated by `agentmerge zoo bench`; do not edit by hand.",
        "Every cell is mean ± standard error over seeds (std / sqrt(seeds)), in percent or points.",
        "",
        "Also: the RAM variants in every regime (`docs/variants/results.md`) and the many-agent study, merges of",
        "2, 3, 4 and 6 agents of the six-domain zoo (`docs/many/results.md`).",
        "",
    ]
    short = [f"`{r}` ({len(v['seeds'])})" for r, v in regimes.items() if len(v["seeds"]) < FULL_SEEDS]
    no_pairs = [f"`{r}`" for r, v in regimes.items() if not v.get("pairs")]
    core = [f"`{r}`" for r, v in regimes.items() if "--methods" in v.get("command", "")]
    no_ablation = "paper_like" in regimes and not regimes["paper_like"].get("ablation")
    if missing or short or no_pairs or core or no_ablation:
        resume = FAIR_RESUME_COMMAND if is_fair(combined) else RESUME_COMMAND
        parts = []
        if no_pairs:
            parts.append(f"the 2-agent pairs were not run for {', '.join(no_pairs)}")
        if core:
            parts.append(f"{', '.join(core)} ran a shorter method list (see each regime's command)")
        if no_ablation:
            parts.append("the RAM+ ablation was not run")
        if missing:
            parts.append(f"regimes not run yet: {', '.join(missing)}")
        if short:
            parts.append(f"regimes on fewer than {FULL_SEEDS} seeds: {', '.join(short)}")
        lines += [
            f"**Partial:** {'; '.join(parts)}. The full run resumes from the caches with `{resume}`.",
            "",
        ]
    lines += ["## The regime map", "", *regime_map_lines(combined, figure)]
    for name, res in regimes.items():
        lines += regime_section(name, res)
    return "\n".join(lines) + "\n"
