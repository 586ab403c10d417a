"""Compiled Karcher, Multi-SLERP and NuSLERP (numba), bit for bit ``kernels.py``.

A multi-chunk tensor's Gram matrix is counted chunk-parallel before the merge (``Rounds``: the block sums
and integer buckets of ``exactsum``, which add up the same in any order), a one-chunk tensor's by the kernel itself; the
N coefficients come from the Gram matrix exactly as in ``kernels.py`` (the same Python code), and one pass
then writes ``theta_0 + sum_j k_j tau_j (+ (sum_j k_j - 1) theta_0 on raw weights)`` with the reference
kernel's float32 operations in its order, and counts the update patterns as every compiled kernel does.
NuSLERP's row and column modes run on the reference kernels (``nuslerp_flatten`` is reference-only).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from agentmerge.methods.exactsum import BUCKETS, OFFSET, gram, pairs_of
from agentmerge.methods.fused.gram import add_bucket, halved
from agentmerge.methods.fused.jit import BLOCK, jit
from agentmerge.methods.fused.kernels import output, raw_chunk
from agentmerge.methods.fused.loops import add_patterns, load_block
from agentmerge.methods.spec import ChunkSpec, Compiled, CompiledResult, Rounds
from agentmerge.methods.spherical.kernels import (
    _with_reference,
    karcher_coefficients,
    multislerp_coefficients,
    nuslerp_coefficients,
    nuslerp_t,
)
from agentmerge.methods.stats import STAT_BLOCK


@jit
def gram_loop(ref: Any, models: Any, shift: int, raw: bool, pa: Any, pb: Any, block: int, parts: Any) -> bool:
    """``parts [P, BUCKETS, 2] +=`` the buckets of each ``block``-element sum of ``x_a * x_b`` per pair (pa[p],
    pb[p]); x_i = tau_i, or the raw weights ``theta_0 + tau_i`` (float32, as the reference computes them).
    True if an input is not finite."""
    n, e = models.shape
    bits = np.empty((n + 1, block), np.uint32)
    vals = bits.view(np.float32)
    x = np.empty((n, block), np.float64)
    buf = np.empty(block, np.float64)
    for lo in range(0, e, block):
        hi = min(lo + block, e)
        if load_block(ref, models, lo, hi, shift, bits):
            return True
        for i in range(n):
            for j in range(hi - lo):
                t = vals[i + 1, j] - vals[0, j]
                x[i, j] = np.float64(vals[0, j] + t) if raw else np.float64(t)
        for p in range(pa.shape[0]):
            a, b = pa[p], pb[p]
            for j in range(hi - lo):
                buf[j] = x[a, j] * x[b, j]
            add_bucket(parts, p, halved(buf, hi - lo, block), OFFSET)
    return False


@jit
def combine_loop(
    ref: Any, models: Any, shift: int, eps: float, k: Any, c: Any, raw: bool, out: Any, patterns: Any
) -> bool:
    """``out = ref + (sum_i k_i tau_i + c ref if raw)``, agents in order from zero; patterns; True if non-finite."""
    n, e = models.shape
    eps32 = np.float32(eps)
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
            ki = k[i]
            for j in range(m):
                t = vals[i + 1, j] - vals[0, j]
                acc[j] += t * ki
                code[j] |= np.int32(abs(t) > eps32) << i
        for j in range(m):
            d = acc[j] + vals[0, j] * c if raw else acc[j]
            out[lo + j] = vals[0, j] + d
        add_patterns(code, m, tally)
    patterns += tally.sum(axis=0)
    return bad


@jit
def pair_loop(ref: Any, models: Any, shift: int, eps: float, k: Any, raw: bool, out: Any, patterns: Any) -> bool:
    """NuSLERP: ``out = ref + (k0 tau_0 + k1 tau_1 (+ k2 ref if raw))``; patterns; True if non-finite."""
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
        for j in range(m):
            t0, t1 = vals[1, j] - vals[0, j], vals[2, j] - vals[0, j]
            d = k[0] * t0 + k[1] * t1
            d = d + k[2] * vals[0, j] if raw else d
            out[lo + j] = vals[0, j] + d
            code[j] = np.int32(abs(t0) > eps32) | (np.int32(abs(t1) > eps32) << 1)
        add_patterns(code, m, tally)
    patterns += tally.sum(axis=0)
    return bad


def _raw_space(method: str, spec: ChunkSpec) -> bool:
    """Whether the method's vectors are the raw weights (Karcher always; the others without a base)."""
    return method == "karcher" or not spec.has_base


def gram_counts(method: str) -> Callable[[torch.Tensor, torch.Tensor, ChunkSpec, Any], tuple[torch.Tensor, bool]]:
    """A round of the Gram statistics: one chunk's exact product buckets of every pair of the method's vectors."""

    def count(ref: torch.Tensor, models: torch.Tensor, spec: ChunkSpec, state: Any) -> tuple[torch.Tensor, bool]:
        raw = raw_chunk(ref, models)
        pairs = pairs_of(raw.models.shape[0])
        pa = np.array([a for a, _ in pairs], np.int64)
        pb = np.array([b for _, b in pairs], np.int64)
        parts = np.zeros((len(pairs), BUCKETS, 2), np.int64)
        bad = gram_loop(raw.ref, raw.models, raw.shift, _raw_space(method, spec), pa, pb, STAT_BLOCK, parts)
        return torch.from_numpy(parts), not bad

    return count


def _rounds(method: str) -> Rounds:
    return Rounds(
        wanted=lambda spec: True,
        count=gram_counts(method),
        settle=lambda total, spec, state: gram(total, len(spec.weights)),
        done=lambda state: isinstance(state, torch.Tensor),
    )


def _gram_of(method: str, ref: torch.Tensor, models: torch.Tensor, spec: ChunkSpec) -> torch.Tensor | None:
    """The tensor's Gram matrix: from the rounds, or counted on this chunk (a whole tensor); None if not finite."""
    if spec.stats.prepared is not None:
        return torch.as_tensor(spec.stats.prepared)
    parts, finite = gram_counts(method)(ref, models, spec, None)
    return gram(parts, models.shape[0]) if finite else None


def _combine(
    ref: torch.Tensor, models: torch.Tensor, spec: ChunkSpec, k: torch.Tensor, raw: bool, out: Any
) -> CompiledResult:
    chunk = raw_chunk(ref, models)
    merged, patterns = output(chunk, out)
    c = np.float32(float(k.sum() - 1.0))
    bad = combine_loop(
        chunk.ref, chunk.models, chunk.shift, spec.eps, k.float().numpy(), c, raw, merged.numpy(), patterns
    )
    return CompiledResult(merged, torch.from_numpy(patterns), not bad)


def _not_finite(ref: torch.Tensor, models: torch.Tensor, out: Any) -> CompiledResult:
    merged, patterns = output(raw_chunk(ref, models), out)
    return CompiledResult(merged, torch.from_numpy(patterns), False)


def karcher(
    ref: torch.Tensor, models: torch.Tensor, spec: ChunkSpec, out: torch.Tensor | None = None
) -> CompiledResult:
    """Karcher mean over one chunk (``spherical.karcher``)."""
    if models.shape[0] == 1:
        return _combine(ref, models, spec, torch.ones(1, dtype=torch.float64), False, out)
    g = _gram_of("karcher", ref, models, spec)
    if g is None:
        return _not_finite(ref, models, out)
    k = karcher_coefficients(g, int(spec.params["max_iter"]), float(spec.params["tol"]))
    return _combine(ref, models, spec, k, True, out)


def multislerp(
    ref: torch.Tensor, models: torch.Tensor, spec: ChunkSpec, out: torch.Tensor | None = None
) -> CompiledResult:
    """Multi-SLERP over one chunk (``spherical.multislerp``)."""
    if models.shape[0] == 1:
        return _combine(ref, models, spec, torch.ones(1, dtype=torch.float64), False, out)
    g = _gram_of("multislerp", ref, models, spec)
    if g is None:
        return _not_finite(ref, models, out)
    w = spec.weights.double()
    w = w / w.sum() if bool(spec.params["normalize_weights"]) else w
    k = multislerp_coefficients(g, w, float(spec.params["eps"]), spec.name)
    return _combine(ref, models, spec, k, not spec.has_base, out)


def nuslerp(
    ref: torch.Tensor, models: torch.Tensor, spec: ChunkSpec, out: torch.Tensor | None = None
) -> CompiledResult:
    """NuSLERP over one chunk, flattened (``spherical.nuslerp``)."""
    g = _gram_of("nuslerp", ref, models, spec)
    if g is None:
        return _not_finite(ref, models, out)
    ab = nuslerp_coefficients(g[0, 0:1], g[1, 1:2], g[0, 1:2], nuslerp_t(spec.weights))
    k = _with_reference(ab).float()[:, 0].numpy()
    chunk = raw_chunk(ref, models)
    merged, patterns = output(chunk, out)
    bad = pair_loop(chunk.ref, chunk.models, chunk.shift, spec.eps, k, not spec.has_base, merged.numpy(), patterns)
    return CompiledResult(merged, torch.from_numpy(patterns), not bad)


KARCHER = Compiled(karcher, _rounds("karcher"))
MULTISLERP = Compiled(multislerp, _rounds("multislerp"))
NUSLERP = Compiled(nuslerp, _rounds("nuslerp"))
