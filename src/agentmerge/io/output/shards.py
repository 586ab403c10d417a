"""The output's shard plan, pure: which tensors go in which file, each file's header and byte offsets.

Outputs are planned before anything is written, so the writer (``writer.ShardWriter``) can create each file
with its final header and size and put chunks at their offsets in any order.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from agentmerge.io.formats.tensorfile import DTYPE_NAMES, SINGLE_FILE
from agentmerge.io.guards import jsontext


@dataclass(frozen=True)
class PlannedTensor:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()


@dataclass(frozen=True)
class ShardPlan:
    """One output file: its name, header bytes and each tensor's absolute byte offset."""

    file_name: str
    header: bytes
    offsets: dict[str, int]
    size: int


def plan_shards(
    tensors: Sequence[PlannedTensor], max_shard_size: int, metadata: dict[str, str] | None = None
) -> list[ShardPlan]:
    """Split tensors, in order, into files of at most ``max_shard_size`` data bytes.

    A tensor larger than the limit gets a file of its own. One file is named ``model.safetensors``,
    several ``model-0000i-of-0000n.safetensors``. Inside a file, tensors are laid out by decreasing
    element size so every tensor is aligned to its element size. ``metadata`` is added to each header's
    ``__metadata__`` (after ``format: pt``).
    """
    groups: list[list[PlannedTensor]] = [[]]
    used = 0
    for t in tensors:
        if groups[-1] and used + t.nbytes > max_shard_size:
            groups.append([])
            used = 0
        groups[-1].append(t)
        used += t.nbytes
    n = len(groups)
    names = [SINGLE_FILE] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    return [_layout(name, group, metadata) for name, group in zip(names, groups, strict=True)]


def _layout(file_name: str, group: list[PlannedTensor], metadata: dict[str, str] | None = None) -> ShardPlan:
    ordered = sorted(group, key=lambda t: -torch.empty((), dtype=t.dtype).element_size())
    entries: dict[str, object] = {"__metadata__": {"format": "pt", **(metadata or {})}}
    pos = 0
    for t in ordered:
        entries[t.name] = {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [pos, pos + t.nbytes]}
        pos += t.nbytes
    header = jsontext.dumps(entries, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    data_start = 8 + len(header)
    offsets, pos = {}, 0
    for t in ordered:
        offsets[t.name] = data_start + pos
        pos += t.nbytes
    return ShardPlan(file_name, struct.pack("<Q", len(header)) + header, offsets, data_start + pos)


def index_json(plans: Sequence[ShardPlan], tensors: Sequence[PlannedTensor]) -> dict[str, object]:
    """The ``model.safetensors.index.json`` content for a multi-file plan."""
    weight_map = {name: p.file_name for p in plans for name in p.offsets}
    total = sum(t.nbytes for t in tensors)
    return {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
