"""verl FSDP actor folders read as models: one ``torch.save`` of each rank's sharded state dict.

Each rank file holds DTensors (FSDP2, or FSDP1 with a device mesh) whose ``_local_tensor`` is the rank's
piece, or plain tensors (older FSDP1). FSDP shards dim 0, ``torch.chunk``-style (uneven last pieces, no
padding in the saved pieces), so a tensor ``T`` of shape ``[R, ...]`` held by the ranks ``r_0 .. r_{k-1}``
of its shard dimension is

    T = cat(piece_{r_0}, ..., piece_{r_{k-1}}; dim 0)      flat(T) = flat(piece_{r_0}) ++ ... ++ flat(piece_{r_{k-1}})

so elements ``start:stop`` of ``flat(T)`` are read from the pieces they fall in, never the whole tensor. A
DTensor's placements say which ranks those are: the ranks at coordinate 0 of every ``Replicate`` mesh
dimension (HSDP's replica dimension), ordered by their coordinate on the one ``Shard(0)`` dimension. Other
placements (``Shard(d)`` with ``d > 0``, ``Partial``, two sharded dimensions) are refused by name. Plain
tensors are concatenated over all ranks in rank order, as verl's own merger does.

The folder must hold exactly the files ``model_world_size_W_rank_R.pt`` for ``R = 0 .. W-1`` (named as
``trainer_files`` says), each a regular file. Rank files are loaded with ``weights_only=True`` and
``mmap=True`` (pages are read only when a chunk touches them), allowing only the DTensor classes
(``dtensor_globals``); anything else in the pickle (code, ShardedTensor) is refused. The ``DeviceMesh`` a
pickle names is an inert stand-in (``_SavedMesh``): it takes the saved state, but a pickle that *calls* it
(which would run ``init_process_group``, open a TCP port, or wait for other ranks) is refused, so reading
weights never starts anything of ``torch.distributed``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from agentmerge.errors import CheckpointError
from agentmerge.io.formats.tensorfile import DTYPE_NAMES, TensorInfo
from agentmerge.io.formats.trainer_files import RANK_FILE, RANK_LIKE, model_files_folder, verl_actor_folder
from agentmerge.io.guards.bounded import regular_file_size
from agentmerge.io.guards.strict_json import read_json_object

_MESH = "torch.distributed.device_mesh.DeviceMesh"


class MeshConstructed(Exception):
    """A pickle called ``DeviceMesh(...)``: building one would start a process group."""


@functools.cache
def _saved_mesh() -> type:
    """``DeviceMesh`` as a pickle may restore it (state only), never construct it."""
    from torch.distributed.device_mesh import DeviceMesh

    class _SavedMesh(DeviceMesh):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise MeshConstructed(
                "the pickle constructs a DeviceMesh, which would start a process group; only saved meshes are read"
            )

        def __setstate__(self, state: dict[str, Any]) -> None:
            self.__dict__.update(state)  # no process-group lookups: none exists, none is wanted
            self._pg_registry = {}

    return _SavedMesh


def dtensor_globals() -> list[Any]:
    """The classes a DTensor pickle names, and nothing else: the narrowest allowlist that loads verl's files
    (placements agentmerge refuses by name, ``Partial`` and ``_StridedShard``, are loaded so as to be named)."""
    from torch.distributed._mesh_layout import _FlatLayout, _MeshLayout
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, placement_types
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, ShardOrderEntry, TensorMeta

    classes: list[Any] = [DTensor, DTensorSpec, TensorMeta, ShardOrderEntry, _MeshLayout, _FlatLayout, Shard, Replicate]
    strided = getattr(placement_types, "_StridedShard", None)
    return [*classes, Partial, *([strided] if strided else []), (_saved_mesh(), _MESH)]


_GLOBALS_LOCK = threading.Lock()


@contextlib.contextmanager
def _only_dtensor_globals() -> Iterator[None]:
    """For the block, the weights-only allowlist is exactly ``dtensor_globals()``.

    Importing ``torch.distributed.tensor`` adds the real ``DeviceMesh`` to torch's process-wide allowlist
    under the very name our stand-in takes; which of the two a load would use depends on set order (it
    changes from run to run), so the process-wide entries are set aside for the block and put back after.
    """
    ours = dtensor_globals()  # first: importing torch.distributed.tensor adds its own entries to the allowlist
    with _GLOBALS_LOCK:
        before = torch.serialization.get_safe_globals()
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(ours)
        try:
            yield
        finally:
            torch.serialization.clear_safe_globals()
            torch.serialization.add_safe_globals(before)


@contextlib.contextmanager
def _quiet_device_mesh() -> Iterator[None]:
    """DeviceMesh warns once per unpickled tensor that no process group exists; none is needed to read."""
    logger = logging.getLogger("torch.distributed.device_mesh")
    before = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(before)


def load_rank_file(f: Path) -> dict[str, Any]:
    """One rank's state dict, memory-mapped, with ``weights_only=True`` and only the DTensor classes allowed."""
    regular_file_size(f, "verl rank file")
    if not zipfile.is_zipfile(f):
        raise CheckpointError(f"{f}: not a torch zip archive (truncated, or saved by torch < 1.6); save it again")
    try:
        with _only_dtensor_globals(), _quiet_device_mesh():
            state = torch.load(f, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # code in the pickle, a ShardedTensor, a mesh built, a corrupt file
        raise CheckpointError(
            f"{f}: refused to load ({type(e).__name__}: {str(e).splitlines()[0][:200]}). Only tensors and "
            "DTensors are read (weights_only=True); ShardedTensor checkpoints: convert them with verl's model_merger"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
        raise CheckpointError(f"{f}: expected a state dict (tensor names to tensors)")
    return state


def rank_files(actor: Path) -> list[Path]:
    """``model_world_size_W_rank_R.pt`` for R = 0 .. W-1, exactly those, checked against ``fsdp_config.json``."""
    found: dict[int, Path] = {}
    worlds: set[int] = set()
    for p in sorted(actor.iterdir()):
        if not RANK_LIKE.match(p.name):
            continue
        m = RANK_FILE.match(p.name)
        if m is None:
            raise CheckpointError(
                f"{p}: not a verl rank file name (verl writes model_world_size_W_rank_R.pt, W and R in ASCII "
                "digits with no leading zero); rename or remove it"
            )
        worlds.add(int(m[1]))
        found[int(m[2])] = p
    if len(worlds) != 1:
        raise CheckpointError(f"{actor}: rank files of several world sizes {sorted(worlds)}; keep one per folder")
    (w,) = worlds
    stray = [r for r in sorted(found) if r >= w]
    if stray:
        raise CheckpointError(f"{found[stray[0]]}: rank {stray[0]} is outside 0..{w - 1} (world size {w})")
    if len(found) != w:  # the first gap, found among the files present (never a loop over w)
        missing = next((r for r, have in enumerate(sorted(found)) if r != have), len(found))
        raise CheckpointError(
            f"{actor}: model_world_size_{w}_rank_{missing}.pt is missing (world size {w}, {len(found)} rank files)"
        )
    _check_fsdp_config(actor, w)
    return [found[r] for r in range(w)]


def _check_fsdp_config(actor: Path, w: int) -> None:
    config = actor / "fsdp_config.json"
    if config.is_file():
        declared = read_json_object(config, "fsdp_config.json").get("world_size")
        if declared is not None and declared != w:
            raise CheckpointError(f"{config}: world_size {str(declared)[:40]}, but the folder holds {w} rank files")


def _shard_ranks(name: str, d: Any, rank: int) -> tuple[int, int]:
    """``(shard position, include)`` of ``rank``'s piece of DTensor ``d``: its coordinate on the Shard(0) mesh
    dimension, and whether it sits at coordinate 0 of every Replicate dimension (``include`` as 0/1)."""
    spec = d._spec
    mesh = spec.mesh.mesh
    where = (mesh == rank).nonzero()
    if where.shape[0] != 1:
        raise CheckpointError(f"tensor {name!r}: rank {rank} is not in its device mesh {mesh.tolist()}")
    coords = where[0].tolist()
    position, include, sharded = 0, 1, 0
    for dim, p in enumerate(spec.placements):
        if p.is_replicate():
            include &= int(coords[dim] == 0)
        elif p.is_shard() and p.dim == 0 and type(p).__name__ == "Shard":
            position, sharded = coords[dim], sharded + 1
        else:
            raise CheckpointError(
                f"tensor {name!r}: placement {p!r} is not supported (only FSDP's Shard(0) and Replicate); "
                "merge the ranks with verl's model_merger first"
            )
    if sharded > 1:
        raise CheckpointError(f"tensor {name!r}: sharded on {sharded} mesh dimensions; only one is supported")
    return position, include


class VerlCheckpoint:
    """A verl FSDP actor folder read like a ``Checkpoint``: each tensor the dim-0 concatenation of its pieces."""

    def __init__(self, ref: str | Path) -> None:
        self.ref = str(ref)
        actor = verl_actor_folder(Path(ref).expanduser())
        if actor is None:
            raise CheckpointError(f"{ref}: no model_world_size_W_rank_R.pt files here or in actor/")
        self.path = actor
        self.folder = model_files_folder(actor)
        self.files = rank_files(actor)
        self.metadata: dict[Path, dict[str, str]] = {}
        self._pieces: dict[str, list[torch.Tensor]] = {}
        self.tensors: dict[str, TensorInfo] = {}
        states = [load_rank_file(f) for f in self.files]
        for name in states[0]:
            self._add(name, [s.get(name) for s in states])
        extra = sorted(set().union(*states) - self.tensors.keys())
        if extra:
            raise CheckpointError(f"{self.files[0]}: lacks tensor {extra[0]!r}, which other ranks hold")

    def __enter__(self) -> VerlCheckpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._pieces.clear()

    @property
    def weight_files(self) -> list[Path]:
        return list(self.files)

    def _add(self, name: str, values: list[Any]) -> None:
        for f, v in zip(self.files, values, strict=True):
            if not isinstance(v, torch.Tensor):
                raise CheckpointError(f"{f}: entry {name!r} is {type(v).__name__}, not a tensor (or lacks it)")
        if _is_dtensor(values[0]):
            shape, pieces = _dtensor_pieces(name, values, self.files)
        elif values[0].dim() == 0:
            shape, pieces = (), values[:1]
        else:
            pieces = list(values)
            shape = (sum(p.shape[0] for p in pieces), *values[0].shape[1:])
        _check_pieces(name, shape, pieces, self.files[0])
        self._pieces[name] = [p.contiguous().reshape(-1) for p in pieces]
        self.tensors[name] = TensorInfo(name, pieces[0].dtype, tuple(shape), self.files[0], 0)

    def read(self, name: str, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Elements ``[start, stop)`` of tensor ``name``, flattened, in the stored dtype."""
        info = self.tensors[name]
        stop = info.numel if stop is None else stop
        return self.read_into(name, start, torch.empty(stop - start, dtype=info.dtype))

    def read_into(self, name: str, start: int, out: torch.Tensor) -> torch.Tensor:
        """Fill ``out`` with elements ``start:start + out.numel()`` of ``name``, from the pieces they lie in."""
        info = self.tensors[name]
        stop = start + out.numel()
        if out.dtype != info.dtype or not 0 <= start <= stop <= info.numel:
            raise IndexError(f"{name}: cannot read elements {start}:{stop} as {out.dtype} (it has {info.numel})")
        flat, begin = out.view(-1), 0
        for piece in self._pieces[name]:
            end = begin + piece.numel()
            lo, hi = max(start, begin), min(stop, end)
            if lo < hi:
                flat[lo - start : hi - start] = piece[lo - begin : hi - begin]
            begin = end
        return out


def _is_dtensor(value: object) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(value, DTensor)


def _dtensor_pieces(name: str, values: list[Any], files: list[Path]) -> tuple[tuple[int, ...], list[torch.Tensor]]:
    """The global shape of DTensor ``name`` and its distinct pieces in shard order (replicas left out)."""
    chosen: dict[int, torch.Tensor] = {}
    for rank, (d, f) in enumerate(zip(values, files, strict=True)):
        if not _is_dtensor(d):
            raise CheckpointError(f"{f}: tensor {name!r} is a plain tensor here but a DTensor on rank 0")
        try:
            position, include = _shard_ranks(name, d, rank)
        except CheckpointError as e:
            raise CheckpointError(f"{f}: {e}") from None
        except Exception as e:  # a DTensor pickled by a torch whose DeviceMesh / spec layout differs from ours
            raise CheckpointError(
                f"{f}: tensor {name!r}: cannot read its DTensor placement ({type(e).__name__}: {e}); saved by "
                f"another torch version? merge the ranks with verl's model_merger under the torch that saved them"
            ) from None
        if include:
            if position in chosen:
                raise CheckpointError(f"{f}: tensor {name!r}: two ranks hold shard {position}")
            chosen[position] = d._local_tensor
    shape = tuple(int(s) for s in values[0]._spec.tensor_meta.shape)
    if sorted(chosen) != list(range(len(chosen))):
        raise CheckpointError(f"{files[0].parent}: tensor {name!r}: shards {sorted(chosen)} are not 0..n-1")
    return shape, [chosen[i] for i in range(len(chosen))]


def _check_pieces(name: str, shape: tuple[int, ...], pieces: list[torch.Tensor], f: Path) -> None:
    dtypes = {p.dtype for p in pieces}
    trailing = {tuple(p.shape[1:]) for p in pieces}
    numel = sum(p.numel() for p in pieces)
    if len(dtypes) > 1 or len(trailing) > 1 or numel != math.prod(shape) or any(s < 0 for s in shape):
        got = [list(p.shape) for p in pieces]
        raise CheckpointError(
            f"{f.parent}: tensor {name!r}: the rank pieces {got} ({sorted(map(str, dtypes))}) do not make its "
            f"shape {list(shape)} (a rank file from another run?)"
        )
    if pieces[0].dtype not in DTYPE_NAMES:
        raise CheckpointError(f"{f.parent}: tensor {name!r} has dtype {pieces[0].dtype}, which agentmerge cannot write")
