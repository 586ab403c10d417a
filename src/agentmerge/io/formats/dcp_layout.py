"""Proof that a DCP checkpoint's metadata describes each tensor exactly, before a byte of data is read.

``.metadata`` gives each tensor ``T`` a dtype, a shape ``S`` (``d`` dims, ``N = prod S`` elements) and its
pieces ``P_k``: boxes with offsets ``o_k`` and sizes ``s_k`` (one ``torch.save`` item each, at a byte range of
a ``.distcp`` file). A tensor is read only when

1. every ``o_k`` and ``s_k`` holds ``d`` whole numbers >= 0 with ``o_k + s_k <= S`` (each box lies inside ``T``);
2. no two boxes intersect (for every pair some dim ``j`` has ``[o_j, o_j + s_j)`` apart);
3. ``sum_k prod(s_k) = N``.

Boxes inside ``T`` that are pairwise disjoint and whose volumes add up to ``N`` cover every element exactly
once: no gap (which would be read as uninitialised memory) and no element written twice. Pairs are
compared by a sweep along dim 0 (only boxes whose dim-0 ranges meet are compared: one at a time for FSDP's
dim-0 shards). Besides: the dtype is one agentmerge writes, ``N <= MAX_NUMEL``, and each piece's storage
entry names a regular file inside the folder whose bytes ``[offset, offset + length)`` exist and hold at
least the piece's data (unless the piece is stored through a transform such as compression).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentmerge.errors import CheckpointError
from agentmerge.io.formats.tensorfile import DTYPE_NAMES
from agentmerge.io.guards.bounded import regular_file_size

MAX_NUMEL = 1 << 40  # elements of one tensor (4 TiB in fp32): anything larger is a corrupt size
MAX_COMPARISONS = 1 << 22  # box pairs compared per tensor before giving up


@dataclass(frozen=True)
class Piece:
    """One stored box of a tensor and where its bytes are."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    item: Any  # torch's _StorageInfo: relative_path, offset, length, transform_descriptors

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)

    @property
    def transformed(self) -> bool:
        return bool(getattr(self.item, "transform_descriptors", None))


@dataclass(frozen=True)
class Layout:
    """A tensor's dtype, shape and pieces, proved to cover it exactly."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    pieces: tuple[Piece, ...]


def _whole(value: object, what: str, where: str, ndim: int | None = None) -> tuple[int, ...]:
    """``value`` as whole numbers >= 0 (``ndim`` of them when given), else one line naming ``what``."""
    ok = isinstance(value, Sequence | torch.Size) and not isinstance(value, str | bytes)
    numbers: tuple[Any, ...] = tuple(value) if isinstance(value, Sequence) and ok else ()
    if not ok or not all(type(x) is int and x >= 0 for x in numbers):
        raise CheckpointError(f"{where}: {what} {str(value)[:80]} are not whole numbers >= 0")
    if ndim is not None and len(numbers) != ndim:
        raise CheckpointError(f"{where}: {what} {list(numbers)} have {len(numbers)} dimensions, the tensor {ndim}")
    return numbers


def tensor_layout(folder: Path, md: Any, key: str, entry: Any, sizes: dict[str, int]) -> Layout:
    """The proved layout of DCP tensor ``key`` (``entry``: its TensorStorageMetadata); ``sizes`` caches file sizes."""
    where = f"{folder / '.metadata'}: tensor {key!r}"
    dtype = getattr(getattr(entry, "properties", None), "dtype", None)
    if not isinstance(dtype, torch.dtype) or dtype not in DTYPE_NAMES:
        raise CheckpointError(f"{where}: dtype {str(dtype)[:40]!r} is not one agentmerge reads and writes")
    shape = _whole(getattr(entry, "size", None), "size", where)
    if math.prod(shape) > MAX_NUMEL:
        raise CheckpointError(f"{where}: size {list(shape)} has more than {MAX_NUMEL} elements (corrupt metadata)")
    chunks = getattr(entry, "chunks", None)
    if not isinstance(chunks, list | tuple):
        raise CheckpointError(f"{where}: its chunks are {type(chunks).__name__}, not a list of pieces")
    pieces = tuple(_piece(folder, md, key, c, shape, dtype, sizes, where) for c in chunks)
    _prove_cover(shape, pieces, where)
    return Layout(dtype, shape, pieces)


def _piece(
    folder: Path,
    md: Any,
    key: str,
    chunk: Any,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    sizes: dict[str, int],
    where: str,
) -> Piece:
    from torch.distributed.checkpoint.metadata import MetadataIndex

    offsets = _whole(getattr(chunk, "offsets", None), "piece offsets", where, len(shape))
    extent = _whole(getattr(chunk, "sizes", None), "piece sizes", where, len(shape))
    if any(o + s > d for o, s, d in zip(offsets, extent, shape, strict=True)):
        raise CheckpointError(
            f"{where}: a piece at offsets {list(offsets)} of sizes {list(extent)} reaches past its shape {list(shape)}"
        )
    item = md.storage_data.get(MetadataIndex(key, torch.Size(offsets)))
    if item is None:
        raise CheckpointError(f"{where}: no data entry for its piece at offsets {list(offsets)} (incomplete metadata)")
    piece = Piece(offsets, extent, item)
    _check_item(folder, piece, dtype, sizes, where)
    return piece


def _check_item(folder: Path, piece: Piece, dtype: torch.dtype, sizes: dict[str, int], where: str) -> None:
    """The piece's bytes lie inside a regular data file of the folder and can hold its values."""
    item = piece.item
    rel, offset, length = (getattr(item, k, None) for k in ("relative_path", "offset", "length"))
    if not isinstance(rel, str) or not rel or Path(rel).is_absolute() or ".." in Path(rel).parts:
        raise CheckpointError(f"{where}: data file {str(rel)[:80]!r} is not a file name inside {folder}")
    if rel not in sizes:
        sizes[rel] = regular_file_size(folder / rel, "DCP data file")
    if type(offset) is not int or type(length) is not int or offset < 0 or length < 0:
        raise CheckpointError(f"{where}: a data entry with offset {offset!r} and length {length!r} (not whole numbers)")
    if offset + length > sizes[rel]:
        raise CheckpointError(
            f"{where}: bytes {offset}..{offset + length} lie past the end of {rel} ({sizes[rel]} bytes); "
            "the checkpoint is truncated"
        )
    transforms = getattr(item, "transform_descriptors", None)
    named = isinstance(transforms, list | tuple) and all(isinstance(t, str) for t in transforms)
    if transforms is not None and not named:
        raise CheckpointError(f"{where}: transform_descriptors {str(transforms)[:60]} are not a list of names")
    need = piece.numel * torch.empty((), dtype=dtype).element_size()
    if not piece.transformed and length < need:
        raise CheckpointError(f"{where}: a piece of {need} bytes stored in {length} bytes of {rel} (corrupt metadata)")


def _prove_cover(shape: tuple[int, ...], pieces: Sequence[Piece], where: str) -> None:
    """Every element exactly once: boxes pairwise disjoint (sweep on dim 0), volumes adding up to the size."""
    numel, covered = math.prod(shape), sum(p.numel for p in pieces)
    boxes = sorted((p for p in pieces if p.numel), key=lambda p: p.offsets)
    active: list[Piece] = []
    compared = 0
    for box in boxes:
        start = box.offsets[0] if shape else 0
        active = [a for a in active if not shape or a.offsets[0] + a.sizes[0] > start]
        for other in active:
            compared += 1
            if compared > MAX_COMPARISONS:
                raise CheckpointError(f"{where}: too many pieces ({len(boxes)}) to check they do not overlap")
            if _meet(box, other):
                raise CheckpointError(
                    f"{where}: pieces at offsets {list(other.offsets)} and {list(box.offsets)} overlap: "
                    "those elements are stored twice (metadata of two checkpoints mixed?)"
                )
        active.append(box)
    if covered != numel:
        raise CheckpointError(
            f"{where}: its pieces cover {covered} of its {numel} elements: some rows were saved by no rank "
            "(an incomplete checkpoint); refusing to read uninitialised memory"
        )


def _meet(a: Piece, b: Piece) -> bool:
    return all(
        ao < bo + bs and bo < ao + as_ for ao, as_, bo, bs in zip(a.offsets, a.sizes, b.offsets, b.sizes, strict=True)
    )


def check_records(f: Path, md: Any) -> None:
    """The metadata's tables have the types torch writes (mappings; planner paths as sequences)."""
    entries, storage = getattr(md, "state_dict_metadata", None), getattr(md, "storage_data", None)
    if not (isinstance(entries, Mapping) and isinstance(storage, Mapping) and all(isinstance(k, str) for k in entries)):
        raise CheckpointError(f"{f}: its tables are not DCP metadata (state_dict_metadata, storage_data)")
    for info in storage.values():
        rel = getattr(info, "relative_path", None)
        if not isinstance(rel, str) or not rel or Path(rel).is_absolute() or ".." in Path(rel).parts:
            raise CheckpointError(f"{f}: data file {str(rel)[:80]!r} points outside {f.parent}; refusing to read it")
    planner = getattr(md, "planner_data", None)
    if planner is not None and not (
        isinstance(planner, Mapping) and all(isinstance(v, list | tuple) for v in planner.values())
    ):
        raise CheckpointError(f"{f}: planner_data is not a mapping of key paths; not DCP metadata")
