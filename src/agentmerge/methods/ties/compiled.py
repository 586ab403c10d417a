"""Compiled kernels of the TIES family: TIES, DARE-TIES, DARE-linear, Breadcrumbs and RAM-TIES.

One loop per chunk does a whole method (``ties_loop``): DARE's drop (the very draws of
``deltas.seeded_uniform``), a magnitude band ``low_i <= |tau_i| <= high_i`` per agent (TIES: ``high``
= inf; Breadcrumbs: two ranks; RAM-TIES: counted and trimmed on RAM's shared region only, unique
updates kept whole), then sign election and the disjoint mean, or the weighted sum. A ``TiesForm``
says which of these steps a method takes.

The band's bounds are exact per tensor: k-th magnitudes found by two radix-count passes
(``upper_loop``, then ``lower_loop`` inside the bin that holds each rank), the same values as
``stats.kth_streamed``. For a multi-chunk tensor the driver runs the passes chunk-parallel before the
merge (the ``Rounds`` of the method's ``Compiled`` entry); a one-chunk tensor's kernel runs them itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from agentmerge.methods.deltas import HasParams, PerAgent
from agentmerge.methods.fused.kernels import RawChunk, f32, output, raw_chunk
from agentmerge.methods.fused.rng import seeded_uniform
from agentmerge.methods.spec import ChunkSpec, Compiled, CompiledResult, Rounds
from agentmerge.methods.stats import RadixPlan, RankFn, radix_plan
from agentmerge.methods.ties import BreadcrumbsParams, DareLinearParams, DareTiesParams, DropParams, TiesParams
from agentmerge.methods.ties.kernels import (
    Band,
    crumb_ranks,
    dare_ties_band,
    f32_at_least,
    keep_ranks,
    ties_band,
)
from agentmerge.methods.ties.loops import lower_loop, ties_loop, upper_loop

# DARE's drop as the loops take it: (u [N, E] f32 draws, f [N] f32, inv [N] f32, q [N] f64, pow2 [N] bool)
Drop = tuple[Any, Any, Any, Any, Any]


def _no_band(where: HasParams) -> RankFn | None:
    return None


@dataclass(frozen=True)
class TiesForm:
    """Which steps of the TIES/DARE/Breadcrumbs family a method takes, and what it reads of its parameters."""

    drop: bool  # DARE's random drop and rescale (``DropParams.p`` per agent)
    elect: bool  # sign election and disjoint mean (else the weighted sum)
    band: Band = _no_band  # the ranks of the kept band's bounds ([N, 1] lower, or [N, 2] lower, upper); None: all
    lam: Callable[[ChunkSpec], float] | None = None  # the method's lambda (None: RAM-TIES, no weights, no lambda)
    region: bool = False  # RAM-TIES: masks |tau| > epsilon; TIES (unweighted) on the shared region only

    def trims(self, spec: ChunkSpec) -> bool:
        """Whether this tensor is trimmed (Breadcrumbs always; TIES when some agent keeps less than all)."""
        return self.band(spec) is not None

    def ranks(self, spec: ChunkSpec) -> RankFn:
        ranks = self.band(spec)
        assert ranks is not None, spec.name
        return ranks

    def region_eps(self, spec: ChunkSpec) -> float:
        """The update threshold of RAM-TIES's shared region, or -1 (no region) for the other methods."""
        return spec.eps if self.region else -1.0

    def drop_arrays(self, spec: ChunkSpec, n: int) -> Drop:
        return dare_drop_arrays(spec, n) if self.drop else no_drop(n)


def dare_drop_arrays(spec: ChunkSpec, n: int) -> Drop:
    """DARE's drop of ``kernels.dare_drop`` for one chunk: the same draws and the same float32 arithmetic.

    Element ``p`` of agent ``i`` survives iff ``u_i[p] >= f_i`` (``f_i`` the smallest float32 ``>= p_i``) and
    becomes ``tau * (1 / q_i)`` when ``q_i = 1 - p_i`` is a power of two, else ``float32(tau / q_i)`` in float64.
    """
    u = seeded_uniform(spec.seed, spec.name, spec.start, spec.stop, n)
    p = PerAgent.of(DropParams, spec, lambda q: q.p).values(n).tolist()
    f = np.array([float(f32_at_least(x)) for x in p], np.float32)
    q = np.array([1.0 - x for x in p], np.float64)
    pow2 = np.array([math.frexp(x)[0] == 0.5 and x >= 2.0**-100 for x in q], np.bool_)
    inv = np.array([1.0 / x if ok else 0.0 for x, ok in zip(q, pow2, strict=True)], np.float32)
    return u, f, inv, q, pow2


def no_drop(n: int) -> Drop:
    """The ``Drop`` of a method without DARE (the loops skip the drop when ``u`` has no columns)."""
    return (
        np.zeros((n, 0), np.float32),
        np.zeros(n, np.float32),
        np.zeros(n, np.float32),
        np.ones(n, np.float64),
        np.zeros(n, np.bool_),
    )


# --------------------------------------------------------------------------- exact bounds: two radix passes


def upper_counts(raw: RawChunk, drop: Drop, eps: float = -1.0) -> tuple[torch.Tensor, bool]:
    """First radix pass over one chunk: ``[N, 2**16]`` counts of the upper 16 bits of ``|tau_i|``; finite?

    ``eps >= 0``: only RAM's shared region (2+ agents with ``|tau| > eps``) counts, masked magnitudes.
    """
    hist = np.zeros((raw.models.shape[0], 1 << 16), np.int64)
    bad = upper_loop(raw.ref, raw.models, raw.shift, drop, eps, hist)
    return torch.from_numpy(hist), not bad


def lower_counts(raw: RawChunk, drop: Drop, bins: torch.Tensor, eps: float = -1.0) -> tuple[torch.Tensor, bool]:
    """Second radix pass: ``[N, R, 2**16]`` counts of the lower 16 bits of ``|tau_i|`` inside ``bins[i, r]``."""
    hist = np.zeros((*bins.shape, 1 << 16), np.int64)
    bad = lower_loop(raw.ref, raw.models, raw.shift, drop, eps, bins.numpy(), hist)
    return torch.from_numpy(hist), not bad


def band_plan(hist: torch.Tensor, form: TiesForm, spec: ChunkSpec) -> RadixPlan:
    """The radix plan of the band's bounds from a tensor's first-pass counts (``d`` = the values counted)."""
    ranks = form.ranks(spec)(int(hist[0].sum()), hist.shape[0])
    return radix_plan(hist, ranks)


def threshold_rounds(form: TiesForm) -> Rounds:
    """The chunk-parallel statistics of a multi-chunk tensor: state None -> ``RadixPlan`` -> ``[N, R]`` bounds."""

    def count(ref: torch.Tensor, models: torch.Tensor, spec: ChunkSpec, state: Any) -> tuple[torch.Tensor, bool]:
        raw = raw_chunk(ref, models)
        drop, eps = form.drop_arrays(spec, raw.models.shape[0]), form.region_eps(spec)
        if state is None:
            return upper_counts(raw, drop, eps)
        return lower_counts(raw, drop, state.bin_table(), eps)

    def settle(total: torch.Tensor, spec: ChunkSpec, state: Any) -> Any:
        if state is not None:
            return state.found(total)
        plan = band_plan(total, form, spec)
        return plan if plan.wanted else plan.found(plan.lower_histogram())

    return Rounds(wanted=form.trims, count=count, settle=settle, done=lambda state: isinstance(state, torch.Tensor))


def chunk_thresholds(raw: RawChunk, drop: Drop, spec: ChunkSpec, form: TiesForm) -> torch.Tensor | None:
    """``[N, R]`` band bounds of a tensor that is this one chunk (two radix passes over it); None if not finite."""
    eps = form.region_eps(spec)
    hist, ok = upper_counts(raw, drop, eps)
    if not ok:
        return None
    plan = band_plan(hist, form, spec)
    lo_hist, ok = lower_counts(raw, drop, plan.bin_table(), eps) if plan.wanted else (plan.lower_histogram(), True)
    return plan.found(lo_hist) if ok else None


# --------------------------------------------------------------------------- the merge loop


def _band(thr: torch.Tensor, n: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """``[N, 1]`` (lower bound only) or ``[N, 2]`` bounds -> float32 ``(low [N], high [N])``; +inf when unbounded."""
    t = torch.as_tensor(thr).float()
    high = t[:, 1] if t.shape[1] > 1 else torch.full((n,), math.inf)
    return t[:, 0].contiguous().numpy(), high.contiguous().numpy()


def _thresholds(raw: RawChunk, drop: Drop, spec: ChunkSpec, form: TiesForm) -> torch.Tensor | None:
    """The band of this tensor: none, the statistics pass's, or this (whole-tensor) chunk's; None if unknown."""
    if not form.trims(spec):
        return torch.zeros(raw.models.shape[0], 1)
    if spec.stats.prepared is not None:
        return torch.as_tensor(spec.stats.prepared)
    if not spec.whole:
        return None  # the statistics pass met a non-finite input: the reference path names it
    return chunk_thresholds(raw, drop, spec, form)


def family(form: TiesForm) -> Compiled:
    """The compiled entry of one member of the TIES family: its merge kernel and its statistics rounds."""

    def kernel(
        ref: torch.Tensor, models: torch.Tensor, spec: ChunkSpec, out: torch.Tensor | None = None
    ) -> CompiledResult:
        raw = raw_chunk(ref, models)
        n = raw.models.shape[0]
        drop = form.drop_arrays(spec, n)
        thr = _thresholds(raw, drop, spec, form)
        merged, patterns = output(raw, out)
        if thr is None:
            return CompiledResult(merged, torch.from_numpy(patterns), False)
        w = (torch.ones(n) if form.lam is None else spec.weights).float().numpy()  # RAM-TIES: no weights, no lambda
        lam = np.float32(1.0) if form.lam is None else f32(form.lam(spec))
        rule = (spec.eps, drop, _band(thr, n), w, lam, form.elect, form.region)
        bad = ties_loop(raw.ref, raw.models, raw.shift, rule, merged.numpy(), patterns)
        return CompiledResult(merged, torch.from_numpy(patterns), not bad)

    return Compiled(kernel, None if form.band is _no_band else threshold_rounds(form))


# the compiled entries of the registry (``registry.fk``): one per member of the family
TIES = family(TiesForm(drop=False, elect=True, band=ties_band, lam=lambda s: TiesParams.of(s.params).scale))
DARE_LINEAR = family(TiesForm(drop=True, elect=False, lam=lambda s: DareLinearParams.of(s.params).scale))
DARE_TIES = family(
    TiesForm(drop=True, elect=True, band=dare_ties_band, lam=lambda s: DareTiesParams.of(s.params).scale)
)
BREADCRUMBS = family(
    TiesForm(drop=False, elect=False, band=crumb_ranks, lam=lambda s: BreadcrumbsParams.of(s.params).scale)
)
RAM_TIES = family(TiesForm(drop=False, elect=True, band=keep_ranks, region=True))
