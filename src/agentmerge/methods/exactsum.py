"""Exact, order-free sums of products of float32 values: SCE's sums of squares, the spherical methods' Gram matrices.

A tensor is cut into fixed blocks of ``STAT_BLOCK`` elements (chunks start on a block, so the cut never depends
on the chunking); each block's sum of products is the float64 pairwise-halved sum of ``stats`` (its compiled twin
``fused.gram`` gives the same bits). The block sums are then added exactly: each float64 ``s = M 2^(e - 53)``
(``frexp``; M a signed integer below 2^53) goes into the bucket of its exponent e as two integer limbs,
``M = hi 2^26 + lo`` (hi = M >> 26, lo = M & (2^26 - 1)). Integer sums commute, so the buckets of a tensor's
chunks add up to the same totals in any order, on any thread; ``value`` turns a bucket row into the exact sum
of the block sums (a Fraction) and ``gram`` rounds each to float64 once. An int64 limb sum cannot overflow
below 2^36 blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import torch

from agentmerge.methods.stats import block_products, square_blocks

BUCKETS = 640  # frexp exponents of nonzero sums of products of float32 values: -297 <= e < 300
OFFSET = 320
LIMB = 26


def pairs_of(k: int) -> list[tuple[int, int]]:
    """The upper triangle of a ``k x k`` Gram matrix, row by row: (0, 0), (0, 1), ..., (k - 1, k - 1)."""
    return [(a, b) for a in range(k) for b in range(a, k)]


def bucket(sums: torch.Tensor) -> torch.Tensor:
    """``[..., nb]`` float64 block sums -> ``[..., BUCKETS, 2]`` int64 limb sums per frexp exponent."""
    m, e = torch.frexp(sums)
    big = (m * 2.0**53).long()
    idx = (e + OFFSET).long()
    out = torch.zeros(*sums.shape[:-1], BUCKETS, 2, dtype=torch.int64)
    out[..., 0].scatter_add_(-1, idx, big >> LIMB)
    out[..., 1].scatter_add_(-1, idx, big & ((1 << LIMB) - 1))
    return out


def product_parts(vectors: torch.Tensor, pairs: Sequence[tuple[int, int]], start: int) -> torch.Tensor:
    """``[K, E]`` float32 starting at element ``start`` (a block boundary) -> ``[P, BUCKETS, 2]`` int64 buckets of
    the block sums of ``vectors[a] * vectors[b]`` for each pair."""
    if all(a == b for a, b in pairs):
        squares = square_blocks(vectors, start)
        return bucket(torch.stack([squares[a] for a, _ in pairs]))
    blocks = block_products(vectors, start)
    return bucket(torch.stack([blocks[a, b] for a, b in pairs]))


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
    """``[K, E]`` float32 -> its ``[K, K]`` Gram matrix (one chunk that is its whole tensor)."""
    return gram(product_parts(vectors, pairs_of(vectors.shape[0]), 0), vectors.shape[0])
