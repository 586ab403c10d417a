"""Reading model folders for the merge engine: the weight files found and checked, element-range reads.

Inputs are Hugging Face model folders: ``model.safetensors``, sharded safetensors with
``model.safetensors.index.json``, or ``pytorch_model.bin`` (read with ``weights_only=True``), local or
``org/name[@revision]`` on the Hub. Safetensors headers are validated (``tensorfile``) before any large
allocation, and tensor data is read with ``pread`` into small buffers, one element range at a time: memory
is bounded by the chunk, never by the model.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

import torch

from agentmerge.errors import CheckpointError
from agentmerge.io.formats.hubref import HubRef, split_revision
from agentmerge.io.formats.localpath import is_missing_local, missing_local_message
from agentmerge.io.formats.tensorfile import (
    BIN_FILE,
    BIN_INDEX_FILE,
    INDEX_FILE,
    SINGLE_FILE,
    TensorInfo,
    read_safetensors_file,
)
from agentmerge.io.guards.bounded import check_reference
from agentmerge.io.guards.strict_json import read_json_object

HUB_PATTERNS = ("*.safetensors", "*.json", "*.txt", "*.model", "*.jinja")  # what a merge reads of a hub model


def resolve_model_path(ref: str | Path) -> Path:
    """A local folder (or single ``.safetensors`` file) as is; ``org/name[@revision]`` through huggingface_hub."""
    check_reference(ref)
    path = Path(ref).expanduser()
    if path.exists():
        return path
    if is_missing_local(str(ref)):
        raise CheckpointError(missing_local_message(str(ref)))
    hub = split_revision(str(ref))
    assert hub is not None  # is_missing_local is False, so ref parses as a Hub id
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise CheckpointError(
            f"{ref}: not a local path, and huggingface_hub is not installed to resolve it as a hub id "
            "(pip install huggingface_hub, or download the model and pass its folder)"
        ) from None
    try:
        return Path(snapshot_download(hub.repo_id, revision=hub.revision, allow_patterns=list(HUB_PATTERNS)))
    except Exception as e:  # offline, unknown repo or revision, gated repo: all end the same way for the user
        raise CheckpointError(_fetch_failed(hub, e)) from None


def _fetch_failed(hub: HubRef, e: Exception) -> str:
    """One line naming the id (and revision) that could not be fetched, and how to get it locally."""
    why = f"{type(e).__name__}: {e}"
    if hub.revision is None:
        return (
            f"{hub}: could not fetch this hub id ({why}); "
            "when offline, download the model first and pass its local folder"
        )
    return (
        f"{hub}: could not fetch revision {hub.revision!r} of hub id {hub.repo_id!r} ({why}); when offline, "
        f"download it first (huggingface-cli download {hub.repo_id} --revision {hub.revision}) and pass its folder"
    )


class Readable(Protocol):
    """What the engine reads a model through: a ``Checkpoint``, or a LoRA adapter on one (``lora.LoraModel``)."""

    ref: str  # what the user named it by (a path, a hub id, MODEL+ADAPTER)
    path: Path
    folder: Path
    tensors: dict[str, TensorInfo]

    @property
    def weight_files(self) -> list[Path]: ...

    def read(self, name: str, start: int = 0, stop: int | None = None) -> torch.Tensor: ...

    def read_into(self, name: str, start: int, out: torch.Tensor) -> torch.Tensor: ...

    def close(self) -> None: ...


class Checkpoint:
    """An opened model folder: tensor names, shapes, dtypes and element-range reads.

    Use as a context manager (or call ``close``). Reads return the stored dtype; the caller converts.
    """

    def __init__(self, ref: str | Path) -> None:
        self.ref = str(ref)
        self.path = resolve_model_path(ref)
        self.folder = self.path if self.path.is_dir() else self.path.parent
        self.tensors: dict[str, TensorInfo] = {}
        self.metadata: dict[Path, dict[str, str]] = {}  # each safetensors file's __metadata__
        self._fds: dict[Path, int] = {}
        self._bin: dict[str, torch.Tensor] = {}
        self._open()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self._bin.clear()

    @property
    def weight_files(self) -> list[Path]:
        """Every file that holds this checkpoint's weights (for hashing and size estimates)."""
        return sorted({i.file for i in self.tensors.values()})

    def read(self, name: str, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Elements ``[start, stop)`` of tensor ``name``, flattened, in the stored dtype."""
        info = self.tensors[name]
        stop = info.numel if stop is None else stop
        if name in self._bin:
            return self._bin[name].reshape(-1)[start:stop].clone()
        return self.read_into(name, start, torch.empty(stop - start, dtype=info.dtype))

    def read_into(self, name: str, start: int, out: torch.Tensor) -> torch.Tensor:
        """Fill ``out`` (contiguous, the stored dtype) with elements ``start:start + out.numel()`` of ``name``."""
        info = self.tensors[name]
        if out.dtype != info.dtype or not out.is_contiguous():
            raise TypeError(f"{name}: read_into needs a contiguous {info.dtype} buffer, got {out.dtype}")
        if not 0 <= start <= start + out.numel() <= info.numel:
            raise IndexError(f"{name}: elements {start}:{start + out.numel()} out of range (it has {info.numel})")
        if name in self._bin:
            return out.copy_(self._bin[name].reshape(-1)[start : start + out.numel()])
        view = out.view(-1).view(torch.uint8).numpy().data.cast("B")
        pos = info.offset + start * info.itemsize
        while len(view):  # pread returns at most ~2 GB at a time
            got = os.preadv(self._fds[info.file], [view], pos)
            if got <= 0:
                raise CheckpointError(f"{info.file}: short read of tensor {name!r} (file changed on disk?)")
            view, pos = view[got:], pos + got
        return out

    def _open(self) -> None:
        files, weight_map = self._safetensors_files()
        if files is None:
            for f in self._bin_files():
                self._load_bin(f)
            return
        for f in files:
            infos, self.metadata[f] = read_safetensors_file(f)
            dup = infos.keys() & self.tensors.keys()
            if dup:
                raise CheckpointError(f"{f}: tensor {sorted(dup)[0]!r} also appears in another shard")
            if weight_map is not None:
                _check_index(f, infos, weight_map)
            self.tensors.update(infos)
            self._fds[f] = os.open(f, os.O_RDONLY)
        missing = [] if weight_map is None else sorted(weight_map.keys() - self.tensors.keys())
        if missing:
            raise CheckpointError(f"{self.path / INDEX_FILE}: tensor {missing[0]!r} is listed but in no shard")

    def _safetensors_files(self) -> tuple[list[Path] | None, dict[str, str] | None]:
        if self.path.is_file():
            if self.path.suffix != ".safetensors":
                raise CheckpointError(f"{self.path}: expected a model folder or a .safetensors file")
            return [self.path], None
        index = self.path / INDEX_FILE
        refuse_ambiguous_weights(self.path)
        if index.exists():
            weight_map = _read_weight_map(index)
            files = [_inside(self.path, s, index) for s in dict.fromkeys(weight_map.values())]
            for f in files:
                if not f.exists():
                    raise CheckpointError(f"{index}: shard {f.name!r} is listed but missing from {self.path}")
            return files, weight_map
        if (self.path / SINGLE_FILE).exists():
            return [_inside(self.path, SINGLE_FILE, self.path / SINGLE_FILE)], None
        return None, None

    def _bin_files(self) -> list[Path]:
        if (self.path / BIN_INDEX_FILE).exists():
            index = self.path / BIN_INDEX_FILE
            return [_inside(self.path, s, index) for s in dict.fromkeys(_read_weight_map(index).values())]
        if (self.path / BIN_FILE).exists():
            return [_inside(self.path, BIN_FILE, self.path / BIN_FILE)]
        raise CheckpointError(f"{self.path}: no weights found (expected {SINGLE_FILE}, {INDEX_FILE} or {BIN_FILE})")

    def _load_bin(self, f: Path) -> None:
        try:
            state = load_plain_pickle(f)
        except CheckpointError:
            raise
        except Exception as e:  # pickle with code in it, or a corrupt file
            raise CheckpointError(
                f"{f}: refused to load ({type(e).__name__}: {str(e).splitlines()[0][:200]}). Only plain "
                "tensor pickles are read (weights_only=True); convert the checkpoint to safetensors"
            ) from None
        if not isinstance(state, dict):
            raise CheckpointError(f"{f}: expected a state dict of tensors")
        for name, t in state.items():
            if not isinstance(t, torch.Tensor):
                raise CheckpointError(f"{f}: entry {name!r} is not a tensor")
            t = t.contiguous()
            self._bin[name] = t
            self.tensors[name] = TensorInfo(name, t.dtype, tuple(t.shape), f, 0)


def _check_index(f: Path, infos: dict[str, TensorInfo], weight_map: dict[str, str]) -> None:
    for name in infos:
        if weight_map.get(name) != f.name:
            raise CheckpointError(f"{f}: tensor {name!r} has no matching entry in {INDEX_FILE}")


def _read_weight_map(index: Path) -> dict[str, str]:
    try:
        weight_map = read_json_object(index, "index")["weight_map"]
    except KeyError as e:
        raise CheckpointError(f"{index}: unreadable index ({type(e).__name__}: {e})") from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{index}: 'weight_map' must map tensor names to shard file names")
    return weight_map


def _inside(folder: Path, name: str, source: Path) -> Path:
    """``folder/name``, refusing names that climb out of ``folder`` (``../``, absolute paths) and links that
    lead outside it (see ``link_ok``). The path is returned unresolved, so file names stay as the index says."""
    parts = Path(name).parts
    if not name or Path(name).is_absolute() or ".." in parts or "\\" in name:
        raise CheckpointError(f"{source}: file name {name!r} points outside {folder}")
    target = folder / name
    if target.exists() and not link_ok(folder, target):
        raise CheckpointError(f"{source}: file {name!r} links outside {folder}; refusing to read it")
    return target


def link_ok(folder: Path, path: Path) -> bool:
    """Whether ``path`` resolves inside ``folder``, or into the ``blobs`` store when ``folder`` is a Hugging Face
    cache snapshot (``.../snapshots/REV/``, whose files are links to ``../../blobs/HASH``)."""
    root, real = folder.resolve(), path.resolve()
    roots = [root] + ([root.parent.parent / "blobs"] if root.parent.name == "snapshots" else [])
    return any(r in real.parents for r in roots)


def refuse_ambiguous_weights(folder: Path) -> None:
    """A folder with both ``model.safetensors`` and an index is ambiguous (transformers would load the single file,
    agentmerge the shards): refused, naming both."""
    if (folder / INDEX_FILE).exists() and (folder / SINGLE_FILE).exists():
        raise CheckpointError(
            f"{folder}: holds both {SINGLE_FILE} and {INDEX_FILE}, so which weights are meant is ambiguous "
            "(transformers loads the single file); remove the one that does not belong"
        )


def load_plain_pickle(f: Path) -> object:
    """A pickle of plain tensors (``weights_only=True``): memory-mapped when it is a zip archive (torch >= 1.6),
    read whole when it is the legacy (non-zip) format, which cannot be mapped."""
    import zipfile

    if zipfile.is_zipfile(f):
        return torch.load(f, map_location="cpu", weights_only=True, mmap=True)
    return torch.load(f, map_location="cpu", weights_only=True)
