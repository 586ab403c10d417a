"""Exact sums of products of float32 values: whole-tensor dot products that no chunking or order can change.

The product of two float32 numbers is exact in float64 (at most 48 significant bits). Written with
``frexp`` as ``p = M 2^(e - 53)``, M a signed integer below 2^53, it is added into the bucket of its exponent e
as two integer limbs, ``M = hi 2^26 + lo`` (hi = M >> 26, lo = M & (2^26 - 1)). Integer sums are exact and
commute, so the buckets of a tensor's chunks add up to the same totals in any order, on any thread, whatever
the chunk boundaries; ``value`` turns a bucket row into the exact sum (a Fraction) and ``gram`` rounds each
to float64 once. With chunks of at most 2^20 elements an int64 limb sum cannot overflow below 2^36 elements.

Used by SCE (sums of squares) and the spherical methods (Gram matrices); the compiled twins
(``fused.field.square_loop``, ``fused.sphere``) fill the very same buckets.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import torch

BUCKETS = 640  # frexp exponents of nonzero products of float32 values: -297 <= e <= 257
OFFSET = 320
LIMB = 26
SLICE = 1 << 18  # elements per slice of the float64 / int64 temporaries


def pairs_of(k: int) -> list[tuple[int, int]]:
    """The upper triangle of a ``k x k`` Gram matrix, row by row: (0, 0), (0, 1), ..., (k - 1, k - 1)."""
    return [(a, b) for a in range(k) for b in range(a, k)]


def product_parts(vectors: torch.Tensor, pairs: Sequence[tuple[int, int]]) -> torch.Tensor:
    """``[K, E]`` float32 -> ``[P, BUCKETS, 2]`` int64 limb sums of ``vectors[a] * vectors[b]`` per pair."""
    out = torch.zeros(len(pairs), BUCKETS, 2, dtype=torch.int64)
    for s in range(0, vectors.shape[1], SLICE):
        v = vectors[:, s : s + SLICE].double()
        for row, (a, b) in enumerate(pairs):
            m, e = torch.frexp(v[a] * v[b])
            big = (m * 2.0**53).long()
            idx = (e + OFFSET).long()
            out[row, :, 0].scatter_add_(0, idx, big >> LIMB)
            out[row, :, 1].scatter_add_(0, idx, big & ((1 << LIMB) - 1))
    return out


def value(parts: torch.Tensor) -> Fraction:
    """``[BUCKETS, 2]`` limb sums -> the exact sum they stand for."""
    total = Fraction(0)
    for e, (hi, lo) in enumerate(parts.tolist()):
        if hi or lo:
            total += ((hi << LIMB) + lo) * Fraction(2) ** (e - OFFSET - 53)
    return total


def gram(parts: torch.Tensor, k: int) -> torch.Tensor:
    """``[P, BUCKETS, 2]`` buckets of ``pairs_of(k)`` -> ``[k, k]`` float64 Gram matrix, each entry rounded once."""
    g = torch.empty(k, k, dtype=torch.float64)
    for row, (a, b) in enumerate(pairs_of(k)):
        g[a, b] = g[b, a] = float(value(parts[row]))
    return g


def vectors_gram(vectors: torch.Tensor) -> torch.Tensor:
    """``[K, E]`` float32 -> its exact ``[K, K]`` Gram matrix (one chunk that is its whole tensor)."""
    return gram(product_parts(vectors, pairs_of(vectors.shape[0])), vectors.shape[0])
