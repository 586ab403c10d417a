"""Rendering: probe results as markdown and plots, the merged model's card and its merge.json record."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

import agentmerge
from agentmerge.probe import AgentStats, ProbeResult, agent_stats

if TYPE_CHECKING:
    from agentmerge.config import MergeConfig
    from agentmerge.merge import Inputs, MergeResult


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _rho(x: float) -> str:
    return f"{x:.3f}" if x != float("inf") else "inf"


def agents_table(agents: list[AgentStats], independent: list[list[float]] | None = None) -> str:
    """Markdown: one row per agent with density, overlap w.0..w.(N-1), rho and the RAM+ lambda."""
    n = len(agents)
    head = ["agent", "density %", *[f"w.{k} %" for k in range(n)], "rho", "lambda (RAM+)"]
    if independent:
        head.append("w.0 % if independent")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, a in enumerate(agents):
        cells = [a.name, _pct(a.density), *[_pct(x) for x in a.overlap], _rho(a.rho), f"{a.lam:.4f}"]
        if independent:
            cells.append(_pct(independent[i][0]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def density_grid(groups: dict[str, list[AgentStats]], title: str) -> str:
    """Markdown: density % per group (rows) and agent (columns)."""
    if not groups:
        return ""
    names = [a.name for a in next(iter(groups.values()))]
    lines = [f"| {title} | " + " | ".join(names) + " |", "|" + "---|" * (len(names) + 1)]
    for g, agents in groups.items():
        lines.append(f"| {g} | " + " | ".join(_pct(a.density) for a in agents) + " |")
    return "\n".join(lines)


def probe_markdown(p: ProbeResult) -> str:
    """The full probe report: summary table, per module type and per layer densities."""
    parts = [
        f"# Task-vector probe\n\nbase: `{p.base}`; epsilon = {p.epsilon:g}; RAM+ lambda with r = {p.r:g}, "
        f"alpha = {p.alpha:g}. w.k: share of an agent's updated elements that exactly k other agents also updated.",
        "## Whole model\n\n" + agents_table(p.agents, p.independent),
        "## Density % per module type\n\n" + density_grid(p.per_module, "module"),
        "## Density % per layer\n\n" + density_grid(p.per_layer, "layer"),
    ]
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
    n = len(names)
    width = 0.8 / n
    for k in range(n):
        xs = [i + (k - (n - 1) / 2) * width for i in range(n)]
        ax.bar(xs, [100 * a.overlap[k] for a in p.agents], width, label=f"w.{k}")
    ax.scatter(
        range(n),
        [100 * row[0] for row in p.independent],
        marker="x",
        color="black",
        zorder=3,
        label="w.0 if independent",
    )
    ax.set_xticks(range(n), names)
    ax.set(title="overlap: shared with exactly k others", ylabel="% of the agent's updates")
    ax.legend(fontsize=8)


def _layer_heatmap(fig: Any, ax: Any, p: ProbeResult, names: list[str]) -> None:
    layers = list(p.per_layer)
    grid = [[100 * a.density for a in p.per_layer[layer]] for layer in layers]
    im = ax.imshow(grid or [[0.0]], aspect="auto", cmap="viridis")
    ax.set_xticks(range(len(names)), names, rotation=20)
    ax.set_yticks(range(len(layers)), layers)
    ax.set(title="density % per layer", ylabel="layer")
    fig.colorbar(im, ax=ax)


# --------------------------------------------------------------------------- merged model outputs


def merge_summary(result: MergeResult) -> list[AgentStats] | None:
    if result.model_hist is None:
        return None
    hist = torch.tensor(result.model_hist, dtype=torch.int64)
    return agent_stats(hist, result.numel, result.model_labels)


def model_card(cfg: MergeConfig, result: MergeResult) -> str:
    """README.md for the merged model, with front matter the Hugging Face hub reads."""
    base = cfg.base or cfg.models[0].path
    front = [
        "---",
        f"base_model: {json.dumps(base)}",
        "library_name: transformers",
        "tags:",
        "- merge",
        "- agentmerge",
        f"- {cfg.method}",
        "---",
        "",
    ]
    params = ", ".join(f"{k} = {v}" for k, v in sorted(result.params.items())) or "none"
    body = [
        f"# Merged with agentmerge ({cfg.method})\n",
        f"Method: **{cfg.method}** — {cfg.spec.summary}. Parameters: {params}.\n",
        f"Base: `{base}`\n\nModels:\n",
        *[f"- `{m.path}`" + (f" (weight {m.weight:g})" if m.weight != 1.0 else "") for m in cfg.models],
        "",
        f"Output dtype: {cfg.dtype or 'as the base'}; {result.merged_tensors} of {result.tensors} tensors merged; "
        f"seed {cfg.seed}; agentmerge {agentmerge.__version__}.\n",
    ]
    agents = merge_summary(result)
    if agents:
        body += ["## Task-vector overlap (epsilon as configured, default 1e-5)\n", agents_table(agents), ""]
    body.append("The resolved configuration and the input files are recorded in `merge.json`.\n")
    return "\n".join(front + body)


def reproducibility_record(cfg: MergeConfig, inputs: Inputs, result: MergeResult) -> dict[str, Any]:
    """merge.json: the resolved configuration, tool versions, input files, statistics and timing."""
    files = {}
    for ckpt in [inputs.reference, *inputs.models]:
        files[str(ckpt.path)] = [{"file": f.name, "bytes": f.stat().st_size} for f in ckpt.weight_files]
    agents = merge_summary(result)
    return {
        "agentmerge": agentmerge.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": cfg.model_dump(mode="json"),
        "resolved_params": result.params,
        "inputs": files,
        "probe": [a.__dict__ | {"rho": a.rho if a.rho != float("inf") else "inf"} for a in agents or []],
        "seconds": round(result.seconds, 3),
    }
