"""Compiled kernels of RAM, RAM+, linear and task arithmetic, and the counts of the statistics pass.

Each kernel takes one chunk as stored (``ref [E]``, ``models [N, E]``: bf16 or float32 bits are read in
place, other dtypes through float32) and its ``ChunkSpec``, and returns ``theta_0 + tau*`` with the
chunk's update-pattern counts, bit for bit what the reference kernels of ``agentmerge.methods.ram.kernels`` give.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from agentmerge.methods.fused.loops import count_loop
from agentmerge.methods.spec import CompiledResult, ParamValue


@dataclass(frozen=True)
class RawChunk:
    """One chunk's stored values as unsigned bit arrays the loops widen themselves.

    ``ref`` ``[E]`` and ``models`` ``[N, E]`` are uint16 (bf16 bits, ``shift`` 16) or uint32
    (float32 bits, ``shift`` 0).
    """

    ref: np.ndarray[Any, Any]
    models: np.ndarray[Any, Any]
    shift: int


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


def output(raw: RawChunk, out: torch.Tensor | None) -> tuple[torch.Tensor, np.ndarray[Any, Any]]:
    """The ``[E]`` float32 result buffer (``out``, or a new one) and zeroed ``[2**N]`` pattern counts."""
    n, e = raw.models.shape
    merged = out if out is not None else torch.empty(e, dtype=torch.float32)
    return merged, np.zeros(1 << n, dtype=np.int64)


def f32(value: ParamValue) -> np.float32:
    """A parameter as the float32 scalar torch multiplies a float32 tensor by."""
    return np.float32(float(value))


def counts(ref: torch.Tensor, models: torch.Tensor, eps: float) -> CompiledResult:
    """Pattern counts only (the overlap statistics pass)."""
    raw = raw_chunk(ref, models)
    patterns = np.zeros(1 << raw.models.shape[0], dtype=np.int64)
    bad = count_loop(raw.ref, raw.models, raw.shift, eps, patterns)
    return CompiledResult(None, torch.from_numpy(patterns), not bad)
