"""Rendering: probe results as markdown and plots, and the merged model's card (README.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from agentmerge._version import __version__
from agentmerge.config.schema import MergeConfig
from agentmerge.engine.probe import AgentStats, ProbeResult
from agentmerge.engine.provenance import MergeResult, hub_ids, input_ref, recorded_config
from agentmerge.engine.retention import Retention
from agentmerge.io.guards import jsontext
from agentmerge.methods.deltas import kept_by_count
from agentmerge.methods.hooks import AgentOverlap, ScaleSummary
from agentmerge.methods.ram.scales import rho_text
from agentmerge.methods.spec import EPSILON_DEFAULT


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def agents_table(agents: list[AgentStats], independent: list[list[float]] | None = None) -> str:
    """Markdown: one row per agent with density, overlap w.0..w.(N-1), rho, the RAM+ lambda and what RAM keeps of
    it counted by element (``deltas.kept_by_count``)."""
    n = len(agents)
    head = ["agent", "density %", *[f"w.{k} %" for k in range(n)], "rho", "lambda (RAM+)", "RAM keeps % (by count)"]
    if independent:
        head.append("w.0 % if independent")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, a in enumerate(agents):
        cells = [a.name, _pct(a.density), *[_pct(x) for x in a.overlap], rho_text(a.rho), f"{a.lam:.4f}"]
        cells.append(_pct(kept_by_count(a.overlap)) if a.updated else "-")
        if independent:
            cells.append(_pct(independent[i][0]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def retention_table(results: list[Retention]) -> str:
    """Markdown: per merge and agent, the share of the agent's update kept, overall and per overlap region."""
    n = len(results[0].agents) if results else 0
    head = ["merge", "agent", "kept", *[f"kept w.{k}" for k in range(n)], "cos", "|Δ|² outside every agent %"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        for a in r.agents:
            cells = [r.merged, a.name, _num(a.kept), *map(_num, a.by_region), _num(a.cos), _pct(r.outside)]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _num(x: float) -> str:
    return "-" if x != x else f"{x:.3f}"  # NaN: no such element


def probe_rule_text(p: ProbeResult) -> str:
    """What counted as an update and how each input is stored; for adaptive rules the thresholds chosen."""
    lines = [f"update rule: {p.rule}", "storage: " + "; ".join(f"{k} {v}" for k, v in p.storage.items())]
    summary = p.threshold_summary()
    if summary:
        lines += ["", "| agent | threshold min | median | max | no valley (epsilon used) |", "|---|---|---|---|---|"]
        lines += [
            f"| {s['agent']} | {s['min']:.3g} | {s['median']:.3g} | {s['max']:.3g} | {s['fallbacks']} |"
            for s in summary
        ]
    return "\n".join(lines) + "\n"


def density_grid(groups: dict[str, list[AgentStats]], title: str) -> str:
    """Markdown: density % per group (rows) and agent (columns)."""
    if not groups:
        return ""
    names = [a.name for a in next(iter(groups.values()))]
    lines = [f"| {title} | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 1)]
    for g, agents in groups.items():
        lines.append(f"| {g} | " + " | ".join(_pct(a.density) for a in agents) + " |")
    return "\n".join(lines)


def probe_markdown(p: ProbeResult, kept: list[Retention] | None = None) -> str:
    """The full probe report: summary table, per module type and per layer densities; with ``kept``, how much of
    each agent's update each merged model kept."""
    parts = [
        f"# Task-vector probe\n\nbase: `{p.base}`; epsilon = {p.epsilon:g}; RAM+ lambda with {p.lambda_text}. "
        "w.k: share of an agent's updated elements that exactly k other agents also updated.",
        "## What counted as an update\n\n" + probe_rule_text(p),
        "## Whole model\n\n" + agents_table(p.agents, p.independent),
        "## Density % per module type\n\n" + density_grid(p.per_module, "module"),
        "## Density % per layer\n\n" + density_grid(p.per_layer, "layer"),
    ]
    if kept:
        parts.append(
            "## What each merge kept of each agent\n\nkept = <Δ, τ_i> / <τ_i, τ_i> over the elements agent i "
            "updated (1: carried whole, 1/N: averaged with N unrelated updates, 0: dropped); kept w.k over those it "
            "updated with exactly k others; Δ = merged − base.\n\n" + retention_table(kept)
        )
    if p.added_rows:
        listed = "; ".join(
            f"{agent}: " + ", ".join(f"{rows} in {name}" for name, rows in tensors.items())
            for agent, tensors in p.added_rows.items()
        )
        parts.append(
            "## Added vocabulary rows\n\nRows past the base's vocabulary, not counted above (no base value to "
            f"differ from): {listed}."
        )
    return "\n\n".join(parts) + "\n"


def plot_probe(p: ProbeResult, path: str | Path) -> None:
    """The paper's Figure 2 view: density per agent; overlap distribution per agent (vs independent); layers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [a.name for a in p.agents]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    axes[0].bar(names, [100 * a.density for a in p.agents], color="tab:blue")
    axes[0].set(title="density (|delta| > eps)", ylabel="% of parameters")
    _overlap_bars(axes[1], p, names)
    _layer_heatmap(fig, axes[2], p, names)
    for ax in axes[:2]:
        ax.tick_params(axis="x", rotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _overlap_bars(ax: Any, p: ProbeResult, names: list[str]) -> None:
    """Grouped bars w.0..w.(N-1) per agent; black x marks what independent masks would give."""
    n = len(names)
    width = 0.8 / n
    for k in range(n):
        xs = [i + (k - (n - 1) / 2) * width for i in range(n)]
        ax.bar(xs, [100 * a.overlap[k] for a in p.agents], width, label=f"w.{k}")
        expected = [100 * row[k] for row in p.independent]
        ax.scatter(xs, expected, marker="x", color="black", zorder=3, label="if independent" if k == 0 else None)
    ax.set_xticks(range(n), names)
    ax.set(title="overlap: shared with exactly k others", ylabel="% of the agent's updates", ylim=(0, 119))
    ax.legend(fontsize=8, loc="upper center", ncol=n + 1)


def _layer_heatmap(fig: Any, ax: Any, p: ProbeResult, names: list[str]) -> None:
    layers = list(p.per_layer)
    grid = [[100 * a.density for a in p.per_layer[layer]] for layer in layers]
    im = ax.imshow(grid or [[0.0]], aspect="auto", cmap="viridis")
    ax.set_xticks(range(len(names)), names, rotation=20)
    ax.set_yticks(range(len(layers)), ["other" if layer == "-" else layer for layer in layers])
    ax.set(title="density % per layer", ylabel="layer (other: embeddings, final norm, head)")
    fig.colorbar(im, ax=ax)


# --------------------------------------------------------------------------- merged model outputs


def model_card(cfg: MergeConfig, result: MergeResult) -> str:
    """README.md for the merged model: front matter the Hugging Face Hub reads, what was merged, the recipe."""
    base = input_ref(cfg.base or cfg.models[0].path)
    params = ", ".join(f"{k} = {v}" for k, v in sorted(result.params.items())) or "none"
    body = [
        f"# Merged with agentmerge ({cfg.method})\n",
        f"Method: **{cfg.method}** — {cfg.spec.summary}. Parameters: {params}.\n",
        f"Base: `{base}`\n\nModels:\n",
        *[f"- `{input_ref(m.path)}`" + (f" (weight {m.weight:g})" if m.weight != 1.0 else "") for m in cfg.models],
        "",
        f"Output dtype: {cfg.dtype or 'as the base'}; {result.merged_tensors} of {result.tensors} tensors merged; "
        f"seed {cfg.seed}; agentmerge {__version__}.\n",
    ]
    agents = result.agents()
    if agents:
        body += [
            f"## Task-vector overlap (epsilon as configured, default {EPSILON_DEFAULT:g})\n",
            agents_table(agents),
            "",
        ]
    inputs = input_lines(result.vocab, result.sources)
    if inputs:
        body += ["## Tokenizer and vocabulary\n", *[f"- {line}" for line in inputs], ""]
    body += [
        "## Recipe\n",
        "The native agentmerge configuration of this merge (`agentmerge merge recipe.yaml OUT` repeats it):\n",
        "```yaml",
        yaml.safe_dump(recorded_config(cfg, recipe=True), sort_keys=False).rstrip("\n"),
        "```\n",
        "The resolved configuration and the input files are recorded in `merge.json`.\n",
    ]
    return "\n".join(card_front_matter(cfg) + body)


def card_front_matter(cfg: MergeConfig) -> list[str]:
    """The card's YAML header: every Hub input as ``base_model`` (ids without revision; local paths left out),
    ``base_model_relation: merge``, and tags (merge, agentmerge, the method, ``arxiv:ID`` of its paper)."""
    hub = hub_ids(cfg)
    front = ["---"]
    if hub:  # the Hub reads base_model as repository ids only
        front += [f"base_model: {jsontext.dumps(hub[0])}"] if len(hub) == 1 else ["base_model:"]
        front += [f"- {jsontext.dumps(h)}" for h in hub] if len(hub) > 1 else []
        front.append("base_model_relation: merge")
    tags = ["merge", "agentmerge", cfg.method] + ([f"arxiv:{cfg.spec.paper}"] if cfg.spec.paper else [])
    return [*front, "library_name: transformers", "tags:", *[f"- {t}" for t in tags], "---", ""]


# --------------------------------------------------------------------------- what a merge did, on stderr


def merge_summary(cfg: MergeConfig, result: MergeResult, warnings: list[str]) -> str:
    """A few lines: per agent density, unique share, rho and lambda; the regions; then every warning."""
    lines = [f"merged {len(cfg.models)} models with {cfg.method} into {result.out_dir} in {result.seconds:.1f} s"]
    agents = result.agents()
    if agents and result.numel:
        lines += _agent_lines(cfg, result, agents)
        lines.append(_regions_line(result))
    if result.thresholds:
        lines.append(_threshold_line(result.thresholds))
    lines += [f"  {line}" for line in input_lines(result.vocab, result.sources, warnings=False)]
    source_warnings = list((result.sources or {}).get("warnings", []))
    lines += [f"warning: {w}" for w in warnings + source_warnings + result.warnings + tuning_warnings(cfg)]
    if agents and cfg.spec.advice is not None:
        overlaps = [AgentOverlap(a.name, tuple(a.overlap)) for a in agents]
        lines += [f"note: {n}" for n in cfg.spec.advice(result.params, overlaps)]
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines)


def input_lines(vocab: dict[str, Any] | None, sources: dict[str, Any] | None, warnings: bool = True) -> list[str]:
    """Added vocabulary rows; where the tokenizer, chat template and generation config come from; warnings.

    ``vocab`` and ``sources`` as merge.json records them (``VocabPlan.record``, ``OutputSources.record``).
    """
    lines = []
    if vocab:
        lines.append(
            f"vocabulary: rows {vocab['base_rows']}..{vocab['out_rows'] - 1} of {', '.join(vocab['tensors'])} "
            f"added by {', '.join(vocab['added_by'])} ({vocab['new_rows']}); the other rows merged by the method; "
            f"config.json vocab_size {vocab['out_rows']}"
        )
    if sources:
        tok = sources["tokenizer"]
        eos = sources["eos_token_id"].get(tok["from"])
        lines.append(
            f"tokenizer and chat template from {tok['from']} ({_WHY.get(tok['why'], tok['why'])}), "
            f"generation_config.json from {sources['generation_config'] or 'no input (none written)'}; "
            f"EOS id(s) {eos if eos else 'unknown'}"
        )
        if warnings:
            lines += [f"warning: {w}" for w in sources.get("warnings", [])]
    return lines


_WHY = {"tokenizer_source": "tokenizer_source", "added tokens": "it added the vocabulary rows", "base": "the default"}


def _agent_lines(cfg: MergeConfig, result: MergeResult, agents: list[AgentStats]) -> list[str]:
    """Per agent: density, unique share, rho, and what the method's ``Scales`` hook adds (its lambda, groups)."""
    hook = cfg.spec.scales
    rho = [(a.name, a.rho) for a in agents]
    extra = hook.summary(result.params, result.scales, rho) if hook is not None else ScaleSummary()
    cells = extra.cells or ("",) * len(agents)
    lines = [
        f"  {a.name}: density {_pct(a.density)} %, unique {_pct(a.overlap[0])} % of its updates, rho {rho_text(a.rho)}"
        + cell
        for a, cell in zip(agents, cells, strict=True)
    ]
    return lines + list(extra.lines)


def _threshold_line(thresholds: dict[str, Any]) -> str:
    """The adaptive mask thresholds in one line: per agent min / median / max over tensors, valley fallbacks."""
    cells = []
    for row in thresholds["summary"]:
        cell = f"{row['agent']} {row['min']:.3g} / {row['median']:.3g} / {row['max']:.3g}"
        cells.append(cell + (f" (no valley in {row['fallbacks']}: epsilon)" if row["fallbacks"] else ""))
    count = len(thresholds["tensors"])
    return f"  mask thresholds min / median / max over {count} tensors (merge.json has each): " + "; ".join(cells)


def _regions_line(result: MergeResult) -> str:
    """Elements updated by no agent, by exactly one, by two or more (over the merged tensors)."""
    hist = result.model_hist or []
    unique = sum(row[0] for row in hist)
    shared = sum(row[k] / (k + 1) for row in hist for k in range(1, len(row)))
    n = result.numel
    return (
        f"  elements: {_pct((n - unique - shared) / n)} % untouched, {_pct(unique / n)} % unique to one agent, "
        f"{_pct(shared / n)} % shared by 2+"
    )


def tuning_warnings(cfg: MergeConfig) -> list[str]:
    """Parameters left at a default that usually needs tuning for this many models (``Param.tune``)."""
    if len(cfg.models) < 2:
        return []
    return [
        f"{cfg.method}: {p.name} left at its default with {len(cfg.models)} models; {p.tune} (--param {p.name}=...)"
        for p in cfg.spec.params
        if p.tune and p.name not in cfg.params
    ]
