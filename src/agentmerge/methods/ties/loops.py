"""The compiled loops of the TIES family: DARE's drop, the magnitude band, sign election (numba).

``upper_loop`` and ``lower_loop`` are the two radix-count passes that find a tensor's exact magnitude
bounds (``agentmerge.methods.stats.RadixPlan``); ``ties_loop`` merges one chunk once the bounds are known.
The arithmetic is the reference kernels' (``agentmerge.methods.ties.kernels``) operation for operation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from agentmerge.methods.fused.jit import BLOCK, FINITE_BITS, jit
from agentmerge.methods.fused.loops import add_patterns, load_block


@jit
def _dropped(t: Any, u: Any, f: Any, inv: Any, q: Any, pow2: Any) -> Any:
    """DARE on one float32 ``t``: 0 unless ``u >= f``; survivors ``t * inv`` (q a power of two) or ``t / q``."""
    if u < f:
        return np.float32(0.0)
    if pow2:
        return t * inv
    return np.float32(np.float64(t) / q)


@jit
def _magnitudes(vals: Any, i: int, m: int, lo: int, drop: Any, eps: float, mag: Any) -> bool:
    """``mag[:m] = |tau_i|`` (after DARE's drop when ``drop.u`` has columns; 0 where ``|tau_i| <= eps`` when
    ``eps >= 0``, RAM's update mask); True if any is Inf/NaN."""
    u, f, inv, q, pow2 = drop
    dropping = u.shape[1] > 0
    masking = eps >= 0
    eps32 = np.float32(eps)
    bad = False
    for j in range(m):
        t = vals[i + 1, j] - vals[0, j]
        if dropping:
            t = _dropped(t, u[i, lo + j], f[i], inv[i], q[i], pow2[i])
        a = abs(t)
        mag[j] = a if not masking or a > eps32 else np.float32(0.0)
    bits = mag.view(np.uint32)
    for j in range(m):
        bad |= bits[j] >= np.uint32(FINITE_BITS)
    return bad


@jit
def _shared(vals: Any, n: int, m: int, eps: float, shared: Any) -> None:
    """``shared[:m]`` = whether 2+ agents moved the element (``|tau_i| > eps``): RAM's shared region."""
    eps32 = np.float32(eps)
    count = np.zeros(m, np.int32)
    for i in range(n):
        for j in range(m):
            count[j] += abs(vals[i + 1, j] - vals[0, j]) > eps32
    for j in range(m):
        shared[j] = count[j] >= 2


@jit
def upper_loop(ref: Any, models: Any, shift: int, drop: Any, eps: float, hist: Any) -> bool:
    """First radix pass: ``hist[i, bits(|tau_i|) >> 16] += 1`` over the chunk; True if non-finite.

    With ``eps >= 0`` (RAM-TIES) only the shared region counts, with the masked magnitudes.
    """
    n, e = models.shape
    bits = np.empty((n + 1, BLOCK), np.uint32)
    vals = bits.view(np.float32)
    mag = np.empty(BLOCK, np.float32)
    mbits = mag.view(np.uint32)
    shared = np.ones(BLOCK, np.bool_)
    bad = False
    for lo in range(0, e, BLOCK):
        hi = min(lo + BLOCK, e)
        bad |= load_block(ref, models, lo, hi, shift, bits)
        if eps >= 0:
            _shared(vals, n, hi - lo, eps, shared)
        for i in range(n):
            bad |= _magnitudes(vals, i, hi - lo, lo, drop, eps, mag)
            if eps >= 0:
                for j in range(hi - lo):
                    if shared[j]:
                        hist[i, mbits[j] >> 16] += 1
            else:
                for j in range(hi - lo):
                    hist[i, mbits[j] >> 16] += 1
    return bad


@jit
def lower_loop(ref: Any, models: Any, shift: int, drop: Any, eps: float, bins: Any, hist: Any) -> bool:
    """Second radix pass: ``hist[i, r, low 16 bits] += 1`` for magnitudes whose upper bits are ``bins[i, r]``."""
    n, e = models.shape
    bits = np.empty((n + 1, BLOCK), np.uint32)
    vals = bits.view(np.float32)
    mag = np.empty(BLOCK, np.float32)
    mbits = mag.view(np.uint32)
    shared = np.ones(BLOCK, np.bool_)
    bad = False
    for lo in range(0, e, BLOCK):
        hi = min(lo + BLOCK, e)
        bad |= load_block(ref, models, lo, hi, shift, bits)
        if eps >= 0:
            _shared(vals, n, hi - lo, eps, shared)
        for i in range(n):
            if bins[i].max() < 0:
                continue
            bad |= _magnitudes(vals, i, hi - lo, lo, drop, eps, mag)
            for r in range(bins.shape[1]):
                want = np.uint32(bins[i, r]) if bins[i, r] >= 0 else np.uint32(0xFFFFFFFF)
                for j in range(hi - lo):
                    if mbits[j] >> 16 == want and shared[j]:
                        hist[i, r, mbits[j] & np.uint32(0xFFFF)] += 1
    return bad


# The rule of one TIES-family method for one tensor, as the loops take it:
#   (eps, drop, (low [N], high [N]), w [N], lam, elect, region)
# ``drop``: DARE's arrays (no columns: no drop); ``low <= |t| <= high``: the kept magnitude band; ``w``: the
# model weights; ``lam``: the scale of the result; ``elect``: sign election and disjoint mean, else the
# weighted sum; ``region``: RAM-TIES (mask ``|tau| > eps``, TIES only where 2+ agents moved the element).


@jit
def ties_loop(ref: Any, models: Any, shift: int, rule: Any, out: Any, patterns: Any) -> bool:
    """TIES / DARE / Breadcrumbs / RAM-TIES over one chunk: ``out = ref + tau*``; pattern counts; True if non-finite.

    Per element: ``x_i = w_i * trim_i(drop_i(tau_i))`` (zero unless ``low_i <= |.| <= high_i``); with ``elect``,
    ``s = sgn(sum_i x_i)`` and ``tau* = lam * sum_{i: s x_i > 0} s x_i * s / sum_{i: s x_i > 0} w_i`` (0 when no
    agent agrees), else ``tau* = lam * sum_i x_i``. With ``region`` (RAM-TIES) ``tau_i`` is first masked to
    ``|tau_i| > eps`` and elements moved by fewer than two agents get ``sum_i tau_i`` (the unique update or
    0) instead. Agents are summed in order 0..N-1 from +0, as the reference's ``sum_agents`` and
    ``deltas.agreeing_weight`` do.
    """
    n, e = models.shape
    lam, elect = rule[4], rule[5]
    bits = np.empty((n + 1, BLOCK), np.uint32)
    vals = bits.view(np.float32)
    x = np.empty((n, BLOCK), np.float32)
    acc, active, count = np.empty(BLOCK, np.float32), np.empty(BLOCK, np.float32), np.empty(BLOCK, np.int32)
    block = (x, acc, active, count, np.empty(BLOCK, np.int32))
    spare = (np.empty(BLOCK, np.float32), np.empty(BLOCK, np.float32), np.empty(BLOCK, np.float32))
    tally = np.zeros((4, patterns.shape[0]), np.int64)
    bad = False
    for lo in range(0, e, BLOCK):
        hi = min(lo + BLOCK, e)
        m = hi - lo
        bad |= load_block(ref, models, lo, hi, shift, bits)
        _trim_block(vals, m, lo, rule, block)
        for j in range(m):
            bad |= not np.isfinite(acc[j])
        if elect:
            _elect_block(vals, m, lo, rule, block, spare, out)
        else:
            for j in range(m):
                out[lo + j] = vals[0, j] + lam * acc[j]
        add_patterns(block[4], m, tally)
    patterns += tally.sum(axis=0)
    return bad


@jit
def _trim_block(vals: Any, m: int, lo: int, rule: Any, block: Any) -> None:
    """One block: ``x[i] = w_i * band-trimmed drop(tau_i)``, ``acc = sum_i x_i``, update codes, RAM's region sums."""
    eps, drop, band, w, region = rule[0], rule[1], rule[2], rule[3], rule[6]
    x, acc, active, count, code = block
    eps32 = np.float32(eps)
    u, f, inv, q, pow2 = drop
    dropping = u.shape[1] > 0
    acc[:] = 0.0
    active[:] = 0.0
    count[:] = 0
    code[:] = 0
    for i in range(x.shape[0]):
        wi, bottom, top = w[i], band[0][i], band[1][i]
        for j in range(m):
            t = vals[i + 1, j] - vals[0, j]
            on = abs(t) > eps32
            code[j] |= np.int32(on) << i
            if region:
                t = t if on else np.float32(0.0)
                count[j] += on
                active[j] += t
            if dropping:
                t = _dropped(t, u[i, lo + j], f[i], inv[i], q[i], pow2[i])
            t = t if bottom <= abs(t) <= top else np.float32(0.0)
            x[i, j] = t * wi
            acc[j] += x[i, j]


@jit
def _elect_block(vals: Any, m: int, lo: int, rule: Any, block: Any, spare: Any, out: Any) -> None:
    """One block: elected sign ``s = sgn(acc)``, disjoint mean of the agreeing ``x_i`` (RAM-TIES: unique kept)."""
    w, lam, region = rule[3], rule[4], rule[6]
    x, acc, active, count, _ = block
    sign, num, den = spare
    num[:] = 0.0
    den[:] = 0.0
    for j in range(m):  # the elected sign
        sign[j] = np.float32(1.0) if acc[j] > 0 else (np.float32(-1.0) if acc[j] < 0 else np.float32(0.0))
    for i in range(x.shape[0]):
        wi = w[i]
        for j in range(m):
            y = x[i, j] * sign[j]
            if y > 0:
                num[j] += y
                den[j] += wi
    for j in range(m):
        r = (num[j] * sign[j]) / den[j] if den[j] != 0 else np.float32(0.0)
        out[lo + j] = vals[0, j] + (active[j] if region and count[j] < 2 else lam * r)
