"""Compiled block dot products (numba), bit for bit ``stats._dot_blocks``: the Gram statistics of Model Stock,
SLERP, Karcher, Multi-SLERP, NuSLERP and SCE's mean squares.

Per fixed block of ``STAT_BLOCK`` elements and pair of vectors (a, b): the float64 products ``v_a * v_b``
(exact for float32 inputs), zero-padded to the block, summed by pairwise halving (``x[j] + x[j + h]``,
h = 512, 256, ..., 1), the order ``stats.block_sums`` uses, so the sums are the torch path's bits.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from agentmerge.methods.fused.jit import jit


@jit
def dot_blocks_loop(v: Any, block: int, diagonal: bool, out: Any) -> None:
    """``v [K, E]`` float32 -> ``out [K, K, ceil(E / block)]`` float64 pairwise-halved block sums of products
    (``diagonal``: only the squares ``v_a * v_a``; the other entries stay zero)."""
    k, e = v.shape
    buf = np.empty(block, np.float64)
    for b in range(out.shape[2]):
        lo = b * block
        m = min(block, e - lo)
        for a in range(k):
            for c in range(a, a + 1 if diagonal else k):
                for j in range(m):
                    buf[j] = np.float64(v[a, lo + j]) * np.float64(v[c, lo + j])
                out[a, c, b] = out[c, a, b] = halved(buf, m, block)


def dot_blocks(vectors: torch.Tensor, block: int, diagonal: bool = False) -> torch.Tensor:
    """``[K, E]`` float32 -> ``[K, K, nb]`` float64 block sums of every product (``block`` a power of two);
    ``diagonal``: of the squares only."""
    k, e = vectors.shape
    out = np.zeros((k, k, -(-e // block)), np.float64)
    dot_blocks_loop(vectors.float().contiguous().numpy(), block, diagonal, out)
    return torch.from_numpy(out)


@jit
def halved(buf: Any, m: int, block: int) -> float:
    """The pairwise-halved sum of ``buf[:m]`` zero-padded to ``block`` (``stats.block_sums``'s order)."""
    for j in range(m, block):
        buf[j] = 0.0
    h = block
    while h > 1:
        h //= 2
        for j in range(h):
            buf[j] = buf[j] + buf[j + h]
    return float(buf[0])


@jit
def add_bucket(parts: Any, row: int, s: float, offset: int) -> None:
    """``parts[row]`` += the limbs of the float64 ``s = M 2^(e - 53)`` in bucket ``e + offset`` (``exactsum``)."""
    if s != 0.0:
        m, e = math.frexp(s)
        big = np.int64(m * 9007199254740992.0)  # 2**53: exact
        parts[row, e + offset, 0] += big >> 26
        parts[row, e + offset, 1] += big & 67108863  # 2**26 - 1
