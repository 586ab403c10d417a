"""The mask rule: which elements of a task vector count as an update, one function for kernels and statistics.

Element p of agent i is *active* when ``|tau_i[p]| > t_i[p]``; the rule (``spec.MaskRule``) sets ``t``:

- **fixed** (the default, the paper's): ``t = epsilon`` (float32), bit for bit ``deltas.update_mask``.
- **grid** (``mask_dtype`` F, ``mask_ulps`` k): active when ``|tau| >= k * ulp_F(theta_0[p])``, with

      ulp_F(x) = 2 ** (max(ceil(log2 |x|) - 1, e_min) - p + 1),     ulp_F(0) = 2 ** (e_min - p + 1)

  for a format of ``p`` significand bits and least normal exponent ``e_min`` (float32: 24, -126;
  bfloat16: 8, -126; float16: 11, -14). That is the spacing of F's grid just below ``|x|``: inside a
  binade both neighbours are one spacing away; at a power of two the smaller spacing (toward zero)
  counts; zero and subnormals get the subnormal spacing. With k = 1 and base and agents both stored
  in F, an element is active exactly when the agent changed it at all (their difference is at least
  one spacing, and float32 rounding of the difference cannot go below that power of two). The test
  is ``>=``: with ``>`` a one-ulp move, the smallest change a bf16 agent can make, would not count.
  Kernels evaluate it as ``|tau| > t`` with ``t`` the float32 just below ``k * ulp``.
- **percentile** (``epsilon_q`` q): per agent and tensor, ``t_i`` = the r-th smallest ``|tau_i|`` of the
  tensor's d elements, ``r = ceil(q d / 100)`` (``r = 0``: t = 0). With distinct magnitudes exactly
  ``d - r`` elements are active. Exact in bounded memory (``stats.kth_streamed``, two radix passes).
- **valley**: per agent and tensor, a 2-component Gaussian mixture is fitted to ``y = log10 |tau_i|`` of
  the nonzero entries (deterministic EM, fixed start: means at the 25th and 75th percentiles, both
  variances the sample's, equal weights; the sample binned into ``EM_BINS`` bins), on a seeded subsample
  of ``VALLEY_SAMPLE`` elements for larger tensors (``deltas.seeded_uniform``: the same positions whatever
  the chunking). ``t_i`` is ``10 ** y*`` with ``y*`` the lowest point of the mixture density between
  the two means, if that is a real valley (inside, and ``VALLEY_DEPTH`` below the lower end); else
  ``epsilon``, noted in ``Levels``.

Adaptive thresholds (``Levels``) come from the whole tensor (``tensor_levels``, streamed over its chunks)
before its kernel runs, so the statistics pass and the merge pass use the very same values. They are cached
per input set under ``levels_key`` (``engine.caches.LevelsCache``, exact float32 values) and recorded in merge.json
(``levels_record``: per agent min / median / max over tensors and valley fallbacks, then every tensor's values).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from agentmerge.methods.deltas import seeded_uniform, update_mask
from agentmerge.methods.spec import Chunk, MaskRule
from agentmerge.methods.stats import kth_streamed

GRIDS = {"float32": (24, -126), "bfloat16": (8, -126), "float16": (11, -14)}  # (significand bits p, e_min)
VALLEY_SAMPLE = 1 << 16  # elements of a tensor the valley fit looks at (all of a smaller tensor)
VALLEY_MIN = 32  # nonzero values below which no mixture is fitted
VALLEY_DEPTH = 0.99  # the valley's density must be below this fraction of the lower end's
EM_STEPS = 300
EM_BINS = 256  # the EM sees the sample as a histogram of this many bins
VALLEY_POINTS = 2049  # grid points between the two means where the valley is looked for
LEVELS_VERSION = 1  # bump when a rule's thresholds change for the same inputs: cached ones are then not read

Batches = Callable[[], Iterator[tuple[int, torch.Tensor]]]  # a fresh pass: (start, tau [N, E] float32) per chunk


@dataclass(frozen=True)
class Levels:
    """One tensor's adaptive thresholds: ``[N]`` float32, and which agents fell back to ``epsilon`` (valley)."""

    values: torch.Tensor
    fallback: tuple[bool, ...]


def grid_of(dtype: torch.dtype) -> str:
    """The grid ``mask_dtype: base`` means for a base tensor stored as ``dtype`` (float32 for float64 and others).

    Task vectors are float32, so a float64 base is compared on the float32 grid.
    """
    return {torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(dtype, "float32")


def pow2(n: torch.Tensor) -> torch.Tensor:
    """``[E]`` int32 exponents in [-149, 127] -> exact float32 ``2 ** n`` (subnormals built from their bits)."""
    normal = (n + 127).clamp(min=0) << 23
    sub = torch.ones_like(n) << (n + 149).clamp(min=0, max=22)
    return torch.where(n >= -126, normal, sub).to(torch.int32).view(torch.float32)


def ulp(x: torch.Tensor, grid: str) -> torch.Tensor:
    """``[E]`` float32 -> ``[E]`` float32 ``ulp_F(x)``: F's spacing just below ``|x|`` (see the module docstring)."""
    p, e_min = GRIDS[grid]
    m, e = torch.frexp(x.float())  # x = m * 2**e, 0.5 <= |m| < 1; frexp(0) = (0, 0)
    top = e - 1 - (m.abs() == 0.5).to(e.dtype)  # ceil(log2 |x|) - 1
    top = torch.where(x == 0, e_min, top).clamp(min=e_min)
    return pow2((top - p + 1).to(torch.int32))


def grid_threshold(base: torch.Tensor, grid: str, k: int) -> torch.Tensor:
    """``[E]`` float32 ``t`` with ``|tau| > t`` exactly when ``|tau| >= k * ulp_F(base)``: the float just below."""
    at_least = ulp(base, grid) * float(k)  # exact: k < 2**24 times a power of two (inf past float32's range)
    return (at_least.view(torch.int32) - 1).view(torch.float32)


def tensor_mask(tau: torch.Tensor, base: torch.Tensor, rule: MaskRule, levels: Levels | None = None) -> torch.Tensor:
    """``[N, E]`` task vectors, ``[E]`` base (float32) -> ``[N, E]`` bool: active under ``rule``."""
    if rule.plain:
        return update_mask(tau, rule.epsilon)
    if rule.dtype != "none":
        return tau.abs() > grid_threshold(base, rule.dtype, rule.ulps)[None, :]
    if levels is None:
        raise RuntimeError(f"mask rule {rule.key}: the tensor's thresholds were not computed (tensor_levels)")
    return tau.abs() > levels.values[:, None]


def chunk_mask(c: Chunk) -> torch.Tensor:
    """``[N, E]`` bool: the chunk's update mask under its tensor's rule (a whole tensor may compute its thresholds)."""
    rule = c.rule
    levels = c.stats.levels
    if rule.adaptive and levels is None:
        if not c.whole:
            raise RuntimeError(f"{c.name}: mask thresholds missing for a partial chunk (no statistics pass ran)")
        levels = tensor_levels(rule, c.name, c.stop - c.start, lambda: iter([(c.start, c.tau)]))
    return tensor_mask(c.tau, c.base, rule, levels)


# --------------------------------------------------------------------------- adaptive thresholds


def tensor_levels(rule: MaskRule, name: str, numel: int, batches: Batches) -> Levels:
    """Tensor ``name``'s per-agent thresholds under an adaptive ``rule``, from one or two passes over its chunks."""
    if rule.rule == "percentile":
        rank = percentile_rank(rule.q, numel)
        values = kth_streamed(lambda: (t.abs() for _, t in batches()), lambda d, n: torch.full((n, 1), rank))
        return Levels(values[:, 0].contiguous(), (False,) * values.shape[0])
    if rule.rule == "valley":
        samples = valley_samples(rule.seed, name, numel, batches)
        found = [valley_threshold(s) for s in samples]
        values = torch.tensor([rule.epsilon if t is None else t for t in found], dtype=torch.float32)
        return Levels(values, tuple(t is None for t in found))
    raise ValueError(f"mask rule {rule.key} has no per-tensor thresholds")


def percentile_rank(q: float, d: int) -> int:
    """The nearest-rank index ``ceil(q d / 100)`` of the q-th percentile of ``d`` values (exact arithmetic)."""
    return math.ceil(Fraction(q) * d / 100)


def valley_samples(seed: int, name: str, numel: int, batches: Batches) -> list[torch.Tensor]:
    """Per agent, ``log10 |tau|`` (float64) of the nonzero entries at the seeded sample positions, in element order."""
    rate = min(1.0, VALLEY_SAMPLE / max(numel, 1))
    parts: list[list[torch.Tensor]] = []
    for start, tau in batches():
        if not parts:
            parts = [[] for _ in range(tau.shape[0])]
        mags = tau.abs()
        if rate < 1.0:
            mags = mags[:, seeded_uniform(seed, name, start, start + tau.shape[1], 1)[0] < rate]
        for i, row in enumerate(mags):
            parts[i].append(row[row > 0].double().log10())
    return [torch.cat(p) if p else torch.zeros(0, dtype=torch.float64) for p in parts]


@dataclass(frozen=True)
class Mixture:
    """A two-component 1-D Gaussian mixture: weights, means, variances (float64 ``[2]``)."""

    w: np.ndarray[Any, Any]
    mu: np.ndarray[Any, Any]
    var: np.ndarray[Any, Any]

    def log_parts(self, y: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """``[M]`` -> ``[M, 2]``: ``log(w_k N(y; mu_k, var_k))``."""
        d = y[:, None] - self.mu[None, :]
        out: np.ndarray[Any, Any] = np.log(self.w) - 0.5 * (np.log(2 * math.pi * self.var) + d * d / self.var)
        return out

    def density(self, y: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        out: np.ndarray[Any, Any] = np.exp(self.log_parts(y)).sum(1)
        return out


def fit_mixture(y: torch.Tensor, steps: int = EM_STEPS, bins: int = EM_BINS) -> Mixture:
    """EM for two Gaussians on ``[M]`` float64 values, from a fixed start; stops when the log-likelihood settles.

    The values enter as a histogram of ``bins`` equal bins over their range (each value at its bin's centre),
    so a step costs ``O(bins)``; variances are floored at ``1e-6 var(y)`` plus a bin width's variance.
    """
    ys = np.sort(y.double().numpy())
    m = ys.size
    total = float(ys.var())
    lo, hi = float(ys[0]), float(ys[-1])
    width = (hi - lo) / bins
    counts = np.histogram(ys, bins, (lo, hi))[0].astype(np.float64)
    centres = lo + width * (np.arange(bins, dtype=np.float64) + 0.5)
    floor = 1e-6 * total + width * width / 12 + 1e-12
    start = np.array([ys[(m - 1) // 4], ys[(3 * (m - 1)) // 4]])
    mix = Mixture(np.array([0.5, 0.5]), start, np.maximum(np.array([total, total]), floor))
    last = -math.inf
    for _ in range(steps):
        logp = mix.log_parts(centres)
        ll = np.logaddexp(logp[:, 0], logp[:, 1])
        resp = np.exp(logp - ll[:, None]) * counts[:, None]  # [B, 2], weighted by the bin counts
        nk = np.maximum(resp.sum(0), 1e-12)
        mu = (resp * centres[:, None]).sum(0) / nk
        var = (resp * (centres[:, None] - mu) ** 2).sum(0) / nk
        mix = Mixture(nk / m, mu, np.maximum(var, floor))
        now = float((ll * counts).sum())
        if now - last <= 1e-9 * abs(now):
            break
        last = now
    return mix


def valley_threshold(y: torch.Tensor, points: int = VALLEY_POINTS) -> float | None:
    """``10 ** y*`` at the valley between the two fitted modes of ``y = log10 |tau|``, or None when there is none."""
    if y.numel() < VALLEY_MIN or float(y.max() - y.min()) <= 0:
        return None
    mix = fit_mixture(y)
    lo, hi = sorted(float(v) for v in mix.mu)
    if hi - lo < 1e-6:
        return None
    grid = np.linspace(lo, hi, points)
    dens = mix.density(grid)
    j = int(np.argmin(dens))
    if j in (0, points - 1) or float(dens[j]) >= VALLEY_DEPTH * min(float(dens[0]), float(dens[-1])):
        return None
    return float(np.float32(10.0 ** float(grid[j])))


# --------------------------------------------------------------------------- cached and recorded thresholds


def levels_key(name: str, rule: MaskRule) -> str:
    """The cache key of tensor ``name``'s thresholds under ``rule``: everything the values depend on.

    Besides the files (the store's own key): the rule with ``epsilon_q`` (percentile) or epsilon and seed
    (valley), the valley's fit settings, and ``LEVELS_VERSION``.
    """
    fit = f"|fit:{VALLEY_SAMPLE}:{VALLEY_MIN}:{VALLEY_DEPTH!r}:{EM_STEPS}:{EM_BINS}:{VALLEY_POINTS}"
    return f"{name}|{rule.key}|v{LEVELS_VERSION}" + (fit if rule.rule == "valley" else "")


def levels_to_json(levels: Levels) -> dict[str, Any]:
    """``{"values": [float], "fallback": [bool]}``: each float32 threshold exactly (as a float64)."""
    return {"values": levels.values.tolist(), "fallback": list(levels.fallback)}


def levels_from_json(entry: Any, n: int) -> Levels | None:
    """``levels_to_json``'s entry back as ``Levels`` for ``n`` agents; None when it is not one."""
    if not isinstance(entry, dict):
        return None
    values, fallback = entry.get("values"), entry.get("fallback")
    if not (isinstance(values, list) and isinstance(fallback, list) and len(values) == len(fallback) == n):
        return None
    if not all(isinstance(v, float) and math.isfinite(v) and v >= 0 for v in values):  # thresholds of |tau|
        return None
    if not all(isinstance(f, bool) for f in fallback):
        return None
    return Levels(torch.tensor(values, dtype=torch.float32), tuple(fallback))


def short_float32(x: float) -> float:
    """A float32 value as the shortest decimal that reads back as the same float32 (``1e-05``, not 9.99e-06...)."""
    short = float(np.format_float_scientific(np.float32(x), unique=True))
    return short if np.float32(short) == np.float32(x) else float(np.float32(x))


def threshold_summary(
    values: Mapping[str, Sequence[float]], fallback: Mapping[str, Sequence[bool]], labels: Sequence[str]
) -> list[dict[str, Any]]:
    """Per agent over the tensors: min, median (mean of the middle two for an even count), max, fallbacks."""
    out = []
    for i, label in enumerate(labels):
        ordered = sorted(v[i] for v in values.values())
        if not ordered:
            return []
        mid = len(ordered) // 2
        median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
        falls = sum(bool(f[i]) for f in fallback.values())
        out.append({"agent": label, "min": ordered[0], "median": median, "max": ordered[-1], "fallbacks": falls})
    return out


def levels_record(
    levels: Mapping[str, Levels], rules: Mapping[str, MaskRule], labels: Sequence[str]
) -> dict[str, Any] | None:
    """merge.json's ``thresholds``: the adaptive rules in words, the agents, the per-agent summary, and

    ``tensors``: ``{name: [threshold of agent 0, agent 1, ...]}`` (each float32 value exactly, written short),
    ``fallback``: ``{name: [agent index, ...]}`` where the valley rule found no valley (only those tensors).
    None when no tensor has an adaptive rule.
    """
    if not levels:
        return None
    values = {name: [short_float32(v) for v in lv.values.tolist()] for name, lv in levels.items()}
    fallback = {name: list(lv.fallback) for name, lv in levels.items()}
    return {
        "rule": "; ".join(sorted({rules[name].describe() for name in levels})),
        "agents": list(labels),
        "summary": threshold_summary(values, fallback, labels),
        "tensors": values,
        "fallback": {name: [i for i, f in enumerate(fs) if f] for name, fs in fallback.items() if any(fs)},
    }
