"""Compiled forms of RAM and RAM+ (one numba loop per chunk, ``fused.loops.ram_loop``), bit for bit the
reference kernels of ``ram.kernels``."""

from __future__ import annotations

import torch

from agentmerge.methods.fused.kernels import RawChunk, output, raw_chunk
from agentmerge.methods.fused.loops import ram_loop
from agentmerge.methods.ram import RamParams
from agentmerge.methods.ram.kernels import ram_plus_lambdas
from agentmerge.methods.spec import ChunkSpec, Compiled, CompiledResult


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


RAM = Compiled(ram)


RAM_PLUS = Compiled(ram_plus)
