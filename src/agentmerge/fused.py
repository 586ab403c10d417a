"""Optional fused chunk kernels (numba): one pass over the raw input bits per chunk.

The reference kernels in ``methods.py`` are written as readable torch expressions; each makes several
passes over ``[N, E]`` float32 temporaries. For the methods whose rule is a per-element loop over
agents (RAM, RAM+, linear, task arithmetic) this module runs the same float32 arithmetic in one
compiled loop per chunk: it widens the stored bits (bf16 or float32) itself, computes the update
mask, the overlap count, the merged value ``theta_0 + tau*`` and the chunk's overlap *pattern*
counts (how many elements each set of updating agents has; the ``[N, N]`` histogram follows from
them), and flags non-finite inputs, all without temporaries larger than a cache-sized block.

Results are bit-identical to the reference kernels (tests/test_speed_paths.py checks this): the same
float32 operations in the same order (agents summed 0..N-1 from zero, as ``deltas.sum_agents`` does), no
fused multiply-add, no fast-math. Only methods whose kernel is the very function listed in ``FUSED`` are
fused, so a changed reference kernel silently falls back to itself rather than to a stale copy.

The fast path is used when numba is installed (``pip install agentmerge[fast]``) unless the
environment sets ``AGENTMERGE_FUSED=0``; everything works without it, only slower.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from agentmerge import methods
from agentmerge.deltas import MAX_PATTERN_AGENTS
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


# (chunk, the tensor's params, model weights, statistics, mask threshold of the pattern counts)
FusedKernel = Callable[[RawChunk, Mapping[str, ParamValue], torch.Tensor, TensorStats, float], FusedResult]


def _out(raw: RawChunk) -> tuple[torch.Tensor, np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    n, e = raw.models.shape
    merged = raw.out if raw.out is not None else torch.empty(e, dtype=torch.float32)
    return merged, merged.numpy(), np.zeros(1 << n, dtype=np.int64)


def _ram(raw: RawChunk, eps: float, lam: torch.Tensor | None) -> FusedResult:
    merged, out, patterns = _out(raw)
    scales = (lam if lam is not None else torch.ones(raw.models.shape[0])).float().numpy()
    bad = _ram_loop(raw.ref, raw.models, raw.shift, eps, scales, lam is not None, out, patterns)
    return FusedResult(merged, torch.from_numpy(patterns), not bad)


def fused_ram(
    raw: RawChunk, params: Mapping[str, ParamValue], weights: torch.Tensor, stats: TensorStats, eps: float
) -> FusedResult:
    """RAM over one chunk (``methods.ram``)."""
    return _ram(raw, eps, None)


def fused_ram_plus(
    raw: RawChunk, params: Mapping[str, ParamValue], weights: torch.Tensor, stats: TensorStats, eps: float
) -> FusedResult:
    """RAM+ over one chunk (``methods.ram_plus``): lambda from the tensor's or the model's histogram."""
    hist = stats.tensor_hist if params["scope"] == "tensor" else stats.model_hist
    if hist is None:
        raise RuntimeError("ram_plus needs overlap statistics; the driver did not provide them")
    return _ram(raw, eps, methods.ram_lambdas(hist, params))


def _weighted(raw: RawChunk, weights: torch.Tensor, eps: float, scale: float, divide: bool) -> FusedResult:
    merged, out, patterns = _out(raw)
    w = weights.float().numpy()
    bad = _weighted_loop(raw.ref, raw.models, raw.shift, eps, w, scale, divide, out, patterns)
    return FusedResult(merged, torch.from_numpy(patterns), not bad)


def fused_linear(
    raw: RawChunk, params: Mapping[str, ParamValue], weights: torch.Tensor, stats: TensorStats, eps: float
) -> FusedResult:
    """Weighted average (``methods.linear``): ``theta_0 + sum_i w_i tau_i / sum_i w_i``."""
    return _weighted(raw, weights, eps, float(weights.float().sum()), True)


def fused_task_arithmetic(
    raw: RawChunk, params: Mapping[str, ParamValue], weights: torch.Tensor, stats: TensorStats, eps: float
) -> FusedResult:
    """Task arithmetic (``methods.task_arithmetic``): ``theta_0 + lambda * sum_i w_i tau_i``."""
    return _weighted(raw, weights, eps, float(torch.tensor(float(params["lambda"]), dtype=torch.float32)), False)


def fused_counts(raw: RawChunk, eps: float) -> FusedResult:
    """Pattern counts only (the statistics pass)."""
    patterns = np.zeros(1 << raw.models.shape[0], dtype=np.int64)
    bad = _count_loop(raw.ref, raw.models, raw.shift, eps, patterns)
    return FusedResult(None, torch.from_numpy(patterns), not bad)


# the reference kernel each fused kernel reproduces bit for bit
FUSED: dict[Callable[[Chunk], torch.Tensor], FusedKernel] = {
    methods.ram: fused_ram,
    methods.ram_plus: fused_ram_plus,
    methods.linear: fused_linear,
    methods.task_arithmetic: fused_task_arithmetic,
}


def fused_kernel(method: Method, n_models: int) -> FusedKernel | None:
    """The fused kernel that reproduces ``method``'s kernel for ``n_models`` agents, or None (use the reference)."""
    if not available() or n_models > MAX_AGENTS or method.prepare is not None or method.model_inputs:
        return None
    return FUSED.get(method.kernel)


def counts_available(n_models: int) -> bool:
    """Whether the statistics pass can count with the fused loop."""
    return available() and n_models <= MAX_AGENTS
