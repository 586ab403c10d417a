"""Writing a model folder: planned shards filled at their byte offsets, then config and tokenizer files.

Each shard file is created with its final header and size (``shards.plan_shards``), and chunks are written
at their planned offsets with ``pwrite``, in any order and from any thread.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch

from agentmerge.errors import CheckpointError
from agentmerge.io.formats.checkpoint import link_ok
from agentmerge.io.formats.tensorfile import INDEX_FILE, dtype_from_name, torch_dtype_name
from agentmerge.io.guards import jsontext
from agentmerge.io.guards.strict_json import read_json_object
from agentmerge.io.guards.units import TOKENIZER_FILES
from agentmerge.io.output.atomic import NO_SPACE_ERRNOS
from agentmerge.io.output.shards import PlannedTensor, ShardPlan, index_json

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
                (folder / INDEX_FILE).write_text(jsontext.dumps(index_json(plans, tensors), indent=2) + "\n")
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
        if not link_ok(source, src):
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
    cfg_path.write_text(jsontext.dumps(cfg, indent=2, sort_keys=True) + "\n")


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
    cfg_path.write_text(jsontext.dumps(cfg, indent=2, sort_keys=True) + "\n")


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
