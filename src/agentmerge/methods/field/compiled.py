"""Compiled MagMax, Consensus TA and SCE (numba): one pass over a chunk as stored, bit for bit ``kernels.py``.

The loops widen ``BLOCK`` elements of the reference and every model at a time (``loops.load_block``),
compute the merged ``theta_0 + tau*`` with the reference kernel's float32 operations in its order (agents
0..N-1, sums from zero, no fused multiply-add) and count the update patterns of the overlap histogram
(|tau_i| > eps) that merge.json reports, as every compiled kernel does. SCE's weights come from exact sums
of squares (``square_loop``: the block sums and integer buckets of ``kernels.square_parts``), counted
chunk-parallel before the merge for a multi-chunk tensor (``SCE.rounds``), by the kernel itself for a
one-chunk tensor.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from agentmerge.methods.deltas import PerAgent
from agentmerge.methods.exactsum import BUCKETS, OFFSET
from agentmerge.methods.field import ConsensusParams, MagMaxParams
from agentmerge.methods.field.kernels import SCE_MIN_DENOM, SceStats, sce_weights, tall_lambda_of
from agentmerge.methods.fused.gram import add_bucket, halved
from agentmerge.methods.fused.jit import BLOCK, jit
from agentmerge.methods.fused.kernels import f32, output, raw_chunk
from agentmerge.methods.fused.loops import add_patterns, load_block
from agentmerge.methods.spec import ChunkSpec, Compiled, CompiledResult, Rounds
from agentmerge.methods.stats import STAT_BLOCK


@jit
def magmax_loop(ref: Any, models: Any, shift: int, eps: float, lam: Any, out: Any, patterns: Any) -> bool:
    """``out = ref + lam * tau_{t*}`` (t* the last agent of largest |tau|); patterns; True if non-finite."""
    n, e = models.shape
    eps32 = np.float32(eps)
    bits = np.empty((n + 1, BLOCK), np.uint32)
    vals = bits.view(np.float32)
    sel, best = np.empty(BLOCK, np.float32), np.empty(BLOCK, np.float32)
    code = np.empty(BLOCK, np.int32)
    tally = np.zeros((4, patterns.shape[0]), np.int64)
    bad = False
    for lo in range(0, e, BLOCK):
        hi = min(lo + BLOCK, e)
        m = hi - lo
        bad |= load_block(ref, models, lo, hi, shift, bits)
        code[:] = 0
        for i in range(n):
            for j in range(m):
                t = vals[i + 1, j] - vals[0, j]
                mag = abs(t)
                wins = i == 0 or mag >= best[j]
                sel[j] = t if wins else sel[j]
                best[j] = mag if wins else best[j]
                code[j] |= np.int32(mag > eps32) << i
        for j in range(m):
            out[lo + j] = vals[0, j] + sel[j] * lam
        add_patterns(code, m, tally)
    patterns += tally.sum(axis=0)
    return bad


@jit
def consensus_loop(
    ref: Any, models: Any, shift: int, eps: float, tall: Any, k: int, lam: Any, out: Any, patterns: Any
) -> bool:
    """``out = ref + lam * (sum_i tau_i if #{t: |tau_t| > tall_t |sum - tau_t|} >= k else 0)``; patterns."""
    n, e = models.shape
    eps32 = np.float32(eps)
    bits = np.empty((n + 1, BLOCK), np.uint32)
    vals = bits.view(np.float32)
    total = np.empty(BLOCK, np.float32)
    votes, code = np.empty(BLOCK, np.int32), np.empty(BLOCK, np.int32)
    tally = np.zeros((4, patterns.shape[0]), np.int64)
    bad = False
    for lo in range(0, e, BLOCK):
        hi = min(lo + BLOCK, e)
        m = hi - lo
        bad |= load_block(ref, models, lo, hi, shift, bits)
        total[:] = 0.0
        code[:] = 0
        votes[:] = 0
        for i in range(n):
            for j in range(m):
                t = vals[i + 1, j] - vals[0, j]
                total[j] += t
                code[j] |= np.int32(abs(t) > eps32) << i
        for i in range(n):
            ti = tall[i]
            for j in range(m):
                t = vals[i + 1, j] - vals[0, j]
                votes[j] += np.int32(abs(t) > abs(total[j] - t) * ti)
        for j in range(m):
            kept = total[j] if votes[j] >= k else np.float32(0.0)
            out[lo + j] = vals[0, j] + kept * lam
        add_patterns(code, m, tally)
    patterns += tally.sum(axis=0)
    return bad


def magmax(ref: torch.Tensor, models: torch.Tensor, spec: ChunkSpec, out: torch.Tensor | None = None) -> CompiledResult:
    """MagMax over one chunk (``kernels.magmax``)."""
    raw = raw_chunk(ref, models)
    merged, patterns = output(raw, out)
    lam = f32(MagMaxParams.of(spec.params).scale)
    bad = magmax_loop(raw.ref, raw.models, raw.shift, spec.eps, lam, merged.numpy(), patterns)
    return CompiledResult(merged, torch.from_numpy(patterns), not bad)


def consensus(
    ref: torch.Tensor, models: torch.Tensor, spec: ChunkSpec, out: torch.Tensor | None = None
) -> CompiledResult:
    """Consensus TA over one chunk (``kernels.consensus``; per-model ``tall_lambda`` too)."""
    raw = raw_chunk(ref, models)
    merged, patterns = output(raw, out)
    tall = PerAgent.of(ConsensusParams, spec, tall_lambda_of).values(raw.models.shape[0]).float().numpy()
    p = ConsensusParams.of(spec.params)
    k, lam = p.k, f32(p.scale)
    bad = consensus_loop(raw.ref, raw.models, raw.shift, spec.eps, tall, k, lam, merged.numpy(), patterns)
    return CompiledResult(merged, torch.from_numpy(patterns), not bad)


@jit
def square_loop(ref: Any, models: Any, shift: int, block: int, parts: Any) -> bool:
    """``parts [N, BUCKETS, 2] +=`` the buckets of each ``block``-element sum of ``tau_i^2`` (``exactsum``);
    True if an input is not finite."""
    n, e = models.shape
    bits = np.empty((n + 1, block), np.uint32)
    vals = bits.view(np.float32)
    buf = np.empty(block, np.float64)
    for lo in range(0, e, block):
        hi = min(lo + block, e)
        if load_block(ref, models, lo, hi, shift, bits):
            return True
        for i in range(n):
            for j in range(hi - lo):
                t = np.float64(vals[i + 1, j] - vals[0, j])
                buf[j] = t * t
            add_bucket(parts, i, halved(buf, hi - lo, block), OFFSET)
    return False


@jit
def sce_loop(ref: Any, models: Any, shift: int, eps: float, w: Any, floor: Any, out: Any, patterns: Any) -> bool:
    """``out = ref + sum_i w_i e_i tau_i / max(sum_i w_i e_i, floor)``, e_i: sign(tau_i) = the elected sign."""
    n, e = models.shape
    eps32 = np.float32(eps)
    bits = np.empty((n + 1, BLOCK), np.uint32)
    vals = bits.view(np.float32)
    total, num, den = np.empty(BLOCK, np.float32), np.empty(BLOCK, np.float32), np.empty(BLOCK, np.float32)
    code = np.empty(BLOCK, np.int32)
    tally = np.zeros((4, patterns.shape[0]), np.int64)
    bad = False
    for lo in range(0, e, BLOCK):
        hi = min(lo + BLOCK, e)
        m = hi - lo
        bad |= load_block(ref, models, lo, hi, shift, bits)
        total[:] = 0.0
        num[:] = 0.0
        den[:] = 0.0
        code[:] = 0
        for i in range(n):
            for j in range(m):
                t = vals[i + 1, j] - vals[0, j]
                total[j] += t
                code[j] |= np.int32(abs(t) > eps32) << i
        for i in range(n):
            wi = w[i]
            for j in range(m):
                t = vals[i + 1, j] - vals[0, j]
                elected = np.float32(1.0) if total[j] >= np.float32(0.0) else np.float32(-1.0)
                erased = wi if t * elected > np.float32(0.0) else np.float32(0.0)
                num[j] += t * erased
                den[j] += erased
        for j in range(m):
            out[lo + j] = vals[0, j] + num[j] / max(den[j], floor)
        add_patterns(code, m, tally)
    patterns += tally.sum(axis=0)
    return bad


def square_counts(ref: torch.Tensor, models: torch.Tensor, spec: ChunkSpec, state: Any) -> tuple[torch.Tensor, bool]:
    """One chunk's exact square buckets (a round of ``SCE.rounds``)."""
    raw = raw_chunk(ref, models)
    parts = np.zeros((raw.models.shape[0], BUCKETS, 2), np.int64)
    bad = square_loop(raw.ref, raw.models, raw.shift, STAT_BLOCK, parts)
    return torch.from_numpy(parts), not bad


def sce(ref: torch.Tensor, models: torch.Tensor, spec: ChunkSpec, out: torch.Tensor | None = None) -> CompiledResult:
    """SCE over one chunk (``kernels.sce`` at select_topk 1): weights from the rounds, or from this chunk."""
    raw = raw_chunk(ref, models)
    merged, patterns = output(raw, out)
    stats = spec.stats.prepared
    if stats is None:
        parts, finite = square_counts(ref, models, spec, None)
        if not finite:
            return CompiledResult(merged, torch.from_numpy(patterns), False)
        stats = SceStats(None, sce_weights(parts, raw.models.shape[1]))
    w = stats.weights.float().numpy()
    floor = np.float32(SCE_MIN_DENOM)
    bad = sce_loop(raw.ref, raw.models, raw.shift, spec.eps, w, floor, merged.numpy(), patterns)
    return CompiledResult(merged, torch.from_numpy(patterns), not bad)


def _settle(total: torch.Tensor, spec: ChunkSpec, state: Any) -> SceStats:
    return SceStats(None, sce_weights(total, spec.stop - spec.start))


MAGMAX = Compiled(magmax)
CONSENSUS = Compiled(consensus)
SCE = Compiled(
    sce,
    Rounds(
        wanted=lambda spec: True,
        count=square_counts,
        settle=_settle,
        done=lambda state: isinstance(state, SceStats),
    ),
)
