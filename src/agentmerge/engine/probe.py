"""Probing task vectors: how dense each agent's update is and how much it overlaps the others'.

From the per-tensor overlap histograms ``H[i, k]`` (elements agent i updated together with exactly k
other agents, see ``deltas.py``), per agent and per group of tensors (whole model, layer, module type):

    density_i   = sum_k H[i, k] / numel
    overlap_i,k = H[i, k] / sum_k H[i, k]            (k = 0 is the unique fraction, "w.0")
    rho_i       = sum_{k>=1} H[i, k] / H[i, 0]       (inf when agent i has no unique element)
    lambda_i    = RAM+'s unique-region scale of rho_i (``RamPlusParams.unique_scale``: 1 + r * clip(rho_i, 0, alpha),
                  or with ``form: authors`` 1 + (R - 1) * min(rho_i, 1)), from the RAM+ record the probe is given

``independent`` is what the overlap histogram would be if each agent chose its updated elements
independently at random with its per-tensor density: per tensor t, agent i's updated elements that k
others also update are ``numel_t * d_i(t) * P(k of the others)``, with a Poisson-binomial P.

"Updated" follows the mask rule given (``masks.py``: ``|tau| > epsilon`` by default, or a grid of ulps,
or a percentile / valley threshold per agent and tensor, whose values the result lists), the same rule
a merge with those parameters counts with.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from agentmerge.engine.counting import mask_levels, overlap_stats
from agentmerge.engine.inputs import Inputs
from agentmerge.engine.merge_plan import resolve_mask
from agentmerge.engine.parallel import torch_threads
from agentmerge.engine.quantnote import measure, note
from agentmerge.io.formats.checkpoint import Readable
from agentmerge.methods import RamPlusParams
from agentmerge.methods.deltas import rho_from_histogram
from agentmerge.methods.groups import layer_of, module_type
from agentmerge.methods.masks import Levels, threshold_summary
from agentmerge.methods.spec import EPSILON_DEFAULT, MaskRule, Params, mask_rule


@dataclass(frozen=True)
class AgentStats:
    """One agent over one group of tensors."""

    name: str
    numel: int
    updated: int
    density: float
    overlap: list[float]  # k = 0..N-1: fraction of its updated elements shared with exactly k others
    rho: float
    lam: float


@dataclass
class ProbeResult:
    """Density and overlap per agent: over the model, per layer, per module type, per tensor."""

    base: str
    models: list[str]
    epsilon: float
    ram: RamPlusParams  # the RAM+ parameters its lambdas are computed with
    agents: list[AgentStats]
    independent: list[list[float]]  # [N][N]: overlap fractions that independent masks would give
    per_layer: dict[str, list[AgentStats]] = field(default_factory=dict)
    per_module: dict[str, list[AgentStats]] = field(default_factory=dict)
    per_tensor: dict[str, list[AgentStats]] = field(default_factory=dict)
    # {agent: {tensor: rows}}: vocabulary rows an agent added past the base's (not in the statistics above)
    added_rows: dict[str, dict[str, int]] = field(default_factory=dict)
    rule: str = "|tau| > 1e-05"  # the mask rule in words (``MaskRule.describe``)
    storage: dict[str, str] = field(default_factory=dict)  # base and each agent: the dtypes it stores
    thresholds: dict[str, list[float]] = field(default_factory=dict)  # adaptive rules: per tensor, per agent
    fallback: dict[str, list[bool]] = field(default_factory=dict)  # valley: agents that had no valley there
    notes: list[str] = field(default_factory=list)  # e.g. the quantization note (quantnote) for GGUF inputs

    def ram_record(self) -> dict[str, float | str]:
        """The RAM+ parameters of its lambdas, as the JSON report writes them."""
        p = self.ram
        return {"form": p.form, "r": p.r, "alpha": p.clip, "rescale_factor": p.rescale_factor}  # the JSON's key: alpha

    @property
    def lambda_text(self) -> str:
        """How its lambdas were computed, in words: ``r = 0.1, alpha = 2`` or ``authors form, R = 1.2``."""
        p = self.ram
        return f"authors form, R = {p.rescale_factor:g}" if p.form == "authors" else f"r = {p.r:g}, alpha = {p.clip:g}"

    def threshold_summary(self) -> list[dict[str, Any]]:
        """Per agent over the tensors: min, median, max of the adaptive thresholds and the fallbacks (else [])."""
        return threshold_summary(self.thresholds, self.fallback, [a.name for a in self.agents])

    def to_dict(self) -> dict[str, Any]:
        def rows(stats: list[AgentStats]) -> list[dict[str, Any]]:
            return [{**asdict(a), "rho": _finite(a.rho)} for a in stats]

        return {
            "base": self.base,
            "models": self.models,
            "epsilon": self.epsilon,
            "mask_rule": self.rule,
            "storage_dtypes": self.storage,
            "thresholds": {
                "summary": self.threshold_summary(),
                "per_tensor": {t: {"values": v, "fallback": self.fallback[t]} for t, v in self.thresholds.items()},
            },
            "ram_plus": self.ram_record(),
            "agents": rows(self.agents),
            "independent_overlap": self.independent,
            "per_layer": {k: rows(v) for k, v in self.per_layer.items()},
            "per_module": {k: rows(v) for k, v in self.per_module.items()},
            "per_tensor": {k: rows(v) for k, v in self.per_tensor.items()},
            "added_rows": self.added_rows,
            **({"notes": self.notes} if self.notes else {}),
        }


def _finite(x: float) -> float | str:
    return x if math.isfinite(x) else "inf"


def agent_stats(
    hist: torch.Tensor, numel: int, labels: Sequence[str], ram: RamPlusParams | None = None
) -> list[AgentStats]:
    """``[N, N]`` histogram of a group of ``numel`` elements -> per-agent statistics (lambda: ``ram``'s scale, the
    record's defaults when None)."""
    ram = ram or RamPlusParams()
    out = []
    for i, (row, rho) in enumerate(zip(hist.tolist(), rho_from_histogram(hist), strict=True)):
        updated = sum(row)
        overlap = [c / updated if updated else 0.0 for c in row]
        lam = ram.unique_scale(rho)
        out.append(AgentStats(labels[i], numel, updated, updated / numel if numel else 0.0, overlap, rho, lam))
    return out


def poisson_binomial(probs: Sequence[float]) -> list[float]:
    """P(exactly k of independent events with these probabilities happen), k = 0..len(probs)."""
    dist = [1.0]
    for p in probs:
        dist = [a * (1 - p) + b * p for a, b in zip([*dist, 0.0], [0.0, *dist], strict=True)]
    return dist


def independent_overlap(hists: Mapping[str, torch.Tensor], numels: Mapping[str, int]) -> list[list[float]]:
    """Per agent, the overlap fractions expected if updates were placed independently (per-tensor densities)."""
    n = next(iter(hists.values())).shape[0] if hists else 0
    expected = [[0.0] * n for _ in range(n)]
    for name, h in hists.items():
        dens = [v / numels[name] for v in h.sum(1).tolist()] if numels[name] else [0.0] * n
        for i in range(n):
            others = poisson_binomial([d for j, d in enumerate(dens) if j != i])
            for k, p in enumerate(others):
                expected[i][k] += numels[name] * dens[i] * p
    return [[v / sum(row) if sum(row) else 0.0 for v in row] for row in expected]


def _grouped(
    hists: Mapping[str, torch.Tensor], numels: Mapping[str, int], key: Any, labels: Sequence[str], ram: RamPlusParams
) -> dict[str, list[AgentStats]]:
    groups: dict[str, list[str]] = {}
    for name in hists:
        groups.setdefault(key(name), []).append(name)
    return {
        g: agent_stats(_sum(hists[t] for t in names), sum(numels[t] for t in names), labels, ram)
        for g, names in sorted(groups.items(), key=lambda kv: _natural(kv[0]))
    }


def _sum(hists: Iterable[torch.Tensor]) -> torch.Tensor:
    items = list(hists)
    return torch.stack(items).sum(0)


def _natural(key: str) -> tuple[int, str]:
    return (int(key), "") if key.isdigit() else (1 << 30, key)


def probe(
    base: str,
    models: Sequence[str],
    *,
    epsilon: float = EPSILON_DEFAULT,
    ram: Params | None = None,
    labels: Sequence[str] | None = None,
    threads: int | None = None,
    chunk_size: int = 1 << 22,
    quiet: bool = False,
    mask: Params | None = None,
    seed: int = 0,
) -> ProbeResult:
    """Read base and models once (streamed) and compute every statistic of ``ProbeResult``.

    Vocabulary tensors with added rows count their base rows only; the added rows are reported per agent.
    ``ram``: RAM+'s parameters for the reported lambdas (its record, or a mapping of some of them: the record's
    defaults for the rest; ``form``, ``r``, ``alpha``, ``rescale_factor`` are read).
    ``mask``: the mask parameters (``mask_dtype``, ``mask_ulps``, ``epsilon_rule``, ``epsilon_q``) as a merge
    takes them, already checked; ``seed``: the valley rule's subsample. Models in another floating dtype than
    the base's are accepted (task vectors are float32).
    """
    labels = list(labels) if labels else [Path(m).name or m for m in models]
    n_threads = threads or os.cpu_count() or 1
    inputs = Inputs(base, list(models))
    try:
        names = [n for n, i in inputs.reference.tensors.items() if i.dtype.is_floating_point and i.numel]
        numels = {n: inputs.reference.tensors[n].numel for n in names}
        params = {"epsilon": epsilon, **(mask or {})}
        rules = {n: mask_rule(resolve_mask(params, inputs.reference.tensors[n].dtype), seed) for n in names}
        storage = {"base": storage_dtypes(inputs.reference)}
        storage |= {label: storage_dtypes(m) for label, m in zip(labels, inputs.models, strict=True)}
        with torch_threads(1):
            levels = mask_levels(inputs, rules, n_threads, chunk_size, quiet)
            hists = overlap_stats(inputs, rules, n_threads, chunk_size, quiet, levels)
        vocab = inputs.vocab
        quantized = measure(inputs.reference, inputs.models, labels)
    finally:
        inputs.close()
    result = probe_from_histograms(hists, numels, base, list(models), labels, epsilon, RamPlusParams.of(ram or {}))
    result.added_rows = {
        labels[i]: {name: t.out_rows - t.base_rows for name, t in vocab.tensors.items()} for i in vocab.adders
    }
    result.notes = [note(quantized)] if quantized else []
    return _with_rule(result, rules, levels, storage)


def storage_dtypes(ckpt: Readable) -> str:
    """The dtypes a checkpoint stores its floating tensors in: ``bfloat16``, or ``bfloat16 (120), float32 (3)``."""
    counts: dict[str, int] = {}
    for info in ckpt.tensors.values():
        if info.dtype.is_floating_point:
            name = str(info.dtype).removeprefix("torch.")
            counts[name] = counts.get(name, 0) + 1
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{k} ({v})" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))


def _with_rule(
    result: ProbeResult, rules: Mapping[str, MaskRule], levels: Mapping[str, Levels], storage: dict[str, str]
) -> ProbeResult:
    """The result with the mask rule in words, the storage dtypes and any adaptive thresholds."""
    result.rule = "; ".join(sorted({rule.describe() for rule in rules.values()}))  # "base" grids may differ
    result.storage = storage
    result.thresholds = {n: lv.values.tolist() for n, lv in levels.items()}
    result.fallback = {n: list(lv.fallback) for n, lv in levels.items()}
    return result


def probe_from_histograms(
    hists: Mapping[str, torch.Tensor],
    numels: Mapping[str, int],
    base: str,
    models: list[str],
    labels: Sequence[str],
    epsilon: float,
    ram: RamPlusParams | None = None,
) -> ProbeResult:
    """Build a ``ProbeResult`` from per-tensor histograms already collected (e.g. by a merge)."""
    ram = ram or RamPlusParams()
    total = _sum(hists.values()) if hists else torch.zeros(len(models), len(models), dtype=torch.int64)
    return ProbeResult(
        base=base,
        models=models,
        epsilon=epsilon,
        ram=ram,
        agents=agent_stats(total, sum(numels.values()), labels, ram),
        independent=independent_overlap(hists, numels),
        per_layer=_grouped(hists, numels, layer_of, labels, ram),
        per_module=_grouped(hists, numels, module_type, labels, ram),
        per_tensor=_grouped(hists, numels, lambda t: t, labels, ram),
    )
