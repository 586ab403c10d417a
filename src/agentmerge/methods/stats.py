"""Exact whole-tensor statistics, computed over a tensor one chunk at a time.

- k-th smallest values (thresholds of TIES, Breadcrumbs, RAM-TIES): a two-pass radix select on the
  float32 bit patterns, which order like the values for non-negative floats. The first pass counts the
  upper 16 bits per agent and finds the bin holding each wanted rank (``radix_plan``); the second counts
  the lower 16 bits inside that bin (``RadixPlan.found``). The result is the exact value
  ``torch.kthvalue`` would give, in bounded memory.
- Dot products (Model Stock, SLERP): float64 sums over fixed ``STAT_BLOCK``-element blocks, added
  pairwise, so that they do not depend on where chunks start.

A one-chunk tensor needs no separate pass: its kernel computes the same statistics from the chunk
(``tensor_thresholds``, ``tensor_gram``); for a multi-chunk tensor the driver runs the method's
``prepare`` (built from ``magnitude_thresholds`` / ``gram_prepare``) before merging it.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from agentmerge.methods.fused.gram import dot_blocks
from agentmerge.methods.fused.jit import available
from agentmerge.methods.spec import Chunk, TensorSource

STAT_BLOCK = 1024  # elements per block of a dot-product sum; chunks of model_stock/slerp start on a block
_HI = 1 << 16  # radix select: bins of the upper and lower 16 bits of a float32

RankFn = Callable[[int, int], torch.Tensor]  # (count d, agents N) -> [N, R] int64 ascending ranks (1-based)


# --------------------------------------------------------------------------- exact k-th magnitudes


def _special(ranks: torch.Tensor, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank 0 means 0.0 (keep everything), rank > d means +inf (keep nothing): masks of both."""
    return ranks <= 0, ranks > d


def kth_direct(values: torch.Tensor, ranks: torch.Tensor) -> torch.Tensor:
    """``[N, d]`` non-negative float32, ``[N, R]`` 1-based ranks -> ``[N, R]`` float32 rank-th smallest values."""
    d = values.shape[1]
    out = torch.empty(ranks.shape, dtype=torch.float32)
    low, high = _special(ranks, d)
    for i in range(ranks.shape[0]):
        positive: torch.Tensor | None = None  # sparse task vectors: select among the nonzero values only
        for j in range(ranks.shape[1]):
            if low[i, j] or high[i, j]:
                out[i, j] = 0.0 if low[i, j] else math.inf
                continue
            if positive is None:
                positive = values[i][values[i] > 0]
            r = int(ranks[i, j]) - (d - positive.numel())  # rank among the positive values
            out[i, j] = kth_value(positive, r) if r > 0 else 0.0
    return out


def kth_value(x: torch.Tensor, r: int, sample: int = 1 << 14) -> torch.Tensor:
    """``[d]`` float32, ``1 <= r <= d`` -> the exact r-th smallest value (a 0-d tensor).

    A sorted strided sample of ``x`` brackets the rank; only the elements inside the bracket go to
    ``torch.kthvalue`` (with the count below it subtracted). If the bracket misses, the whole of ``x`` does.
    """
    d = x.numel()
    if d <= 4 * sample:
        return torch.kthvalue(x, r).values
    probe = torch.sort(x[:: d // sample]).values
    m = probe.numel()
    centre, width = r / d * m, 4.0 * math.sqrt(m) + 2.0
    lo_i, hi_i = int(centre - width), int(centre + width)
    lo = float(probe[lo_i]) if lo_i >= 0 else -math.inf
    hi = float(probe[hi_i]) if hi_i < m else math.inf
    below = int(torch.count_nonzero(x < lo))
    band = x[(x >= lo) & (x <= hi)]
    if below < r <= below + band.numel():
        return torch.kthvalue(band, r - below).values
    return torch.kthvalue(x, r).values


def kth_streamed(batches: Callable[[], Iterator[torch.Tensor]], rank_fn: RankFn) -> torch.Tensor:
    """Exact ``[N, R]`` rank-th smallest values over all ``[N, E]`` batches, holding one batch at a time.

    Two passes: a histogram of the upper 16 bits of each float32 finds the bin holding each rank; a
    histogram of the lower 16 bits inside that bin finds the value. Non-negative float32 values order
    like their int32 bit patterns, so the result is the exact value ``torch.kthvalue`` would give.
    """
    hist: torch.Tensor | None = None
    d = 0
    for v in batches():
        hist = _upper_histogram(v) if hist is None else hist.add_(_upper_histogram(v))
        d += v.shape[1]
    if hist is None:
        raise ValueError("kth_streamed: no batches")
    plan = radix_plan(hist, rank_fn(d, hist.shape[0]))
    lo_hist = plan.lower_histogram()
    for v in batches() if plan.wanted else ():
        bits = _bits(v)
        hi = _upper_bits(bits)
        for i, j, b in plan.wanted:
            in_bin = bits[i][hi[i] == b]  # the few values whose upper bits match: select, then mask
            lo_hist[i, j] += torch.bincount(in_bin & (_HI - 1), minlength=_HI)
    return plan.found(lo_hist)


@dataclass(frozen=True)
class RadixPlan:
    """Where each wanted rank lies after the first radix pass: its upper-16-bit bin and the count below it."""

    ranks: torch.Tensor  # [N, R] int64, 1-based (<= 0: 0.0, > d: +inf)
    bins: torch.Tensor  # [N, R] int64 upper-16-bit bin holding each rank
    below: torch.Tensor  # [N, R] int64 values in lower bins
    low: torch.Tensor  # [N, R] bool: rank <= 0, the value is 0.0 (keep everything)
    valid: torch.Tensor  # [N, R] bool: a rank inside 1..d (the others need no second pass)

    @property
    def wanted(self) -> list[tuple[int, int, int]]:
        """``(agent, rank index, bin)`` of every rank the second pass must resolve."""
        return [(i, j, int(self.bins[i, j])) for i, j in self.valid.nonzero().tolist()]

    def bin_table(self) -> torch.Tensor:
        """``[N, R]`` int32 bins to look into, -1 where no second pass is needed."""
        return torch.where(self.valid, self.bins, -1).to(torch.int32)

    def lower_histogram(self) -> torch.Tensor:
        """A zeroed ``[N, R, 2**16]`` int64 histogram of the lower 16 bits, for the second pass."""
        return torch.zeros(*self.ranks.shape, _HI, dtype=torch.int64)

    def found(self, lo_hist: torch.Tensor) -> torch.Tensor:
        """``[N, R]`` float32 values, given the second pass's lower-bit histogram inside each wanted bin."""
        out = torch.where(self.low, 0.0, math.inf).float()
        if not bool(self.valid.any()):
            return out
        lo_bin = torch.searchsorted(lo_hist.cumsum(2), (self.ranks - self.below)[..., None]).squeeze(-1)
        value = ((self.bins << 16) | lo_bin.clamp(max=_HI - 1)).to(torch.int32).view(torch.float32)
        return torch.where(self.valid, value, out)


def radix_plan(hist: torch.Tensor, ranks: torch.Tensor) -> RadixPlan:
    """``[N, 2**16]`` counts of the upper 16 bits of ``d`` values per agent, ``[N, R]`` ranks -> ``RadixPlan``."""
    d = int(hist[0].sum())
    low, high = _special(ranks, d)
    cum = hist.cumsum(1)
    r = ranks.clamp(1, max(d, 1))
    bins = torch.searchsorted(cum, r)  # [N, R] first bin whose cumulative count reaches the rank
    below = torch.where(bins > 0, cum.gather(1, (bins - 1).clamp(min=0)), 0)
    return RadixPlan(ranks, bins, below, low, ~(low | high))


def _upper_histogram(v: torch.Tensor) -> torch.Tensor:
    """``[N, E]`` non-negative float32 -> ``[N, 2**16]`` int64 counts of the upper 16 bits, one row per agent.

    One ``bincount`` per agent on the upper halves (no int64 offset copy of the whole batch).
    """
    return torch.stack([torch.bincount(row, minlength=_HI) for row in _upper_bits(_bits(v))])


def _upper_bits(bits: torch.Tensor) -> torch.Tensor:
    """``[N, E]`` int32 patterns of non-negative floats -> their upper 16 bits ``[N, E]`` (values in [0, 2**15]).

    On little-endian machines a strided int16 view of the high halves (no shift pass, half the bytes).
    """
    if sys.byteorder == "little":
        return bits.view(torch.int16)[..., 1::2]
    return bits >> 16


def _bits(v: torch.Tensor) -> torch.Tensor:
    """Non-negative float32 -> int32 bit patterns (same order)."""
    return v.float().contiguous().view(torch.int32)


def magnitude_thresholds(
    source: TensorSource, magnitudes: Callable[[Chunk], torch.Tensor], rank_fn: RankFn
) -> torch.Tensor:
    """Prepare pass: ``[N, R]`` thresholds over a multi-chunk tensor (one chunk in memory at a time)."""
    return kth_streamed(lambda: (magnitudes(c) for c in source()), rank_fn)


def tensor_thresholds(
    c: Chunk, magnitudes: Callable[[Chunk], torch.Tensor], rank_fn: RankFn, values: torch.Tensor | None = None
) -> torch.Tensor:
    """``[N, R]`` thresholds: from the prepare pass, or computed on the chunk when it is the whole tensor.

    ``values`` is ``magnitudes(c)`` when the caller has it already.
    """
    if c.stats.prepared is not None:
        return torch.as_tensor(c.stats.prepared)
    if not c.whole:
        raise RuntimeError(f"{c.name}: tensor statistics missing for a partial chunk (prepare was not run)")
    values = magnitudes(c) if values is None else values
    return kth_direct(values, rank_fn(values.shape[1], values.shape[0]))


# --------------------------------------------------------------------------- exact dot products


def block_sums(x: torch.Tensor, start: int) -> torch.Tensor:
    """``[E]`` float64 starting at element ``start`` (a multiple of STAT_BLOCK) -> ``[ceil(E/B)]`` block sums.

    Each block is summed by pairwise halving, so a block's sum depends only on its values.
    """
    if start % STAT_BLOCK:
        raise ValueError(f"block_sums: chunk start {start} is not a multiple of {STAT_BLOCK}")
    v = torch.nn.functional.pad(x, (0, -x.numel() % STAT_BLOCK)).view(-1, STAT_BLOCK)
    while v.shape[1] > 1:
        h = v.shape[1] // 2
        v = v[:, :h] + v[:, h:]
    return v[:, 0]


def pairwise_total(x: torch.Tensor) -> float:
    """``[M]`` float64 -> its sum by pairwise halving (zero-padded to a power of two)."""
    size = 1 << max(0, (x.numel() - 1).bit_length())
    v = torch.nn.functional.pad(x, (0, size - x.numel()))
    while v.numel() > 1:
        h = v.numel() // 2
        v = v[:h] + v[h:]
    return float(v.sum())


def _dot_blocks(vectors: torch.Tensor, start: int) -> torch.Tensor:
    """``[K, E]`` float32 -> ``[K, K, nb]`` float64 block sums of every product ``v_a * v_b``.

    The compiled twin (``fused.gram``, one pass, the same bits) runs when numba is available.
    """
    if start % STAT_BLOCK:
        raise ValueError(f"block_sums: chunk start {start} is not a multiple of {STAT_BLOCK}")
    if available():
        return dot_blocks(vectors, STAT_BLOCK)
    return _dot_blocks_torch(vectors, start)


def block_products(vectors: torch.Tensor, start: int) -> torch.Tensor:
    """``[K, E]`` float32 starting at a block boundary -> ``[K, K, nb]`` float64 block sums of every product."""
    return _dot_blocks(vectors, start)


def square_blocks(vectors: torch.Tensor, start: int) -> torch.Tensor:
    """``[K, E]`` float32 -> ``[K, nb]`` float64 block sums of each ``v_a * v_a`` (``block_sums`` per row)."""
    if available():
        if start % STAT_BLOCK:
            raise ValueError(f"block_sums: chunk start {start} is not a multiple of {STAT_BLOCK}")
        return dot_blocks(vectors, STAT_BLOCK, diagonal=True).diagonal().T.contiguous()
    v64 = vectors.double()
    return torch.stack([block_sums(row * row, start) for row in v64])


def _dot_blocks_torch(vectors: torch.Tensor, start: int) -> torch.Tensor:
    k = vectors.shape[0]
    nb = -(-vectors.shape[1] // STAT_BLOCK)
    out = torch.zeros(k, k, nb, dtype=torch.float64)
    v64 = vectors.double()
    for a in range(k):
        for b in range(a, k):
            out[a, b] = out[b, a] = block_sums(v64[a] * v64[b], start)
    return out


def gram(batches: Iterator[tuple[torch.Tensor, int]]) -> torch.Tensor:
    """``[K, K]`` float64 exact-order Gram matrix of the vectors over all ``([K, E], start)`` batches."""
    parts = [_dot_blocks(v, s) for v, s in batches]
    blocks = torch.cat(parts, dim=2)
    k = blocks.shape[0]
    g = torch.empty(k, k, dtype=torch.float64)
    for a in range(k):
        for b in range(k):
            g[a, b] = pairwise_total(blocks[a, b])
    return g


def gram_prepare(vectors: Callable[[Chunk], torch.Tensor]) -> Callable[[TensorSource], torch.Tensor]:
    """A ``prepare`` hook computing the Gram matrix of ``vectors(chunk)`` over a multi-chunk tensor."""

    def prepare(source: TensorSource) -> torch.Tensor:
        return gram((vectors(c), c.start) for c in source())

    return prepare


def tensor_gram(c: Chunk, vectors: Callable[[Chunk], torch.Tensor]) -> torch.Tensor:
    """``[K, K]`` Gram matrix: from the prepare pass, or computed on the chunk when it is the whole tensor."""
    if c.stats.prepared is not None:
        return torch.as_tensor(c.stats.prepared)
    if not c.whole:
        raise RuntimeError(f"{c.name}: tensor statistics missing for a partial chunk (prepare was not run)")
    return gram(iter([(vectors(c), c.start)]))


def stat_blocks(shape: tuple[int, ...]) -> int:
    """Chunk multiple for methods with dot-product statistics."""
    return STAT_BLOCK
