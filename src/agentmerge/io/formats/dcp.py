"""Torch distributed checkpoints (DCP: ``.metadata`` + ``__R_I.distcp``; NeMo RL, AReaL, torchtitan) as models.

The ``.metadata`` pickle (a regular file of at most ``MAX_METADATA_BYTES``) is read by a restricted unpickler
that builds only DCP's metadata records (``DCP_METADATA_GLOBALS``; torch's own reader would unpickle
anything). Every tensor's layout is then proved exact (``dcp_layout``: pieces inside the tensor,
disjoint, covering it; their bytes inside regular data files) before anything else is read. A tensor is
read whole: DCP stores each rank's piece (offsets and sizes per dim) as one ``torch.save`` item at a byte
range of a ``.distcp`` file, which is loaded with ``weights_only=True`` straight from that range and put in
place (a single piece is the tensor itself: no copy); pieces stored through a transform (compression) go
through ``torch.distributed.checkpoint.load`` with no process group. A state dict saved wrapped
(``{"model": state_dict}``, NeMo RL) is named by its inner keys. The last two tensors read are kept
(``DcpCheckpoint.keep``), so memory holds a few whole tensors, never the model.
"""

from __future__ import annotations

import importlib
import io
import pickle
import threading
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import IO, Any, cast

import torch

from agentmerge.errors import CheckpointError
from agentmerge.io.formats.dcp_layout import Layout, Piece, check_records, tensor_layout
from agentmerge.io.formats.tensorfile import TensorInfo
from agentmerge.io.formats.trainer_files import DCP_METADATA, is_dcp, model_files_folder
from agentmerge.io.guards.bounded import regular_file_size

MAX_METADATA_BYTES = 1 << 30
_DCP_META = "torch.distributed.checkpoint.metadata"
DCP_METADATA_GLOBALS = frozenset(
    {(_DCP_META, n) for n in ("Metadata", "TensorStorageMetadata", "TensorProperties", "ChunkStorageMetadata")}
    | {(_DCP_META, n) for n in ("BytesStorageMetadata", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")}
    | {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size")}
    | {("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath")}
)


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
    regular_file_size(f, "DCP .metadata file", MAX_METADATA_BYTES)
    try:
        with open(f, "rb") as stream:
            metadata = _MetadataUnpickler(stream).load()
    except Exception as e:
        raise CheckpointError(f"{f}: refused to read ({type(e).__name__}: {e}); only DCP metadata is read") from None
    from torch.distributed.checkpoint.metadata import Metadata

    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{f}: holds a {type(metadata).__name__}, not DCP metadata")
    check_records(f, metadata)
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
        sizes: dict[str, int] = {}  # each data file's size, checked once
        entries = self.dcp_metadata.state_dict_metadata
        self.layouts = {
            n: tensor_layout(self.path, self.dcp_metadata, k, entries[k], sizes) for n, k in self.keys.items()
        }
        self.tensors = {
            n: TensorInfo(n, lay.dtype, lay.shape, self.path / DCP_METADATA, 0) for n, lay in self.layouts.items()
        }
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._lock = threading.Lock()

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
        """Tensor ``name`` whole: its pieces (proved to cover it exactly once) read one by one into place, each a
        ``torch.save`` item loaded ``weights_only``; pieces stored through a transform go through torch's DCP."""
        layout: Layout = self.layouts[name]
        if any(p.transformed for p in layout.pieces):
            return self.load_with_dcp(name)
        if len(layout.pieces) == 1:
            return self._piece(name, layout.pieces[0])
        value = torch.empty(layout.shape, dtype=layout.dtype)
        for piece in layout.pieces:
            region = value
            for dim, (offset, size) in enumerate(zip(piece.offsets, piece.sizes, strict=True)):
                region = region.narrow(dim, offset, size)
            region.copy_(self._piece(name, piece))
        return value

    def _piece(self, name: str, piece: Piece) -> torch.Tensor:
        item = piece.item
        f = self.path / str(item.relative_path)
        try:
            with open(f, "rb") as stream:
                view = cast(IO[bytes], _FileView(stream, item.offset, item.length))
                value = torch.load(view, map_location="cpu", weights_only=True)
        except Exception as e:
            raise CheckpointError(
                f"{f}: cannot read a piece of tensor {name!r} ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
                "the checkpoint is incomplete or corrupt"
            ) from None
        dtype = self.tensors[name].dtype
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != piece.sizes or value.dtype != dtype:
            raise CheckpointError(f"{f}: a piece of tensor {name!r} does not have the shape and dtype .metadata gives")
        return value

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
