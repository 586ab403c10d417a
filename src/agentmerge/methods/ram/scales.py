"""The per-agent scales RAM+ and ram_fisher report: merge.json's ``scales`` rows and the merge summary's lines.

Both rescale each agent's unique updates by ``lambda_i`` from a ratio ``rho_i``: RAM+ from the overlap
histogram of its ``scope`` (``rho_i = |S_i| / |U_i|``, one row per group, or one ``model`` row for scope
global; scope tensor has one per tensor, left to merge.json's histograms), ram_fisher from the agents'
Fisher masses (``rho_i = F(S_i) / F(U_i)``, one row, when ``r > 0``). A row is
``{"group", "agents": [{"agent", "rho", "lambda"}]}`` (rho ``"inf"`` for an agent without unique updates).
These are the methods' ``hooks.Scales``; the driver and the report call them without knowing which method.

RAM's and RAM+'s ``hooks.Advice``, ``ram_shared_advice``: an agent whose updates lie almost all where other
agents also updated is averaged there, so RAM keeps about ``kept_by_count(w) = w_0 + sum_k w_k / (k + 1)`` of
it (as little as plain averaging's ``1 / N`` when ``w_{N-1} = 1``); at or below ``SHARED_DILUTION`` the summary
says so and what keeps more (the real zoo's sparse code agent: 92 % of its updates shared by all three agents,
kept 0.35 measured, 0.35 by count).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import torch

from agentmerge.methods.deltas import kept_by_count, rho_from_histogram
from agentmerge.methods.hooks import AgentOverlap, ModelStats, ScaleRow, ScaleSummary
from agentmerge.methods.params import Params
from agentmerge.methods.ram import RamFisherParams, RamParams, RamPlusParams
from agentmerge.methods.ram.kernels import fisher_rho

MAX_GROUP_LINES = 40  # groups listed on stderr; merge.json has them all
SHARED_DILUTION = 0.5  # RAM keeping this share of an agent (by count) or less gets a note


class Rescaling(Protocol):
    def unique_scale(self, rho: float) -> float: ...


def rho_text(x: float) -> str:
    return f"{x:.3f}" if x != float("inf") else "inf"


def scale_row(group: str, rho: Sequence[float], p: Rescaling, labels: Sequence[str]) -> ScaleRow:
    agents = [
        {"agent": name, "rho": x if math.isfinite(x) else "inf", "lambda": p.unique_scale(x)}
        for name, x in zip(labels, rho, strict=True)
    ]
    return {"group": group, "agents": agents}


def scale_lines(rows: Sequence[ScaleRow], what: str) -> tuple[str, ...]:
    """One line per group: each agent's lambda and rho (``what`` says where lambda comes from)."""
    lines = [f"  lambda {what}:"]
    for row in rows[:MAX_GROUP_LINES]:
        cells = [f"{a['agent']} {a['lambda']:.4f} (rho {rho_text(float(a['rho']))})" for a in row["agents"]]
        lines.append(f"    {row['group']}: " + ", ".join(cells))
    if len(rows) > MAX_GROUP_LINES:
        lines.append(f"    ... {len(rows) - MAX_GROUP_LINES} more groups in merge.json")
    return tuple(lines)


# --------------------------------------------------------------------------- RAM+


def ram_plus_rows(stats: ModelStats, labels: Sequence[str]) -> list[ScaleRow]:
    """One row per group (a grouped ``scope``: lambda with the parameters of the group's first tensor); one
    ``model`` row for scope global; none for scope tensor."""
    if stats.groups:
        return [scale_row(g, rho_from_histogram(h), RamPlusParams.of(p), labels) for g, (h, p) in stats.groups.items()]
    p = RamPlusParams.of(stats.params)
    if p.scope == "global" and stats.model_hist is not None:
        return [scale_row("model", rho_from_histogram(stats.model_hist), p, labels)]
    return []


def lambda_bound(p: RamPlusParams) -> tuple[str, float]:
    """RAM+'s largest lambda and when it is reached (``rho >= clip`` in the paper form)."""
    if p.form == "authors":
        return "rho >= 1", p.rescale_factor
    return f"rho >= clip = {p.clip:g}", 1.0 + p.r * p.clip


def ram_plus_summary(params: Params, rows: Sequence[ScaleRow], agents: Sequence[tuple[str, float]]) -> ScaleSummary:
    """Scope global: lambda on each agent's line, and which agents sit at the clip bound; else the group table."""
    p = RamPlusParams.of(params)
    if p.scope != "global":
        if rows:
            return ScaleSummary(lines=scale_lines(rows, f"per group (scope: {p.scope})"))
        return ScaleSummary(lines=("  lambda per tensor (scope: tensor); merge.json has the overlap statistics",))
    lam = [(name, p.unique_scale(rho)) for name, rho in agents]
    cells = tuple(f", lambda {x:.4f}" for _, x in lam)
    when, bound = lambda_bound(p)
    at_bound = [name for name, x in lam if x == bound]
    if len(at_bound) == len(agents):
        line = (
            f"  every lambda sits at its clip bound ({when}): RAM+ here is RAM with unique updates "
            f"scaled by the constant {bound:g}"
        )
        return ScaleSummary(cells, (line,))
    return ScaleSummary(cells, (f"  lambda at its clip bound ({when}) for {', '.join(at_bound)}",) if at_bound else ())


# --------------------------------------------------------------------------- ram_fisher


def ram_fisher_rows(stats: ModelStats, labels: Sequence[str]) -> list[ScaleRow]:
    """One ``model (Fisher mass)`` row when the Fisher-mass pass ran (``r > 0``)."""
    if not isinstance(stats.model_stat, torch.Tensor):
        return []
    return [scale_row("model (Fisher mass)", fisher_rho(stats.model_stat), RamFisherParams.of(stats.params), labels)]


def ram_fisher_summary(params: Params, rows: Sequence[ScaleRow], agents: Sequence[tuple[str, float]]) -> ScaleSummary:
    return ScaleSummary(lines=scale_lines(rows, "from Fisher mass") if rows else ())


# --------------------------------------------------------------------------- RAM, RAM+: agents averaged nearly whole


def ram_shared_advice(params: Params, agents: Sequence[AgentOverlap]) -> tuple[str, ...]:
    """A note per agent that RAM keeps ``SHARED_DILUTION`` or less of, counted by element (``shared: mean``)."""
    if RamParams.of(params).shared != "mean":
        return ()
    notes = []
    for a in agents:
        kept = kept_by_count(a.overlap)
        if sum(a.overlap) > 0 and kept <= SHARED_DILUTION:  # an agent with no update has all-zero shares
            notes.append(
                f"{a.name}: {100 * (1 - a.overlap[0]):.1f} % of its updates lie where other agents also updated, "
                f"where RAM takes their mean: counted by element it keeps about {100 * kept:.0f} % of this agent's "
                f"update (plain averaging: {100 / len(agents):.0f} %), and RAM+'s lambda scales only the "
                f"{100 * a.overlap[0]:.1f} % unique; `agentmerge probe --merged OUT` measures what it kept, "
                "`--param shared=elect` or `--method ram_ties` keep more of a shared update"
            )
    return tuple(notes)
