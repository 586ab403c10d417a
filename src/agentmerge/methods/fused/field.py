"""Compiled MagMax and Consensus TA (numba): one pass over a chunk as stored, bit for bit ``elementwise.py``.

The loops widen ``BLOCK`` elements of the reference and every model at a time (``loops.load_block``),
compute the merged ``theta_0 + tau*`` with the reference kernel's float32 operations in its order (agents
0..N-1, sums from zero, no fused multiply-add) and count the update patterns of the overlap histogram
(|tau_i| > eps) that merge.json reports, as every compiled kernel does.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from agentmerge.methods.baselines import agent_values
from agentmerge.methods.fused.jit import BLOCK, jit
from agentmerge.methods.fused.kernels import f32, output, raw_chunk
from agentmerge.methods.fused.loops import add_patterns, load_block
from agentmerge.methods.spec import ChunkSpec, Compiled, CompiledResult


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
    """MagMax over one chunk (``elementwise.magmax``)."""
    raw = raw_chunk(ref, models)
    merged, patterns = output(raw, out)
    lam = f32(spec.params["lambda"])
    bad = magmax_loop(raw.ref, raw.models, raw.shift, spec.eps, lam, merged.numpy(), patterns)
    return CompiledResult(merged, torch.from_numpy(patterns), not bad)


def consensus(
    ref: torch.Tensor, models: torch.Tensor, spec: ChunkSpec, out: torch.Tensor | None = None
) -> CompiledResult:
    """Consensus TA over one chunk (``elementwise.consensus``; per-model ``tall_lambda`` too)."""
    raw = raw_chunk(ref, models)
    merged, patterns = output(raw, out)
    tall = agent_values(spec.params, spec.model_params, "tall_lambda", raw.models.shape[0]).float().numpy()
    k, lam = int(spec.params["k"]), f32(spec.params["lambda"])
    bad = consensus_loop(raw.ref, raw.models, raw.shift, spec.eps, tall, k, lam, merged.numpy(), patterns)
    return CompiledResult(merged, torch.from_numpy(patterns), not bad)


MAGMAX = Compiled(magmax)
CONSENSUS = Compiled(consensus)
