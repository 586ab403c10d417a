"""How much of a task vector read from quantized GGUF files is rounding: the note probe and merge print.

A block-quantized GGUF type stores each group of ``G`` values on a grid of ``L`` levels spanning the group:
step ``s = (max - min) / (L - 1)`` (Q8_0: G = 32, L = 255; Q4_K: 32, 16; Q6_K: 16, 64; ``LEVELS``).
Rounding to the nearest level leaves an error uniform on ``[-s/2, s/2]``: RMS ``s/√12`` per weight. A task
vector ``τ = Q(θ_i) - Q(θ_0)`` of two files quantized apart carries the difference of two such errors, RMS
``s/√6``, wherever the two weights round differently. The note compares the mean step ``s̄`` with the
measured mean ``|τ|`` of each agent on the same sampled rows (``ROWS`` evenly spaced rows per tensor, read
through the inputs' own readers): when ``s̄`` is near ``|τ|`` a large part of τ is rounding.

The step is an estimate from the dequantized values (the group's range over its levels), not read from the
block scales; for F16 / BF16 it is the mean spacing of the float grid at each value (``2^(e - m)``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from agentmerge.io.formats.checkpoint import Readable
from agentmerge.io.formats.gguf_read import GgufCheckpoint

LEVELS = {  # GGUF type name: (values per scale, levels)
    "Q8_0": (32, 255),
    "Q5_0": (32, 32),
    "Q5_1": (32, 32),
    "Q4_0": (32, 16),
    "Q4_1": (32, 16),
    "Q2_K": (16, 4),
    "Q3_K": (16, 8),
    "Q4_K": (32, 16),
    "Q5_K": (32, 32),
    "Q6_K": (16, 64),
    "Q8_K": (256, 255),
}
MANTISSA = {"F16": 10, "BF16": 7}
ROWS = 4  # sampled rows per tensor


@dataclass(frozen=True)
class QuantError:
    """The sampled comparison: quantized inputs and their types, mean step, each agent's mean |τ|."""

    quantized: dict[str, list[str]]  # input label -> its block-quantized types
    step: float
    tau: dict[str, float]  # agent label -> mean |τ| on the sampled rows
    elements: int


def step_of(values: torch.Tensor, qtype: str) -> float | None:
    """Mean grid step of ``values`` (a whole row of a tensor stored as ``qtype``); None when not estimated."""
    if qtype in LEVELS:
        group, levels = LEVELS[qtype]
        blocks = values.reshape(-1, group)
        return float(((blocks.amax(dim=1) - blocks.amin(dim=1)) / (levels - 1)).mean())
    if qtype in MANTISSA:
        _, exponent = torch.frexp(values[values != 0].float())
        spacing = torch.ldexp(torch.ones(exponent.shape), exponent - 1 - MANTISSA[qtype])
        return float(spacing.mean()) if exponent.numel() else 0.0
    return 0.0 if qtype == "F32" else None


def measure(reference: Readable, models: Sequence[Readable], labels: Sequence[str]) -> QuantError | None:
    """The sampled step and |τ| when any input is a block-quantized GGUF; None when none is."""
    everyone = [("base", reference), *zip(labels, models, strict=True)]
    quantized = {
        label: sorted({t for t in c.quant_types.values() if t in LEVELS})
        for label, c in everyone
        if isinstance(c, GgufCheckpoint)
    }
    quantized = {k: v for k, v in quantized.items() if v}
    if not quantized:
        return None
    steps, tau, count = 0.0, [0.0] * len(models), 0
    for name, info in reference.tensors.items():
        if len(info.shape) < 2 or not info.dtype.is_floating_point:
            continue
        cols = info.shape[-1]
        rows = info.numel // cols
        for r in sorted({round(i * (rows - 1) / max(ROWS - 1, 1)) for i in range(ROWS)}):
            base = reference.read(name, r * cols, (r + 1) * cols).float()
            values = [m.read(name, r * cols, (r + 1) * cols).float() for m in models]
            steps += cols * _mean_step(name, [base, *values], [reference, *models])
            for i, v in enumerate(values):
                tau[i] += float((v - base).abs().sum())
            count += cols
    mean_tau = {label: t / max(count, 1) for label, t in zip(labels, tau, strict=True)}
    return QuantError(quantized, steps / max(count, 1), mean_tau, count)


def _mean_step(name: str, values: list[torch.Tensor], inputs: list[Readable]) -> float:
    """Mean step over the inputs of one row (an input stored exactly counts 0; an unknown type is skipped)."""
    found = []
    for v, c in zip(values, inputs, strict=True):
        qtype = c.quant_types.get(name, "F32") if isinstance(c, GgufCheckpoint) else "F32"
        step = step_of(v, qtype)
        if step is not None:
            found.append(step)
    return sum(found) / len(found) if found else 0.0


def note(q: QuantError) -> str:
    """One line: which inputs are quantized, the step and error, and |τ| beside them."""
    which = ", ".join(f"{label} ({'/'.join(types)})" for label, types in q.quantized.items())
    taus = ", ".join(f"{label} {t:.3g}" for label, t in q.tau.items())
    ratio = q.step / max(min(q.tau.values(), default=0.0), 1e-30)
    return (
        f"task vectors include quantization error: {which} {'is' if len(q.quantized) == 1 else 'are'} "
        f"block-quantized; mean rounding step {q.step:.3g} per weight (error RMS {q.step / math.sqrt(12):.3g} per "
        f"file, {q.step / math.sqrt(6):.3g} in a difference of two) against measured mean |τ| {taus} "
        f"({q.elements} sampled weights per input; step / smallest |τ| = {ratio:.2g}); merge unquantized "
        "checkpoints when you have them"
    )
