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

from agentmerge.methods.fused.loops import count_loop, ram_loop, weighted_loop
from agentmerge.methods.ram.kernels import ram_plus_lambdas
from agentmerge.methods.records import RamParams, TaskArithmeticParams
from agentmerge.methods.spec import ChunkSpec, Compiled, CompiledResult, ParamValue


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


def _ram(raw: RawChunk, spec: ChunkSpec, lam: torch.Tensor | None, out: torch.Tensor | None) -> CompiledResult:
    merged, patterns = output(raw, out)
    scales = (lam if lam is not None else torch.ones(raw.models.shape[0])).float().numpy()
    elect = RamParams.of(spec.params).shared == "elect"  # RAM+'s record extends RAM's
    bad = ram_loop(raw.ref, raw.models, raw.shift, spec.eps, scales, lam is not None, elect, merged.numpy(), patterns)
    return CompiledResult(merged, torch.from_numpy(patterns), not bad)


def ram(ref: torch.Tensor, models: torch.Tensor, spec: ChunkSpec, out: torch.Tensor | None = None) -> CompiledResult:
    """RAM over one chunk (``methods.ram``; ``shared: mean`` or ``elect``)."""
    return _ram(raw_chunk(ref, models), spec, None, out)


def ram_plus(
    ref: torch.Tensor, models: torch.Tensor, spec: ChunkSpec, out: torch.Tensor | None = None
) -> CompiledResult:
    """RAM+ over one chunk (``methods.ram_plus``): lambda from the histogram of its scope (model, tensor, group)."""
    return _ram(raw_chunk(ref, models), spec, ram_plus_lambdas(spec), out)


def _weighted(raw: RawChunk, spec: ChunkSpec, scale: float, divide: bool, out: torch.Tensor | None) -> CompiledResult:
    merged, patterns = output(raw, out)
    w = spec.weights.float().numpy()
    bad = weighted_loop(raw.ref, raw.models, raw.shift, spec.eps, w, scale, divide, merged.numpy(), patterns)
    return CompiledResult(merged, torch.from_numpy(patterns), not bad)


def linear(ref: torch.Tensor, models: torch.Tensor, spec: ChunkSpec, out: torch.Tensor | None = None) -> CompiledResult:
    """Weighted average (``methods.linear``): ``theta_0 + sum_i w_i tau_i / sum_i w_i``."""
    return _weighted(raw_chunk(ref, models), spec, float(spec.weights.float().sum()), True, out)


def task_arithmetic(
    ref: torch.Tensor, models: torch.Tensor, spec: ChunkSpec, out: torch.Tensor | None = None
) -> CompiledResult:
    """Task arithmetic (``methods.task_arithmetic``): ``theta_0 + lambda * sum_i w_i tau_i``."""
    return _weighted(raw_chunk(ref, models), spec, float(f32(TaskArithmeticParams.of(spec.params).lam)), False, out)


def counts(ref: torch.Tensor, models: torch.Tensor, eps: float) -> CompiledResult:
    """Pattern counts only (the overlap statistics pass)."""
    raw = raw_chunk(ref, models)
    patterns = np.zeros(1 << raw.models.shape[0], dtype=np.int64)
    bad = count_loop(raw.ref, raw.models, raw.shift, eps, patterns)
    return CompiledResult(None, torch.from_numpy(patterns), not bad)


RAM = Compiled(ram)
RAM_PLUS = Compiled(ram_plus)
LINEAR = Compiled(linear)
TASK_ARITHMETIC = Compiled(task_arithmetic)
