"""torch's CPU random stream in numba: the very draws of ``deltas.seeded_uniform``, about 4x faster.

torch's CPU generator is MT19937 initialised from the low 32 bits of the seed (``init_genrand``); a
float32 draw of ``torch.rand`` is the low 24 bits of one tempered 32-bit output times 2**-24. Each
``RNG_BLOCK`` of a tensor has its own seed (``deltas.block_seed``), so the draws do not depend on chunking.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from agentmerge.methods.deltas import RNG_BLOCK, block_seed, rng_blocks
from agentmerge.methods.fused.jit import jit

_MT_N, _MT_M = 624, 397


@jit
def _mt_mix(a: Any, b: Any, c: Any) -> Any:
    """One MT19937 recurrence step: ``c ^ twist(upper bit of a, lower bits of b)``."""
    y = (a & np.uint32(0x80000000)) | (b & np.uint32(0x7FFFFFFF))
    return np.uint32(c ^ (y >> np.uint32(1)) ^ (np.uint32(0x9908B0DF) * (b & np.uint32(1))))


@jit
def _mt_twist(mt: Any) -> None:
    """The MT19937 state update of the 624-word state ``mt`` (uint32), in place, in three branch-free loops."""
    for k in range(_MT_N - _MT_M):
        mt[k] = _mt_mix(mt[k], mt[k + 1], mt[k + _MT_M])
    for k in range(_MT_N - _MT_M, _MT_N - 1):
        mt[k] = _mt_mix(mt[k], mt[k + 1], mt[k + _MT_M - _MT_N])
    mt[_MT_N - 1] = _mt_mix(mt[_MT_N - 1], mt[0], mt[_MT_M - 1])


@jit
def mt_uniform(seed: int, out: Any) -> None:
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


def seeded_uniform(seed: int, name: str, start: int, stop: int, rows: int) -> np.ndarray[Any, Any]:
    """``deltas.seeded_uniform`` as a ``[rows, stop - start]`` float32 array: the same values, by ``mt_uniform``."""
    out = np.empty((rows, stop - start), np.float32)
    for block, b0, lo, hi in rng_blocks(start, stop):
        whole = lo == start and hi == stop and hi - lo == RNG_BLOCK  # the chunk is exactly this block
        draws = out if whole else np.empty((rows, RNG_BLOCK), np.float32)
        mt_uniform(block_seed(seed, name, block), draws.reshape(-1))
        if not whole:
            out[:, lo - start : hi - start] = draws[:, lo - b0 : hi - b0]
    return out
