"""The compiled loops of RAM, RAM+, linear, task arithmetic and the overlap counts (numba).

Each loop takes one chunk's stored bits (``ref [E]``, ``models [N, E]``: uint16 bf16 bits with
``shift`` 16, or uint32 float32 bits with ``shift`` 0), widens ``BLOCK`` elements at a time into a
cache-sized float32 block, and in one pass writes the merged ``theta_0 + tau*`` and adds the chunk's
update-pattern counts (``patterns[code] += 1``, bit i of ``code`` = agent i moved the element by more
than eps). Every loop returns True when an input was Inf or NaN. Agents are summed in order 0..N-1
from zero, exactly as ``deltas.sum_agents``; no fused multiply-add, no fast-math.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from agentmerge.methods.fused.jit import BLOCK, FINITE_BITS, jit


@jit
def widen(src: Any, dst: Any, shift: int) -> bool:
    """float32 bits of ``src`` into ``dst`` (bf16 bits shifted by 16); True if any value is Inf/NaN."""
    bad = np.uint32(0)
    if shift == 16:  # constant shifts keep the loops vectorized
        for j in range(src.shape[0]):
            v = np.uint32(src[j]) << 16
            dst[j] = v
            bad |= np.uint32((v & np.uint32(FINITE_BITS)) == np.uint32(FINITE_BITS))
    else:
        for j in range(src.shape[0]):
            v = np.uint32(src[j])
            dst[j] = v
            bad |= np.uint32((v & np.uint32(FINITE_BITS)) == np.uint32(FINITE_BITS))
    return bool(bad != 0)


@jit
def load_block(ref: Any, models: Any, lo: int, hi: int, shift: int, bits: Any) -> bool:
    """Widen elements ``lo:hi`` of the reference (row 0) and each model (rows 1..N) into ``bits``."""
    bad = widen(ref[lo:hi], bits[0, : hi - lo], shift)
    for i in range(models.shape[0]):
        bad |= widen(models[i, lo:hi], bits[i + 1, : hi - lo], shift)
    return bool(bad)


@jit
def add_patterns(code: Any, m: int, tally: Any) -> None:
    """``tally[., code[j]] += 1`` for the block's ``m`` elements, in 4 interleaved rows (no store stalls)."""
    for j in range(0, m - 3, 4):
        tally[0, code[j]] += 1
        tally[1, code[j + 1]] += 1
        tally[2, code[j + 2]] += 1
        tally[3, code[j + 3]] += 1
    for j in range(m - m % 4, m):
        tally[0, code[j]] += 1


@jit
def elect_block(vals: Any, m: int, eps32: Any, acc: Any, shared: Any, den: Any) -> None:
    """``shared[j]``: TIES's disjoint mean of the active agents of element j, elected by the sign of ``acc[j]``.

    As ``deltas.disjoint_merge`` with unit weights: ``v_i = tau_i * s`` (s = sgn acc), the agreeing ``v_i > 0``
    summed in agent order from zero, times s, over their count; +0.0 where none agrees.
    """
    n = vals.shape[0] - 1
    shared[:m] = 0.0
    den[:m] = 0.0
    for i in range(n):
        for j in range(m):
            t = vals[i + 1, j] - vals[0, j]
            v = t * np.float32(np.sign(acc[j]))
            agree = abs(t) > eps32 and v > np.float32(0.0)
            shared[j] += v if agree else np.float32(0.0)
            den[j] += np.float32(1.0) if agree else np.float32(0.0)
    for j in range(m):
        shared[j] = shared[j] * np.float32(np.sign(acc[j])) / den[j] if den[j] != 0 else np.float32(0.0)


@jit
def ram_loop(
    ref: Any, models: Any, shift: int, eps: float, lam: Any, scaled: bool, elect: bool, out: Any, patterns: Any
) -> bool:
    """RAM / RAM+ over one chunk: ``out = ref + tau*``; ``patterns[code] +=`` per element; True if non-finite.

    Agents are the outer loop inside a block so the element loops vectorize; each element still
    sums its agents in order 0..N-1, as the reference does. ``elect``: the shared region takes
    ``elect_block``'s sign-elected mean instead of the plain one (``shared: elect``).
    """
    n, e = models.shape
    eps32 = np.float32(eps)
    bits = np.empty((n + 1, BLOCK), np.uint32)
    vals = bits.view(np.float32)
    acc, lone = np.empty(BLOCK, np.float32), np.empty(BLOCK, np.float32)
    shared, den = np.empty(BLOCK, np.float32), np.empty(BLOCK, np.float32)
    count, code = np.empty(BLOCK, np.int32), np.empty(BLOCK, np.int32)
    tally = np.zeros((4, patterns.shape[0]), np.int64)
    bad = False
    for lo in range(0, e, BLOCK):
        hi = min(lo + BLOCK, e)
        m = hi - lo
        bad |= load_block(ref, models, lo, hi, shift, bits)
        acc[:] = 0.0
        lone[:] = 0.0
        count[:] = 0
        code[:] = 0
        for i in range(n):
            li = lam[i]
            for j in range(m):
                t = vals[i + 1, j] - vals[0, j]
                on = abs(t) > eps32
                acc[j] += t if on else np.float32(0.0)
                lone[j] = t * li if on else lone[j]
                count[j] += on
                code[j] |= np.int32(on) << i
        if elect:
            elect_block(vals, m, eps32, acc, shared, den)
            for j in range(m):
                d = acc[j] / np.float32(max(count[j], 1))
                d = shared[j] if count[j] >= 2 else (lone[j] if scaled and count[j] == 1 else d)
                out[lo + j] = vals[0, j] + d
        elif scaled:
            for j in range(m):
                d = lone[j] if count[j] == 1 else acc[j] / np.float32(max(count[j], 1))
                out[lo + j] = vals[0, j] + d
        else:
            for j in range(m):
                out[lo + j] = vals[0, j] + acc[j] / np.float32(max(count[j], 1))
        add_patterns(code, m, tally)
    patterns += tally.sum(axis=0)
    return bad


@jit
def weighted_loop(
    ref: Any, models: Any, shift: int, eps: float, w: Any, scale: float, divide: bool, out: Any, patterns: Any
) -> bool:
    """``out = ref + (sum_i w_i tau_i) / scale`` (divide) or ``ref + scale * sum_i w_i tau_i``; patterns too."""
    n, e = models.shape
    eps32 = np.float32(eps)
    s32 = np.float32(scale)
    bits = np.empty((n + 1, BLOCK), np.uint32)
    vals = bits.view(np.float32)
    acc = np.empty(BLOCK, np.float32)
    code = np.empty(BLOCK, np.int32)
    tally = np.zeros((4, patterns.shape[0]), np.int64)
    bad = False
    for lo in range(0, e, BLOCK):
        hi = min(lo + BLOCK, e)
        m = hi - lo
        bad |= load_block(ref, models, lo, hi, shift, bits)
        acc[:] = 0.0
        code[:] = 0
        for i in range(n):
            wi = w[i]
            for j in range(m):
                t = vals[i + 1, j] - vals[0, j]
                acc[j] += t * wi
                code[j] |= np.int32(abs(t) > eps32) << i
        if divide:
            for j in range(m):
                out[lo + j] = vals[0, j] + acc[j] / s32
        else:
            for j in range(m):
                out[lo + j] = vals[0, j] + s32 * acc[j]
        add_patterns(code, m, tally)
    patterns += tally.sum(axis=0)
    return bad


@jit
def count_loop(ref: Any, models: Any, shift: int, eps: float, patterns: Any) -> bool:
    """Only the pattern counts (the RAM+ statistics pass); True if non-finite."""
    n, e = models.shape
    eps32 = np.float32(eps)
    bits = np.empty((n + 1, BLOCK), np.uint32)
    vals = bits.view(np.float32)
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
                code[j] |= np.int32(abs(vals[i + 1, j] - vals[0, j]) > eps32) << i
        add_patterns(code, m, tally)
    patterns += tally.sum(axis=0)
    return bad
