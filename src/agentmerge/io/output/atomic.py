"""The atomic output folder: built in a hidden sibling, renamed into place only when complete.

A failed or killed run leaves at most a hidden ``.NAME.tmp-PID-*`` sibling, which the next run removes.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

from agentmerge.errors import CheckpointError
from agentmerge.io.guards.safety import TMP_MARKER, mark_tmp, output_lock, remove_stale_siblings

NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # full disk, quota, file-size limit


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
