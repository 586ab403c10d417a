"""Optional fused chunk kernels (numba): one pass over the raw input bits per chunk.

The reference kernels in ``methods.py`` and ``baselines.py`` are written as readable torch expressions;
each makes several passes over ``[N, E]`` float32 temporaries. For the methods whose rule is a
per-element loop over agents this module runs the same float32 arithmetic in one compiled loop per
chunk: it widens the stored bits (bf16 or float32) itself, computes the merged value ``theta_0 + tau*``
and the chunk's overlap *pattern* counts (how many elements each set of updating agents has; the
``[N, N]`` histogram follows from them), and flags non-finite inputs, all without temporaries larger
than a cache-sized block.

- RAM, RAM+, linear, task arithmetic: mask, overlap count and (weighted) sums in one loop.
- TIES, DARE-TIES, DARE-linear, Breadcrumbs, RAM-TIES: DARE's drop (the very draws of ``deltas.seeded_uniform``: torch's
  CPU generator is MT19937, reproduced here, about 4x faster), the magnitude trim, sign election and
  disjoint mean (or the weighted sum) in one loop; the trim keeps a band ``low_i <= |tau_i| <= high_i``
  (TIES: ``high`` = inf; RAM-TIES counts and trims only RAM's shared region and keeps unique updates
  whole). The exact per-tensor bounds come from two radix-count passes over
  the tensor (``upper_counts``, ``lower_counts``) that the driver runs chunk-parallel before merging,
  the same values as ``baselines.kth_streamed``.

Results are bit-identical to the reference kernels (tests/test_speed_paths.py checks this): the same
float32 operations in the same order (agents summed 0..N-1 from zero, as ``deltas.sum_agents`` does), no
fused multiply-add, no fast-math. Only methods whose kernel is the very function listed in ``FUSED`` are
fused, so a changed reference kernel silently falls back to itself rather than to a stale copy.

The fast path is used when numba is installed (``pip install agentmerge[fast]``) unless the
environment sets ``AGENTMERGE_FUSED=0``; everything works without it, only slower.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from agentmerge import baselines, methods
from agentmerge.deltas import MAX_PATTERN_AGENTS, RNG_BLOCK, block_seed, rng_blocks
from agentmerge.methods import Chunk, Method, ParamValue, TensorStats

MAX_AGENTS = MAX_PATTERN_AGENTS  # pattern counts need 2**N bins
BLOCK = 2048  # elements widened at a time (fits L1/L2 with N+1 rows)
_FINITE_BITS = 0x7F800000  # float32 exponent all ones: Inf or NaN

try:  # numba is optional
    import numba

    _HAVE_NUMBA = True
except ImportError:  # pragma: no cover - depends on the environment
    _HAVE_NUMBA = False


def available() -> bool:
    """Whether the fused kernels can run here (numba importable and not switched off)."""
    return _HAVE_NUMBA and os.environ.get("AGENTMERGE_FUSED", "1") != "0"


# --------------------------------------------------------------------------- compiled loops

if _HAVE_NUMBA:
    _jit = numba.njit(nogil=True, cache=True, fastmath=False, error_model="numpy")

    @_jit
    def _widen(src: Any, dst: Any, shift: int) -> bool:
        """float32 bits of ``src`` into ``dst`` (bf16 bits shifted by 16); True if any value is Inf/NaN."""
        bad = np.uint32(0)
        if shift == 16:  # constant shifts keep the loops vectorized
            for j in range(src.shape[0]):
                v = np.uint32(src[j]) << 16
                dst[j] = v
                bad |= np.uint32((v & np.uint32(_FINITE_BITS)) == np.uint32(_FINITE_BITS))
        else:
            for j in range(src.shape[0]):
                v = np.uint32(src[j])
                dst[j] = v
                bad |= np.uint32((v & np.uint32(_FINITE_BITS)) == np.uint32(_FINITE_BITS))
        return bool(bad != 0)

    @_jit
    def _load_block(ref: Any, models: Any, lo: int, hi: int, shift: int, bits: Any) -> bool:
        """Widen elements ``lo:hi`` of the reference (row 0) and each model (rows 1..N) into ``bits``."""
        bad = _widen(ref[lo:hi], bits[0, : hi - lo], shift)
        for i in range(models.shape[0]):
            bad |= _widen(models[i, lo:hi], bits[i + 1, : hi - lo], shift)
        return bool(bad)

    @_jit
    def _add_patterns(code: Any, m: int, tally: Any) -> None:
        """``tally[., code[j]] += 1`` for the block's ``m`` elements, in 4 interleaved rows (no store stalls)."""
        for j in range(0, m - 3, 4):
            tally[0, code[j]] += 1
            tally[1, code[j + 1]] += 1
            tally[2, code[j + 2]] += 1
            tally[3, code[j + 3]] += 1
        for j in range(m - m % 4, m):
            tally[0, code[j]] += 1

    @_jit
    def _ram_loop(
        ref: Any, models: Any, shift: int, eps: float, lam: Any, scaled: bool, out: Any, patterns: Any
    ) -> bool:
        """RAM / RAM+ over one chunk: ``out = ref + tau*``; ``patterns[code] +=`` per element; True if non-finite.

        Agents are the outer loop inside a block so the element loops vectorize; each element still
        sums its agents in order 0..N-1, as the reference does.
        """
        n, e = models.shape
        eps32 = np.float32(eps)
        bits = np.empty((n + 1, BLOCK), np.uint32)
        vals = bits.view(np.float32)
        acc, lone = np.empty(BLOCK, np.float32), np.empty(BLOCK, np.float32)
        count, code = np.empty(BLOCK, np.int32), np.empty(BLOCK, np.int32)
        tally = np.zeros((4, patterns.shape[0]), np.int64)
        bad = False
        for lo in range(0, e, BLOCK):
            hi = min(lo + BLOCK, e)
            m = hi - lo
            bad |= _load_block(ref, models, lo, hi, shift, bits)
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
            if scaled:
                for j in range(m):
                    d = lone[j] if count[j] == 1 else acc[j] / np.float32(max(count[j], 1))
                    out[lo + j] = vals[0, j] + d
            else:
                for j in range(m):
                    out[lo + j] = vals[0, j] + acc[j] / np.float32(max(count[j], 1))
            _add_patterns(code, m, tally)
        patterns += tally.sum(axis=0)
        return bad

    @_jit
    def _weighted_loop(
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
            bad |= _load_block(ref, models, lo, hi, shift, bits)
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
            _add_patterns(code, m, tally)
        patterns += tally.sum(axis=0)
        return bad

    @_jit
    def _count_loop(ref: Any, models: Any, shift: int, eps: float, patterns: Any) -> bool:
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
            bad |= _load_block(ref, models, lo, hi, shift, bits)
            code[:] = 0
            for i in range(n):
                for j in range(m):
                    code[j] |= np.int32(abs(vals[i + 1, j] - vals[0, j]) > eps32) << i
            _add_patterns(code, m, tally)
        patterns += tally.sum(axis=0)
        return bad

    # ----------------------------------------------------------------------- TIES / DARE loops

    @_jit
    def _dropped(t: Any, u: Any, f: Any, inv: Any, q: Any, pow2: Any) -> Any:
        """DARE on one float32 ``t``: 0 unless ``u >= f``; survivors ``t * inv`` (q a power of two) or ``t / q``."""
        if u < f:
            return np.float32(0.0)
        if pow2:
            return t * inv
        return np.float32(np.float64(t) / q)

    @_jit
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
            bad |= bits[j] >= np.uint32(_FINITE_BITS)
        return bad

    @_jit
    def _shared(vals: Any, n: int, m: int, eps: float, shared: Any) -> None:
        """``shared[:m]`` = whether 2+ agents moved the element (``|tau_i| > eps``): RAM's shared region."""
        eps32 = np.float32(eps)
        count = np.zeros(m, np.int32)
        for i in range(n):
            for j in range(m):
                count[j] += abs(vals[i + 1, j] - vals[0, j]) > eps32
        for j in range(m):
            shared[j] = count[j] >= 2

    @_jit
    def _upper_loop(ref: Any, models: Any, shift: int, drop: Any, eps: float, hist: Any) -> bool:
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
            bad |= _load_block(ref, models, lo, hi, shift, bits)
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

    @_jit
    def _lower_loop(ref: Any, models: Any, shift: int, drop: Any, eps: float, bins: Any, hist: Any) -> bool:
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
            bad |= _load_block(ref, models, lo, hi, shift, bits)
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

    @_jit
    def _ties_loop(
        ref: Any,
        models: Any,
        shift: int,
        eps: float,
        drop: Any,
        low: Any,
        high: Any,
        w: Any,
        lam: Any,
        elect: bool,
        region: bool,
        out: Any,
        patterns: Any,
    ) -> bool:
        """TIES / DARE / Breadcrumbs over one chunk: ``out = ref + lam * tau*``; pattern counts; True if non-finite.

        Per element: ``x_i = w_i * trim_i(drop_i(tau_i))`` (zero unless ``low_i <= |.| <= high_i``); with ``elect``,
        ``s = sgn(sum_i x_i)`` and ``tau* = sum_{i: s x_i > 0} s x_i * s / sum_{i: s x_i > 0} w_i`` (0 when no
        agent agrees), else ``tau* = sum_i x_i``. With ``region`` (RAM-TIES) ``tau_i`` is first masked to
        ``|tau_i| > eps`` and elements moved by fewer than two agents get ``sum_i tau_i`` (the unique update or
        0) instead. Agents are summed in order 0..N-1 from +0, as the reference's ``sum_agents`` and
        ``_agreeing_weight`` do.
        """
        n, e = models.shape
        eps32 = np.float32(eps)
        u, f, inv, q, pow2 = drop
        dropping = u.shape[1] > 0
        bits = np.empty((n + 1, BLOCK), np.uint32)
        vals = bits.view(np.float32)
        x = np.empty((n, BLOCK), np.float32)
        acc, num, den = np.empty(BLOCK, np.float32), np.empty(BLOCK, np.float32), np.empty(BLOCK, np.float32)
        active, count = np.empty(BLOCK, np.float32), np.empty(BLOCK, np.int32)
        sign, code = np.empty(BLOCK, np.float32), np.empty(BLOCK, np.int32)
        tally = np.zeros((4, patterns.shape[0]), np.int64)
        bad = False
        for lo in range(0, e, BLOCK):
            hi = min(lo + BLOCK, e)
            m = hi - lo
            bad |= _load_block(ref, models, lo, hi, shift, bits)
            acc[:] = 0.0
            active[:] = 0.0
            count[:] = 0
            code[:] = 0
            for i in range(n):
                wi, bottom, top = w[i], low[i], high[i]
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
            for j in range(m):
                bad |= not np.isfinite(acc[j])
            if elect:
                num[:] = 0.0
                den[:] = 0.0
                for j in range(m):  # the elected sign
                    sign[j] = np.float32(1.0) if acc[j] > 0 else (np.float32(-1.0) if acc[j] < 0 else np.float32(0.0))
                for i in range(n):
                    wi = w[i]
                    for j in range(m):
                        y = x[i, j] * sign[j]
                        if y > 0:
                            num[j] += y
                            den[j] += wi
                for j in range(m):
                    r = (num[j] * sign[j]) / den[j] if den[j] != 0 else np.float32(0.0)
                    out[lo + j] = vals[0, j] + (active[j] if region and count[j] < 2 else lam * r)
            else:
                for j in range(m):
                    out[lo + j] = vals[0, j] + lam * acc[j]
            _add_patterns(code, m, tally)
        patterns += tally.sum(axis=0)
        return bad

    # ----------------------------------------------------------------------- torch.rand's stream (MT19937)

    _MT_N, _MT_M = 624, 397

    @_jit
    def _mt_mix(a: Any, b: Any, c: Any) -> Any:
        """One MT19937 recurrence step: ``c ^ twist(upper bit of a, lower bits of b)``."""
        y = (a & np.uint32(0x80000000)) | (b & np.uint32(0x7FFFFFFF))
        return np.uint32(c ^ (y >> np.uint32(1)) ^ (np.uint32(0x9908B0DF) * (b & np.uint32(1))))

    @_jit
    def _mt_twist(mt: Any) -> None:
        """The MT19937 state update of the 624-word state ``mt`` (uint32), in place, in three branch-free loops."""
        for k in range(_MT_N - _MT_M):
            mt[k] = _mt_mix(mt[k], mt[k + 1], mt[k + _MT_M])
        for k in range(_MT_N - _MT_M, _MT_N - 1):
            mt[k] = _mt_mix(mt[k], mt[k + 1], mt[k + _MT_M - _MT_N])
        mt[_MT_N - 1] = _mt_mix(mt[_MT_N - 1], mt[0], mt[_MT_M - 1])

    @_jit
    def _mt_uniform(seed: int, out: Any) -> None:
        """``out[:]`` = the first ``out.size`` draws of ``torch.rand`` (float32, CPU) after ``manual_seed(seed)``.

        torch's CPU generator is MT19937 initialised from the low 32 bits of the seed (``init_genrand``);
        a float32 draw is the low 24 bits of one tempered 32-bit output times 2**-24.
        """
        mt = np.empty(_MT_N, np.uint32)
        mt[0] = np.uint32(seed & 0xFFFFFFFF)
        for j in range(1, _MT_N):
            prev = np.uint64(mt[j - 1])
            word = np.uint64(1812433253) * (prev ^ (prev >> np.uint64(30))) + np.uint64(j)
            mt[j] = np.uint32(word & np.uint64(0xFFFFFFFF))
        scale = np.float32(1.0 / 16777216.0)
        pos = 0
        while pos < out.shape[0]:
            _mt_twist(mt)
            count = min(_MT_N, out.shape[0] - pos)
            for j in range(count):
                y = mt[j]
                y ^= y >> np.uint32(11)
                y ^= (y << np.uint32(7)) & np.uint32(0x9D2C5680)
                y ^= (y << np.uint32(15)) & np.uint32(0xEFC60000)
                y ^= y >> np.uint32(18)
                out[pos + j] = np.float32(y & np.uint32(0xFFFFFF)) * scale
            pos += count

# --------------------------------------------------------------------------- chunk inputs


@dataclass
class RawChunk:
    """One chunk's stored values as unsigned bit arrays the loops widen themselves.

    ``ref`` ``[E]`` and ``models`` ``[N, E]`` are uint16 (bf16 bits, ``shift`` 16) or uint32
    (float32 bits, ``shift`` 0).
    """

    ref: np.ndarray[Any, Any]
    models: np.ndarray[Any, Any]
    shift: int
    out: torch.Tensor | None = None  # [E] float32 buffer for the merged values (None: a new tensor)


def as_bits(t: torch.Tensor) -> tuple[np.ndarray[Any, Any], int]:
    """A bf16 or float32 tensor's storage as (uint16 | uint32 numpy view, shift); other dtypes go through float32."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16), 16
    return t.float().view(torch.int32).numpy().view(np.uint32), 0


def raw_chunk(ref: torch.Tensor, models: torch.Tensor) -> RawChunk:
    """``[E]`` and ``[N, E]`` tensors of one stored dtype -> ``RawChunk`` (bf16 and float32 without a copy)."""
    if ref.dtype != models.dtype or ref.dtype not in (torch.bfloat16, torch.float32):
        ref, models = ref.float(), models.float()
    r, shift = as_bits(ref)
    m, _ = as_bits(models)
    return RawChunk(r, m, shift)


# --------------------------------------------------------------------------- the fused kernels


@dataclass(frozen=True)
class FusedResult:
    """What a fused kernel returns: ``theta_0 + tau*`` (float32) and the chunk's pattern counts."""

    merged: torch.Tensor | None  # [E] float32, None for the counts-only pass
    patterns: torch.Tensor  # [2**N] int64
    finite: bool


@dataclass(frozen=True)
class FusedCall:
    """Everything but the values that a fused kernel needs for one chunk (elements ``start:stop`` of ``name``)."""

    params: Mapping[str, ParamValue]  # the method's params resolved for this tensor
    weights: torch.Tensor  # [N] float32
    stats: TensorStats = field(default_factory=TensorStats)
    eps: float = 1e-5  # the update threshold of the pattern counts
    name: str = ""
    start: int = 0
    stop: int = 0
    seed: int = 0
    model_params: tuple[Mapping[str, ParamValue], ...] = ()  # per model, when any model sets params


FusedKernel = Callable[[RawChunk, FusedCall], FusedResult]


def _out(raw: RawChunk) -> tuple[torch.Tensor, np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    n, e = raw.models.shape
    merged = raw.out if raw.out is not None else torch.empty(e, dtype=torch.float32)
    return merged, merged.numpy(), np.zeros(1 << n, dtype=np.int64)


def _ram(raw: RawChunk, eps: float, lam: torch.Tensor | None) -> FusedResult:
    merged, out, patterns = _out(raw)
    scales = (lam if lam is not None else torch.ones(raw.models.shape[0])).float().numpy()
    bad = _ram_loop(raw.ref, raw.models, raw.shift, eps, scales, lam is not None, out, patterns)
    return FusedResult(merged, torch.from_numpy(patterns), not bad)


def fused_ram(raw: RawChunk, call: FusedCall) -> FusedResult:
    """RAM over one chunk (``methods.ram``)."""
    return _ram(raw, call.eps, None)


def fused_ram_plus(raw: RawChunk, call: FusedCall) -> FusedResult:
    """RAM+ over one chunk (``methods.ram_plus``): lambda from the tensor's or the model's histogram."""
    hist = call.stats.tensor_hist if call.params["scope"] == "tensor" else call.stats.model_hist
    if hist is None:
        raise RuntimeError("ram_plus needs overlap statistics; the driver did not provide them")
    return _ram(raw, call.eps, methods.ram_lambdas(hist, call.params))


def _weighted(raw: RawChunk, weights: torch.Tensor, eps: float, scale: float, divide: bool) -> FusedResult:
    merged, out, patterns = _out(raw)
    w = weights.float().numpy()
    bad = _weighted_loop(raw.ref, raw.models, raw.shift, eps, w, scale, divide, out, patterns)
    return FusedResult(merged, torch.from_numpy(patterns), not bad)


def fused_linear(raw: RawChunk, call: FusedCall) -> FusedResult:
    """Weighted average (``methods.linear``): ``theta_0 + sum_i w_i tau_i / sum_i w_i``."""
    return _weighted(raw, call.weights, call.eps, float(call.weights.float().sum()), True)


def fused_task_arithmetic(raw: RawChunk, call: FusedCall) -> FusedResult:
    """Task arithmetic (``methods.task_arithmetic``): ``theta_0 + lambda * sum_i w_i tau_i``."""
    return _weighted(raw, call.weights, call.eps, float(_f32(call.params["lambda"])), False)


def _f32(value: ParamValue) -> np.float32:
    """A parameter as the float32 scalar torch multiplies a float32 tensor by."""
    return np.float32(float(value))


def fused_counts(raw: RawChunk, eps: float) -> FusedResult:
    """Pattern counts only (the statistics pass)."""
    patterns = np.zeros(1 << raw.models.shape[0], dtype=np.int64)
    bad = _count_loop(raw.ref, raw.models, raw.shift, eps, patterns)
    return FusedResult(None, torch.from_numpy(patterns), not bad)


# --------------------------------------------------------------------------- TIES and DARE

# DARE's drop as the loops take it: (u [N, E] f32 draws, f [N] f32, inv [N] f32, q [N] f64, pow2 [N] bool)
Drop = tuple[Any, Any, Any, Any, Any]


def seeded_uniform(seed: int, name: str, start: int, stop: int, rows: int) -> np.ndarray[Any, Any]:
    """``deltas.seeded_uniform`` as a ``[rows, stop - start]`` float32 array: the same values, by ``_mt_uniform``."""
    out = np.empty((rows, stop - start), np.float32)
    for block, b0, lo, hi in rng_blocks(start, stop):
        whole = lo == start and hi == stop and hi - lo == RNG_BLOCK  # the chunk is exactly this block
        draws = out if whole else np.empty((rows, RNG_BLOCK), np.float32)
        _mt_uniform(block_seed(seed, name, block), draws.reshape(-1))
        if not whole:
            out[:, lo - start : hi - start] = draws[:, lo - b0 : hi - b0]
    return out


def dare_drop_arrays(call: FusedCall, n: int) -> Drop:
    """DARE's drop of ``baselines.dare_drop`` for one chunk: the same draws and the same float32 arithmetic.

    Element ``p`` of agent ``i`` survives iff ``u_i[p] >= f_i`` (``f_i`` the smallest float32 ``>= p_i``) and
    becomes ``tau * (1 / q_i)`` when ``q_i = 1 - p_i`` is a power of two, else ``float32(tau / q_i)`` in float64.
    """
    u = seeded_uniform(call.seed, call.name, call.start, call.stop, n)
    p = baselines.agent_values(call.params, call.model_params, "p", n).tolist()
    f = np.array([float(baselines.f32_at_least(x)) for x in p], np.float32)
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


def upper_counts(raw: RawChunk, drop: Drop, eps: float = -1.0) -> tuple[torch.Tensor, bool]:
    """First radix pass over one chunk: ``[N, 2**16]`` counts of the upper 16 bits of ``|tau_i|``; finite?

    ``eps >= 0``: only RAM's shared region (2+ agents with ``|tau| > eps``) counts, masked magnitudes.
    """
    hist = np.zeros((raw.models.shape[0], 1 << 16), np.int64)
    bad = _upper_loop(raw.ref, raw.models, raw.shift, drop, eps, hist)
    return torch.from_numpy(hist), not bad


def lower_counts(raw: RawChunk, drop: Drop, bins: torch.Tensor, eps: float = -1.0) -> tuple[torch.Tensor, bool]:
    """Second radix pass: ``[N, R, 2**16]`` counts of the lower 16 bits of ``|tau_i|`` inside ``bins[i, r]``."""
    hist = np.zeros((*bins.shape, 1 << 16), np.int64)
    bad = _lower_loop(raw.ref, raw.models, raw.shift, drop, eps, bins.numpy(), hist)
    return torch.from_numpy(hist), not bad


RankRule = Callable[[Mapping[str, ParamValue], Sequence[Mapping[str, ParamValue]]], baselines.RankFn]


@dataclass(frozen=True)
class TiesForm:
    """Which steps of the TIES/DARE/Breadcrumbs family a method takes."""

    drop: bool  # DARE's random drop and rescale
    elect: bool  # sign election and disjoint mean (else the weighted sum)
    trim: bool  # keep a band of magnitudes per agent and tensor (TIES: when some density is below 1)
    ranks: RankRule = baselines.top_ranks  # the ranks of the band's bounds: [N, 1] lower, or [N, 2] lower, upper
    always: bool = False  # trim even when every density is 1 (Breadcrumbs also drops the largest)
    region: bool = False  # RAM-TIES: masks |tau| > epsilon; TIES (unweighted) on the shared region only


TIES_FORMS: dict[Callable[[Chunk], torch.Tensor], TiesForm] = {
    baselines.ties: TiesForm(drop=False, elect=True, trim=True),
    baselines.dare_ties: TiesForm(drop=True, elect=True, trim=True),
    baselines.dare_linear: TiesForm(drop=True, elect=False, trim=False),
    baselines.breadcrumbs: TiesForm(drop=False, elect=False, trim=True, ranks=baselines.crumb_ranks, always=True),
    baselines.ram_ties: TiesForm(
        drop=False, elect=True, trim=True, ranks=baselines.keep_ranks, always=True, region=True
    ),
}


def ties_form(method: Method) -> TiesForm | None:
    """The TIES/DARE steps of ``method``'s kernel, or None if it is not one of that family."""
    return TIES_FORMS.get(method.kernel)


def chunk_drop(form: TiesForm, call: FusedCall, n: int) -> Drop:
    return dare_drop_arrays(call, n) if form.drop else no_drop(n)


def trims(form: TiesForm, call: FusedCall) -> bool:
    """Whether this tensor is trimmed (Breadcrumbs always; TIES when some agent keeps less than all)."""
    return form.trim and (form.always or not baselines.all_dense(call.params, call.model_params))


def region_eps(form: TiesForm, call: FusedCall) -> float:
    """The update threshold of RAM-TIES's shared region, or -1 (no region) for the other methods."""
    return float(call.params["epsilon"]) if form.region else -1.0


def band_plan(hist: torch.Tensor, form: TiesForm, call: FusedCall) -> baselines.RadixPlan:
    """The radix plan of the band's bounds from a tensor's first-pass counts (``d`` = the values counted)."""
    ranks = form.ranks(call.params, call.model_params)(int(hist[0].sum()), hist.shape[0])
    return baselines.radix_plan(hist, ranks)


def chunk_thresholds(raw: RawChunk, drop: Drop, call: FusedCall, form: TiesForm) -> torch.Tensor | None:
    """``[N, R]`` band bounds of a tensor that is this one chunk (two radix passes over it); None if not finite."""
    eps = region_eps(form, call)
    hist, ok = upper_counts(raw, drop, eps)
    if not ok:
        return None
    plan = band_plan(hist, form, call)
    lo_hist, ok = lower_counts(raw, drop, plan.bin_table(), eps) if plan.wanted else (plan.lower_histogram(), True)
    return plan.found(lo_hist) if ok else None


def _band(thr: torch.Tensor | None, n: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]] | None:
    """``[N, 1]`` (lower bound only) or ``[N, 2]`` bounds -> float32 ``(low [N], high [N])``; +inf when unbounded."""
    if thr is None:
        return None
    t = torch.as_tensor(thr).float()
    high = t[:, 1] if t.shape[1] > 1 else torch.full((n,), math.inf)
    return t[:, 0].contiguous().numpy(), high.contiguous().numpy()


def _ties_family(form: TiesForm) -> FusedKernel:
    def kernel(raw: RawChunk, call: FusedCall) -> FusedResult:
        n = raw.models.shape[0]
        drop = chunk_drop(form, call, n)
        thr: torch.Tensor | None = torch.zeros(n, 1)
        if trims(form, call):
            prepared = call.stats.prepared
            thr = prepared if prepared is not None else chunk_thresholds(raw, drop, call, form)
        band = _band(thr, n)
        merged, out, patterns = _out(raw)
        if band is None:
            return FusedResult(merged, torch.from_numpy(patterns), False)
        w = (torch.ones(n) if form.region else call.weights).float().numpy()  # RAM-TIES: no weights, no lambda
        lam = np.float32(1.0) if form.region else _f32(call.params["lambda"])
        low, high = band
        bad = _ties_loop(
            raw.ref, raw.models, raw.shift, call.eps, drop, low, high, w, lam, form.elect, form.region, out, patterns
        )
        return FusedResult(merged, torch.from_numpy(patterns), not bad)

    return kernel


# the reference kernel each fused kernel reproduces bit for bit
FUSED: dict[Callable[[Chunk], torch.Tensor], FusedKernel] = {
    methods.ram: fused_ram,
    methods.ram_plus: fused_ram_plus,
    methods.linear: fused_linear,
    methods.task_arithmetic: fused_task_arithmetic,
    **{kernel: _ties_family(form) for kernel, form in TIES_FORMS.items()},
}


def fused_kernel(method: Method, n_models: int) -> FusedKernel | None:
    """The fused kernel that reproduces ``method``'s kernel for ``n_models`` agents, or None (use the reference).

    Methods with a ``prepare`` pass are fused only when this module computes the same statistics
    (the TIES family's exact thresholds).
    """
    if not available() or n_models > MAX_AGENTS or method.model_inputs:
        return None
    if method.prepare is not None and ties_form(method) is None:
        return None
    return FUSED.get(method.kernel)


def per_model_params(method: Method) -> bool:
    """Whether the fused kernel of ``method`` honours per-model parameters (the TIES family does)."""
    return ties_form(method) is not None


def counts_available(n_models: int) -> bool:
    """Whether the statistics pass can count with the fused loop."""
    return available() and n_models <= MAX_AGENTS
