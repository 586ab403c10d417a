"""Compiled forms of linear merging and task arithmetic (one numba loop per chunk, ``fused.loops``)."""

from __future__ import annotations

import torch

from agentmerge.methods.arithmetic import TaskArithmeticParams
from agentmerge.methods.fused.kernels import RawChunk, f32, output, raw_chunk
from agentmerge.methods.fused.loops import weighted_loop
from agentmerge.methods.spec import ChunkSpec, Compiled, CompiledResult


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
    return _weighted(raw_chunk(ref, models), spec, float(f32(TaskArithmeticParams.of(spec.params).scale)), False, out)


LINEAR = Compiled(linear)


TASK_ARITHMETIC = Compiled(task_arithmetic)
