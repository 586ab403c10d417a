"""RL-trainer checkpoint folders read as models: verl FSDP actor folders and torch distributed checkpoints.

**verl FSDP** (``actor/model_world_size_W_rank_R.pt``, one file per rank, ``huggingface/`` beside them with
config.json and the tokenizer). Each rank file is ``torch.save`` of that rank's sharded state dict: DTensors
(FSDP2, or FSDP1 with a device mesh) whose ``_local_tensor`` is the rank's piece, or plain tensors (older
FSDP1). FSDP shards dim 0, ``torch.chunk``-style (uneven last pieces, no padding in the saved pieces), so a
tensor ``T`` of shape ``[R, ...]`` held by the ranks ``r_0 .. r_{k-1}`` of its shard dimension is

    T = cat(piece_{r_0}, ..., piece_{r_{k-1}}; dim 0)      flat(T) = flat(piece_{r_0}) ++ ... ++ flat(piece_{r_{k-1}})

so elements ``start:stop`` of ``flat(T)`` are read from the pieces they fall in, never the whole tensor. A
DTensor's placements say which ranks those are: the ranks at coordinate 0 of every ``Replicate`` mesh
dimension (HSDP's replica dimension), ordered by their coordinate on the one ``Shard(0)`` dimension. Other
placements (``Shard(d)`` with ``d > 0``, ``Partial``, two sharded dimensions) are refused by name. Plain
tensors are concatenated over all ranks in rank order, as verl's own merger does. Rank files are loaded with
``weights_only=True`` and ``mmap=True`` (pages are read only when a chunk touches them), allowing only the
DTensor classes (``DTENSOR_GLOBALS``); anything else in the pickle (code, ShardedTensor) is refused.

**Distributed checkpoints (DCP)** (``.metadata`` + ``__R_I.distcp``; NeMo RL, AReaL, torchtitan). The
``.metadata`` pickle is read by a restricted unpickler that builds only DCP's metadata records
(``DCP_METADATA_GLOBALS``; torch's own reader would unpickle anything). Each tensor is then read whole: DCP
stores each rank's piece (``ChunkStorageMetadata``: offsets and sizes per dim) as one ``torch.save`` item at a
byte range of a ``.distcp`` file, which is loaded with ``weights_only=True`` straight from that range and put in
place (a single piece is the tensor itself: no copy); pieces stored through a transform (compression) go
through ``torch.distributed.checkpoint.load`` with no process group. A state dict saved wrapped
(``{"model": state_dict}``, NeMo RL) is named by its inner keys. The last two tensors read are kept
(``DcpCheckpoint.keep``), so memory holds a few whole tensors, never the model.

Both keep the stored dtype (verl's fp32 master weights stay fp32); the merge casts its output to the base's.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import math
import pickle
import re
import threading
import warnings
import zipfile
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, cast

import torch

from agentmerge.errors import CheckpointError
from agentmerge.io.checkpoint import Checkpoint, Readable
from agentmerge.io.headers import read_json_object
from agentmerge.io.tensorfile import TensorInfo

RANK_FILE = re.compile(r"^model_world_size_(\d+)_rank_(\d+)\.pt$")
HF_FOLDER = "huggingface"
DCP_METADATA = ".metadata"
MAX_METADATA_BYTES = 1 << 30
_DCP_META = "torch.distributed.checkpoint.metadata"
DCP_METADATA_GLOBALS = frozenset(
    {(_DCP_META, n) for n in ("Metadata", "TensorStorageMetadata", "TensorProperties", "ChunkStorageMetadata")}
    | {(_DCP_META, n) for n in ("BytesStorageMetadata", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")}
    | {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size")}
    | {("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath")}
)


def open_weights(ref: str | Path) -> Readable:
    """Any weights folder: a verl actor folder (or the step folder holding ``actor/``), a DCP folder, else a
    Hugging Face folder or file (``Checkpoint``)."""
    path = Path(ref).expanduser()
    if verl_actor_folder(path) is not None:
        return VerlCheckpoint(ref)
    if is_dcp(path):
        return DcpCheckpoint(ref)
    return Checkpoint(ref)


def trainer_config_folder(ref: str | Path) -> Path | None:
    """The folder with a trainer checkpoint's config.json and tokenizer; None when ``ref`` is no trainer folder."""
    path = Path(ref).expanduser()
    actor = verl_actor_folder(path)
    if actor is not None:
        return model_files_folder(actor)
    return model_files_folder(path) if is_dcp(path) else None


def verl_actor_folder(path: Path) -> Path | None:
    """The folder holding verl's rank files: ``path`` itself or ``path/actor``; None when neither does."""
    for folder in (path, path / "actor"):
        try:
            if folder.is_dir() and any(RANK_FILE.match(p.name) for p in folder.iterdir()):
                return folder
        except OSError:  # unreadable: the plain reader names the problem
            return None
    return None


def is_dcp(path: Path) -> bool:
    """Whether ``path`` is a torch distributed checkpoint folder (``.metadata`` and ``.distcp`` files)."""
    return path.is_dir() and (path / DCP_METADATA).is_file() and any(path.glob("*.distcp"))


def model_files_folder(path: Path) -> Path:
    """Where a trainer folder's config.json is: ``huggingface/`` inside or beside it, itself, or its parent."""
    for folder in (path / HF_FOLDER, path, path.parent / HF_FOLDER, path.parent):
        if (folder / "config.json").is_file():
            return folder
    return path


# --------------------------------------------------------------------------- verl


def dtensor_globals() -> list[Any]:
    """The classes a DTensor pickle names, and nothing else: the narrowest allowlist that loads verl's files."""
    from torch.distributed._mesh_layout import _FlatLayout, _MeshLayout
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, ShardOrderEntry, TensorMeta

    return [DTensor, DTensorSpec, TensorMeta, ShardOrderEntry, DeviceMesh, _MeshLayout, _FlatLayout, Shard, Replicate]


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
    if not zipfile.is_zipfile(f):
        raise CheckpointError(f"{f}: not a torch zip archive (truncated, or saved by torch < 1.6); save it again")
    try:
        with torch.serialization.safe_globals(dtensor_globals()), _quiet_device_mesh():
            state = torch.load(f, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # code in the pickle, a ShardedTensor, a corrupt file
        raise CheckpointError(
            f"{f}: refused to load ({type(e).__name__}: {str(e).splitlines()[0][:200]}). Only tensors and "
            "DTensors are read (weights_only=True); ShardedTensor checkpoints: convert them with verl's model_merger"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
        raise CheckpointError(f"{f}: expected a state dict (tensor names to tensors)")
    return state


def _rank_files(actor: Path) -> list[Path]:
    """``model_world_size_W_rank_R.pt`` for R = 0 .. W-1, checked complete and against ``fsdp_config.json``."""
    found = {(int(m[1]), int(m[2])): p for p in actor.iterdir() if (m := RANK_FILE.match(p.name))}
    sizes = sorted({w for w, _ in found})
    if len(sizes) != 1:
        raise CheckpointError(f"{actor}: rank files of several world sizes {sizes}; keep one checkpoint per folder")
    (w,) = sizes
    missing = [r for r in range(w) if (w, r) not in found]
    if missing:
        raise CheckpointError(f"{actor}: model_world_size_{w}_rank_{missing[0]}.pt is missing ({len(missing)} of {w})")
    config = actor / "fsdp_config.json"
    if config.is_file():
        declared = read_json_object(config, "fsdp_config.json").get("world_size")
        if declared is not None and declared != w:
            raise CheckpointError(f"{config}: world_size {declared}, but the folder holds {w} rank files")
    return [found[(w, r)] for r in range(w)]


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
        self.files = _rank_files(actor)
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
    if len(dtypes) > 1 or len(trailing) > 1 or numel != math.prod(shape):
        got = [list(p.shape) for p in pieces]
        raise CheckpointError(
            f"{f.parent}: tensor {name!r}: the rank pieces {got} ({sorted(map(str, dtypes))}) do not make its "
            f"shape {list(shape)} (a rank file from another run?)"
        )


# --------------------------------------------------------------------------- DCP


class _MetadataUnpickler(pickle.Unpickler):
    """Builds only DCP metadata records: every other global in ``.metadata`` is refused before it is looked up."""

    def find_class(self, module: str, name: str) -> Any:
        dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if (module, name) not in DCP_METADATA_GLOBALS and not dtype:
            raise pickle.UnpicklingError(f"global {module}.{name} is not a DCP metadata record")
        return getattr(importlib.import_module(module), name)


def read_dcp_metadata(path: Path) -> Any:
    """The ``Metadata`` of a DCP folder, read by ``_MetadataUnpickler`` (never plain ``pickle.load``)."""
    f = path / DCP_METADATA
    if f.stat().st_size > MAX_METADATA_BYTES:
        raise CheckpointError(f"{f}: larger than {MAX_METADATA_BYTES} bytes; not a checkpoint's metadata")
    try:
        with open(f, "rb") as stream:
            metadata = _MetadataUnpickler(stream).load()
    except Exception as e:
        raise CheckpointError(f"{f}: refused to read ({type(e).__name__}: {e}); only DCP metadata is read") from None
    from torch.distributed.checkpoint.metadata import Metadata

    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{f}: holds a {type(metadata).__name__}, not DCP metadata")
    for info in metadata.storage_data.values():
        rel = Path(str(info.relative_path))
        if rel.is_absolute() or ".." in rel.parts:
            raise CheckpointError(f"{f}: data file {str(rel)!r} points outside {path}; refusing to read it")
    return metadata


def dcp_names(metadata: Any) -> dict[str, str]:
    """``{model tensor name: DCP key}``: a state dict saved wrapped (``{"model": sd}``) named by its inner keys;
    with several top-level entries, the ``model`` one."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    keys = [k for k, v in metadata.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)]
    paths = {k: tuple(str(p) for p in (metadata.planner_data or {}).get(k, (k,))) for k in keys}
    tops = {p[0] for p in paths.values() if len(p) > 1}
    if all(len(p) > 1 for p in paths.values()) and (len(tops) == 1 or "model" in tops):
        top = tops.pop() if len(tops) == 1 else "model"
        return {".".join(p[1:]): k for k, p in paths.items() if p[0] == top}
    return {k: k for k in keys}


class DcpCheckpoint:
    """A torch distributed checkpoint read like a ``Checkpoint``: tensors loaded whole, a few kept."""

    keep = 2  # whole tensors kept: the chunk jobs in flight read at most a few tensors at a time

    def __init__(self, ref: str | Path) -> None:
        self.ref = str(ref)
        self.path = Path(ref).expanduser()
        if not is_dcp(self.path):
            raise CheckpointError(f"{ref}: not a torch distributed checkpoint (no .metadata and .distcp files)")
        self.folder = model_files_folder(self.path)
        self.dcp_metadata = read_dcp_metadata(self.path)
        self.metadata: dict[Path, dict[str, str]] = {}
        self.keys = dcp_names(self.dcp_metadata)
        if not self.keys:
            raise CheckpointError(f"{self.path}: the checkpoint holds no tensors")
        self.tensors = {n: self._info(n, k) for n, k in self.keys.items()}
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()

    def _info(self, name: str, key: str) -> TensorInfo:
        md = self.dcp_metadata.state_dict_metadata[key]
        return TensorInfo(name, md.properties.dtype, tuple(int(s) for s in md.size), self.path / DCP_METADATA, 0)

    def __enter__(self) -> DcpCheckpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._cache.clear()

    @property
    def weight_files(self) -> list[Path]:
        files = {str(i.relative_path) for i in self.dcp_metadata.storage_data.values()}
        return [self.path / DCP_METADATA, *(self.path / f for f in sorted(files))]

    def read(self, name: str, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Elements ``[start, stop)`` of tensor ``name``, flattened, in the stored dtype."""
        return self._whole(name).reshape(-1)[start:stop].clone()

    def read_into(self, name: str, start: int, out: torch.Tensor) -> torch.Tensor:
        return out.copy_(self._whole(name).reshape(-1)[start : start + out.numel()])

    def _whole(self, name: str) -> torch.Tensor:
        with self._lock:
            if name in self._cache:
                self._cache.move_to_end(name)
                return self._cache[name]
            while len(self._cache) >= self.keep:  # make room first: at most ``keep`` tensors, even while loading
                self._cache.popitem(last=False)
            value = self._load(name)
            self._cache[name] = value
            return value

    def _load(self, name: str) -> torch.Tensor:
        """Tensor ``name`` whole: its stored pieces read one by one (each a ``torch.save`` item, ``weights_only``)
        into place; pieces stored through a transform (compression) go through ``torch.distributed.checkpoint``."""
        from torch.distributed.checkpoint.metadata import MetadataIndex

        info, key = self.tensors[name], self.keys[name]
        chunks = self.dcp_metadata.state_dict_metadata[key].chunks
        items = [self.dcp_metadata.storage_data.get(MetadataIndex(key, c.offsets)) for c in chunks]
        covered = sum(math.prod(c.sizes) for c in chunks) == info.numel
        if not covered or any(i is None or i.transform_descriptors for i in items):
            return self.load_with_dcp(name)
        if len(chunks) == 1:
            return self._piece(name, items[0], tuple(info.shape))
        value = torch.empty(info.shape, dtype=info.dtype)
        for chunk, item in zip(chunks, items, strict=True):
            region = value
            for dim, (offset, size) in enumerate(zip(chunk.offsets, chunk.sizes, strict=True)):
                region = region.narrow(dim, offset, size)
            region.copy_(self._piece(name, item, tuple(chunk.sizes)))
        return value

    def _piece(self, name: str, item: Any, shape: tuple[int, ...]) -> torch.Tensor:
        f = self.path / str(item.relative_path)
        try:
            with open(f, "rb") as stream:
                view = cast(IO[bytes], _FileView(stream, item.offset, item.length))
                piece = torch.load(view, map_location="cpu", weights_only=True)
        except Exception as e:
            raise CheckpointError(
                f"{f}: cannot read a piece of tensor {name!r} ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
                "the checkpoint is incomplete or corrupt"
            ) from None
        dtype = self.tensors[name].dtype
        if not isinstance(piece, torch.Tensor) or tuple(piece.shape) != shape or piece.dtype != dtype:
            raise CheckpointError(f"{f}: a piece of tensor {name!r} does not have the shape and dtype .metadata gives")
        return piece

    def load_with_dcp(self, name: str) -> torch.Tensor:
        """Tensor ``name`` whole through ``torch.distributed.checkpoint.load`` (no process group)."""
        from torch.distributed.checkpoint.state_dict_loader import load

        info, key = self.tensors[name], self.keys[name]
        value = torch.empty(info.shape, dtype=info.dtype)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "assuming the intent is to load in a single process": it is
                load({key: value}, storage_reader=_reader(self.path, self.dcp_metadata), no_dist=True)
        except Exception as e:
            raise CheckpointError(
                f"{self.path}: cannot read tensor {name!r} ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
                "the checkpoint is incomplete or corrupt"
            ) from None
        return value


class _FileView(io.RawIOBase):
    """Bytes ``offset:offset + length`` of an open file as a seekable stream of their own (what ``torch.load``
    needs to read one item of a ``.distcp`` file without reading it into memory first)."""

    def __init__(self, stream: Any, offset: int, length: int) -> None:
        super().__init__()
        self.stream, self.offset, self.length, self.pos = stream, offset, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.length}[whence]
        self.pos = min(max(base + pos, 0), self.length)
        return self.pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = min(len(view), self.length - self.pos)
        self.stream.seek(self.offset + self.pos)
        got = self.stream.readinto(view[:n]) if n else 0
        self.pos += got
        return got


def _reader(path: Path, metadata: Any) -> Any:
    """torch's ``FileSystemReader`` with the metadata already read safely (its own ``read_metadata`` unpickles
    anything)."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            return metadata

    return SafeReader(path)
