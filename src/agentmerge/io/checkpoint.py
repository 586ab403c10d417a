"""Reading and writing model folders for the merge engine: safetensors headers, chunk reads, shard writes.

Inputs are Hugging Face model folders: ``model.safetensors``, sharded safetensors with
``model.safetensors.index.json``, or ``pytorch_model.bin`` (read with ``weights_only=True``).
Safetensors headers are parsed and validated here, before any large allocation, and tensor data is
read with ``pread`` into small buffers, one element range at a time: memory is bounded by the chunk,
never by the model.

Outputs are planned before anything is written (``plan_shards`` is pure), then each shard file is
created with its final header and size, and chunks are written at their planned byte offsets with
``pwrite``, in any order and from any thread. The whole output folder is built in a hidden sibling
and renamed into place only when complete (``atomic_output_dir``).

Safetensors layout: ``u64 little-endian N | N bytes of JSON header | data``, where each header entry
is ``{"dtype": "BF16", "shape": [...], "data_offsets": [begin, end]}`` relative to the data start.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import shutil
import struct
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from agentmerge.errors import CheckpointError
from agentmerge.io.bounded import check_reference
from agentmerge.io.headers import check_data_covered, header_metadata, parse_header_json, read_json_object
from agentmerge.io.hubref import HubRef, split_revision
from agentmerge.io.localpath import is_missing_local, missing_local_message
from agentmerge.io.safety import TMP_MARKER, mark_tmp, output_lock, remove_stale_siblings
from agentmerge.io.units import TOKENIZER_FILES

SAFE_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in SAFE_DTYPES.items()}
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors library's own limit
NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # full disk, quota, file-size limit
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
BIN_FILE = "pytorch_model.bin"
BIN_INDEX_FILE = "pytorch_model.bin.index.json"


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: file, absolute byte offset of its data, dtype and shape."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    file: Path
    offset: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


def dtype_from_name(name: str) -> torch.dtype:
    """``"bfloat16"``/``"bf16"``/``"BF16"`` -> ``torch.bfloat16`` (and likewise for float16/32)."""
    table = {
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
        "half": torch.float16,
        "float32": torch.float32,
        "fp32": torch.float32,
        "float": torch.float32,
        "float64": torch.float64,
    }
    key = name.lower().removeprefix("torch.")
    if key in table:
        return table[key]
    if name.upper() in SAFE_DTYPES:
        return SAFE_DTYPES[name.upper()]
    raise ValueError(f"unknown dtype {name!r}; use one of bfloat16, float16, float32")


def torch_dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (the spelling config.json uses)."""
    return str(dtype).removeprefix("torch.")


# --------------------------------------------------------------------------- safetensors headers


def read_safetensors_header(path: Path) -> dict[str, TensorInfo]:
    """Parse and validate a safetensors header without reading tensor data.

    Rejects (``CheckpointError``) a truncated file, an oversized or malformed header, unknown dtypes,
    negative or non-integer shapes, byte ranges that disagree with dtype x shape, ranges out of the
    file's bounds and ranges that overlap; and, as the safetensors library does, a header that is not
    UTF-8, repeats a name or has a non-string ``__metadata__``, and data bytes no tensor covers.
    """
    return read_safetensors_file(path)[0]


def read_safetensors_file(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """``(tensors, __metadata__)`` of a safetensors file, validated as ``read_safetensors_header`` says."""
    if path.is_dir():
        raise CheckpointError(f"{path}: is a folder, not a safetensors file; remove or rename it")
    size = _file_size(path)
    if size < 8:
        raise CheckpointError(f"{path}: {size} bytes is too short for a safetensors file (truncated?)")
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > MAX_HEADER_BYTES or n > size - 8:
            raise CheckpointError(
                f"{path}: header length {n} is larger than the file or the {MAX_HEADER_BYTES}-byte limit "
                "(corrupt or truncated file)"
            )
        raw = f.read(n)
    header = parse_header_json(path, raw)
    metadata = header_metadata(path, header.pop("__metadata__", None))
    data_start, data_len = 8 + n, size - 8 - n
    infos = {name: _parse_entry(path, name, entry, data_start) for name, entry in header.items()}
    _check_ranges(path, infos, data_start, data_len)
    check_data_covered(path, infos, data_start, data_len)
    return infos, metadata


def _parse_entry(path: Path, name: object, entry: object, data_start: int) -> TensorInfo:
    if not isinstance(name, str) or not isinstance(entry, dict):
        raise CheckpointError(f"{path}: malformed header entry {name!r}")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in SAFE_DTYPES:
        raise CheckpointError(f"{path}: tensor {name!r} has unsupported dtype {dtype!r}")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise CheckpointError(f"{path}: tensor {name!r} has an invalid shape {shape!r}")
    ok_offsets = isinstance(offsets, list) and len(offsets) == 2
    if not ok_offsets or not all(type(o) is int and o >= 0 for o in offsets):  # type: ignore[union-attr]
        raise CheckpointError(f"{path}: tensor {name!r} has invalid data_offsets {offsets!r}")
    begin, end = offsets  # type: ignore[misc]
    info = TensorInfo(name, SAFE_DTYPES[dtype], tuple(shape), path, data_start + begin)
    if end - begin != info.nbytes:
        raise CheckpointError(
            f"{path}: tensor {name!r} covers {end - begin} bytes but {dtype} x {shape} needs {info.nbytes}"
        )
    return info


def _check_ranges(path: Path, infos: dict[str, TensorInfo], data_start: int, data_len: int) -> None:
    spans = sorted((i.offset - data_start, i.offset - data_start + i.nbytes, i.name) for i in infos.values())
    prev_end, prev_name = 0, ""
    for begin, end, name in spans:
        if end > data_len:
            raise CheckpointError(
                f"{path}: tensor {name!r} ends at byte {end} but the file holds {data_len} data bytes "
                "(truncated download? fetch the file again)"
            )
        if begin < prev_end:
            raise CheckpointError(f"{path}: tensors {prev_name!r} and {name!r} overlap in the file")
        prev_end, prev_name = max(prev_end, end), name


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror})") from None


# --------------------------------------------------------------------------- reading


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
    lead outside it (see ``_link_ok``). The path is returned unresolved, so file names stay as the index says."""
    parts = Path(name).parts
    if not name or Path(name).is_absolute() or ".." in parts or "\\" in name:
        raise CheckpointError(f"{source}: file name {name!r} points outside {folder}")
    target = folder / name
    if target.exists() and not _link_ok(folder, target):
        raise CheckpointError(f"{source}: file {name!r} links outside {folder}; refusing to read it")
    return target


def _link_ok(folder: Path, path: Path) -> bool:
    """Whether ``path`` resolves inside ``folder``, or into the ``blobs`` store when ``folder`` is a Hugging Face
    cache snapshot (``.../snapshots/REV/``, whose files are links to ``../../blobs/HASH``)."""
    root, real = folder.resolve(), path.resolve()
    roots = [root] + ([root.parent.parent / "blobs"] if root.parent.name == "snapshots" else [])
    return any(r in real.parents for r in roots)


# --------------------------------------------------------------------------- shard planning (pure)


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
    header = json.dumps(entries, separators=(",", ":")).encode()
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


# --------------------------------------------------------------------------- writing


WRITEBACK_BYTES = 64 << 20  # start writing a file's dirty pages to disk after this many new bytes


def _writeback_starter() -> Callable[[int], None] | None:
    """Linux ``sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE)``: start writeback without waiting; None elsewhere."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]

    def start(fd: int) -> None:
        call(fd, 0, 0, 2)  # SYNC_FILE_RANGE_WRITE; a failure only means the final fsync does all the work

    return start


class ShardWriter:
    """Writes planned shards: files are created at full size up front, chunks land at their offsets.

    ``write`` may be called from several threads at once and in any order. Every ``WRITEBACK_BYTES`` of
    new data per file the kernel is asked to start writing it out (Linux), so the disk works while chunks
    are still being computed and the final ``fsync`` waits only for the tail.
    """

    def __init__(self, folder: Path, plans: Sequence[ShardPlan], tensors: Sequence[PlannedTensor]) -> None:
        self.folder = folder
        self._where: dict[str, tuple[int, int]] = {}
        self._fds: list[int] = []
        self._dtypes = {t.name: t.dtype for t in tensors}
        self._pending: dict[int, int] = {}  # fd -> bytes written since writeback was last started
        self._lock = threading.Lock()
        self._writeback = _writeback_starter()
        try:
            for plan in plans:
                fd = os.open(folder / plan.file_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                self._fds.append(fd)
                _reserve(fd, plan.size, folder / plan.file_name)
                os.pwrite(fd, plan.header, 0)
                for name, off in plan.offsets.items():
                    self._where[name] = (fd, off)
            if len(plans) > 1:
                (folder / INDEX_FILE).write_text(json.dumps(index_json(plans, tensors), indent=2) + "\n")
        except BaseException:  # a full disk at reservation: close what was opened before re-raising
            for fd in self._fds:
                os.close(fd)
            self._fds.clear()
            raise

    def write(self, name: str, start: int, values: torch.Tensor) -> None:
        """Write flat ``values`` (already in the planned dtype) as elements ``start...`` of ``name``."""
        if values.dtype != self._dtypes[name]:
            raise TypeError(f"{name}: got {values.dtype}, planned {self._dtypes[name]}")
        fd, off = self._where[name]
        data = values.contiguous().view(torch.uint8).numpy().data
        pos = off + start * values.element_size()
        view = data.cast("B")
        while len(view):
            n = os.pwrite(fd, view, pos)
            view, pos = view[n:], pos + n
        self._written(fd, len(data))

    def _written(self, fd: int, nbytes: int) -> None:
        if self._writeback is None:
            return
        with self._lock:
            self._pending[fd] = self._pending.get(fd, 0) + nbytes
            due = self._pending[fd] >= WRITEBACK_BYTES
            if due:
                self._pending[fd] = 0
        if due:
            self._writeback(fd)

    def close(self) -> None:
        for fd in self._fds:
            os.fsync(fd)
            os.close(fd)
        self._fds.clear()


def _reserve(fd: int, size: int, path: Path) -> None:
    """Allocate the file's blocks now, so a full disk fails before any work, with a clear message."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno in NO_SPACE_ERRNOS:
            raise CheckpointError(f"{path}: not enough disk space for {size / 1e6:.1f} MB of output") from None
        os.ftruncate(fd, size)  # file systems without fallocate


# --------------------------------------------------------------------------- output folder


@contextlib.contextmanager
def atomic_output_dir(out: Path, *, force: bool = False) -> Iterator[Path]:
    """Yield a hidden temporary sibling of ``out``; on success rename it to ``out``, else delete it.

    An existing non-empty ``out`` is refused unless ``force``; with ``force`` the old folder is
    replaced only after the new one is complete. A killed process leaves at most a hidden
    ``.NAME.tmp-PID-*`` sibling, which the next run removes.
    """
    out = out.resolve()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CheckpointError(f"{out}: cannot create its parent folder ({e.strerror}); choose another output") from None
    with output_lock(out):
        if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
            raise CheckpointError(f"{out}: output folder exists and is not empty (pass --force to replace it)")
        _remove_stale_tmp(out)
        remove_stale_siblings(out.parent)
        with _atomic_tmp(out) as tmp:
            yield tmp


@contextlib.contextmanager
def _atomic_tmp(out: Path) -> Iterator[Path]:
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
        mark_tmp(tmp)
    except BaseException as e:  # a signal between mkdir and the marker must not leave the folder behind either
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError):
            raise CheckpointError(
                f"{out}: cannot write in {out.parent} ({e.strerror}); choose another output"
            ) from None
        raise
    try:
        yield tmp
        (tmp / TMP_MARKER).unlink(missing_ok=True)
        _fsync_tree(tmp)
        _replace(tmp, out)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if e.errno in NO_SPACE_ERRNOS:  # a write after the reservation (sparse files, metadata, quotas)
            raise CheckpointError(
                f"{out}: the disk is full or over quota while writing the output ({e.strerror}); "
                "free some space or write elsewhere (nothing was left behind)"
            ) from None
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _replace(tmp: Path, out: Path) -> None:
    if out.exists():
        trash = out.parent / f".{out.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.rename(out, trash)
        os.rename(tmp, out)
        shutil.rmtree(trash) if trash.is_dir() else trash.unlink()
    else:
        os.rename(tmp, out)
    _fsync_dir(out.parent)


def _remove_stale_tmp(out: Path) -> None:
    """Remove the ``.NAME.tmp-PID-*`` and ``.NAME.old-PID-*`` siblings that killed runs left."""
    for kind in ("tmp", "old"):
        for p in out.parent.glob(f".{out.name}.{kind}-*"):
            pid = p.name.split(f".{kind}-")[-1].split("-")[0]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(p, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync_tree(folder: Path) -> None:
    """Flush every file in ``folder`` and the folder itself, so the rename publishes complete data."""
    for f in folder.iterdir():
        if f.is_file() and not f.is_symlink():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    _fsync_dir(folder)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def copy_aux_files(source: Path, dest: Path, names: Sequence[str]) -> list[str]:
    """Copy those of ``names`` (e.g. ``MODEL_FILES``, ``TOKENIZER_FILES``) that exist in ``source`` to ``dest``.

    Links that resolve outside ``source`` are refused (a hostile checkpoint must not make us copy
    ``/etc/passwd`` into a model folder), except into a Hugging Face cache's blob store; so are
    files that are not regular files.
    """
    copied = []
    for name in names:
        src = source / name
        if not src.exists():
            continue
        if not _link_ok(source, src):
            raise CheckpointError(f"{src}: links outside the model folder; refusing to copy it")
        if not src.resolve().is_file():  # a FIFO or device would hang or never end
            raise CheckpointError(f"{src}: not a regular file; refusing to copy it")
        shutil.copyfile(src.resolve(), dest / name)
        copied.append(name)
    return copied


def set_config_dtype(folder: Path, dtype: torch.dtype) -> None:
    """Record the written dtype in ``config.json`` (``torch_dtype`` and/or ``dtype``)."""
    cfg_path = folder / "config.json"
    if not cfg_path.exists():
        return
    cfg = read_json_object(cfg_path, "config.json")
    keys = [k for k in ("torch_dtype", "dtype") if k in cfg] or ["torch_dtype"]
    for k in keys:
        cfg[k] = torch_dtype_name(dtype)
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def update_config(folder: Path, values: Mapping[str, object], vocab_size: int | None = None) -> None:
    """Set ``values`` in the folder's ``config.json``, and ``vocab_size`` (also in ``text_config``, where it is)."""
    cfg_path = folder / "config.json"
    if not cfg_path.exists() or not (values or vocab_size):
        return
    cfg = read_json_object(cfg_path, "config.json")
    cfg.update(values)
    text = cfg.get("text_config")
    nested = isinstance(text, dict) and "vocab_size" in text
    if vocab_size is not None and nested:
        text["vocab_size"] = vocab_size  # type: ignore[index]
    if vocab_size is not None and ("vocab_size" in cfg or not nested):
        cfg["vocab_size"] = vocab_size
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def finish_model_files(
    folder: Path,
    model: Path,
    tokenizer: Path | None,
    dtype: str | None,
    *,
    generation: Path | None = None,
    config_values: Mapping[str, object] | None = None,
    vocab_size: int | None = None,
) -> None:
    """Give a folder of freshly written shards the rest of a model folder.

    ``config.json`` comes from ``model``, ``generation_config.json`` from ``generation`` (default: ``model``),
    the tokenizer files from ``tokenizer`` (default: ``model``); ``config.json`` then gets ``config_values``
    (token ids from the tokenizer's source), ``vocab_size`` (added vocabulary rows) and ``dtype`` when the
    weights were written in another dtype than the model's.
    """
    copy_aux_files(model, folder, ["config.json"])
    copy_aux_files(generation or model, folder, ["generation_config.json"])
    copy_aux_files(tokenizer or model, folder, TOKENIZER_FILES)
    update_config(folder, config_values or {}, vocab_size)
    if dtype:
        set_config_dtype(folder, dtype_from_name(dtype))


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
