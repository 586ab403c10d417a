"""Guards around everything agentmerge writes: which output paths may be replaced, one writer per output
name, stale temporary folders of crashed runs, atomic report files, and termination signals.

Rules (``check_output_target``):

- An output is never an input, inside an input, a parent of an input, the current directory or one of its
  parents, whatever the flags.
- An existing non-empty output is replaced only with ``force``, and then only when it is recognisably an
  earlier agentmerge merge (it has ``merge.json``) holding nothing but the files a merge writes.
  ``force_any`` (``--force-any``) replaces any other folder or file at that path.

Files a command writes (reports, configs, plots; ``refuse_write_over``) are never an input (by path, symlink or
hard link), never inside a model input's folder, never inside the command's own output folder, and never the
file another of its output flags names. ``guards.pathargs`` applies these rules to every command's declared output
arguments before it runs.

Two runs writing the same output name take turns: ``output_lock`` holds an exclusive ``flock`` on a hidden
``.NAME.lock`` sibling for the whole run, so the second one fails at once instead of silently replacing
the first one's result.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import signal
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import FrameType

from agentmerge.errors import CheckpointError, MergeError
from agentmerge.io.guards.units import MODEL_FILES, TOKENIZER_FILES

TMP_MARKER = ".agentmerge-tmp"  # written into every hidden temporary folder, so stale ones are recognisable
MERGE_RECORD = "merge.json"
_MERGE_OUTPUT_FILES = frozenset(
    {MERGE_RECORD, "README.md", "model.safetensors", "model.safetensors.index.json", *MODEL_FILES, *TOKENIZER_FILES}
)
_SHARD = re.compile(r"model-\d{5}-of-\d{5}\.safetensors|model-[A-Z0-9_]+\.gguf")  # shards; merge --gguf's file
_TMP_SIBLING = re.compile(r"\..+\.(?:tmp|old)-(\d+)-[0-9a-f]{8}")


class Terminated(BaseException):
    """Raised in the main thread when SIGTERM arrives, so cleanup runs exactly as for Ctrl-C."""


def _folder_of(ref: str | Path) -> Path | None:
    src = Path(ref).expanduser()
    if not src.exists():
        return None
    return src.resolve() if src.is_dir() else src.resolve().parent


def _input_path(ref: str | Path) -> tuple[Path, bool] | None:
    """``(resolved path, is a folder)`` of an existing input, else None (a hub id)."""
    src = Path(ref).expanduser()
    return (src.resolve(), src.is_dir()) if src.exists() else None


def refuse_overlap(out: Path, refs: Iterable[str | Path | None], what: str = "output folder") -> None:
    """``MergeError`` when ``out`` is, contains or lies inside an input, or is or contains the current folder."""
    target = out.expanduser().resolve()
    cwd = Path.cwd().resolve()
    if target == cwd or target in cwd.parents:
        raise MergeError(f"{out}: the {what} must not be the current directory or contain it; name a new folder")
    for ref in refs:
        found = None if ref is None else _input_path(ref)
        if found is None:
            continue
        path, is_dir = found
        inside = is_dir and path in target.parents  # a single-file input may sit next to the output
        if target == path or inside or target in path.parents:
            raise MergeError(f"{out}: the {what} must not be, contain or lie inside input {ref}")


def _input_folder(ref: str | Path) -> Path | None:
    """The folder a model input protects: the folder itself, or the folder of a model given as one file."""
    found = _input_path(ref)
    return None if found is None else (found[0] if found[1] else found[0].parent)


def _same(a: Path, b: Path) -> bool:
    """Whether two resolved paths name one file (symlinks resolved already; hard links by inode)."""
    if a == b:
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def refuse_write_over(
    target: Path,
    flag: str,
    *,
    models: Iterable[str | Path] = (),
    files: Iterable[str | Path] = (),
    folders: Iterable[str | Path] = (),
    written: Iterable[tuple[str, str | Path]] = (),
) -> None:
    """``CheckpointError`` when a file a command writes (``flag``'s value ``target``) would lose data.

    Refused: ``target`` is an input file or folder (``files``, ``models``; by path, symlink or hard link), lies
    inside a model input's folder (a model given as one file protects its whole folder), lies inside or is one
    of the command's own output folders (``folders``), or is the file another output flag writes (``written``:
    ``(flag, path)`` pairs). Nothing is touched.
    """
    t = target.expanduser().resolve()
    _refuse_inputs(t, f"{target}: {flag}", models, files, "write it elsewhere")
    for ref in folders:
        out = Path(ref).expanduser().resolve()
        if t == out or out in t.parents:
            raise CheckpointError(f"{target}: {flag} must not write inside the output folder {ref}; write it elsewhere")
    for other, path in written:
        if _same(t, Path(path).expanduser().resolve()):
            raise CheckpointError(f"{target}: {flag} and {other} name the same file; give each its own")


def refuse_into_input(out: Path, flag: str, models: Iterable[str | Path], files: Iterable[str | Path]) -> None:
    """A folder a command writes files into must not be an input, nor lie inside a model input's folder."""
    _refuse_inputs(out.expanduser().resolve(), f"{out}: {flag}", models, files, "write into another folder")


def _refuse_inputs(t: Path, shown: str, models: Iterable[str | Path], files: Iterable[str | Path], fix: str) -> None:
    models = list(models)
    for ref in [*models, *files]:
        found = _input_path(ref)
        if found is not None and _same(t, found[0]):
            raise CheckpointError(f"{shown} names input {ref}, which it would overwrite; {fix}")
    for ref in models:
        folder = _input_folder(ref)
        if folder is not None and (folder in t.parents or _linked_into(t, folder)):
            raise CheckpointError(f"{shown} must not write inside input folder {ref}; {fix}")


def _linked_into(t: Path, folder: Path) -> bool:
    """Whether file ``t`` is a hard link to a file directly in ``folder`` (only looked for when it has links)."""
    try:
        if not t.is_file() or t.stat().st_nlink < 2:
            return False
        return any(_same(t, p.resolve()) for p in folder.iterdir() if p.is_file())
    except OSError:
        return False


def check_output_target(
    out: Path, refs: Iterable[str | Path | None], *, force: bool = False, force_any: bool = False
) -> None:
    """Refuse an output path that would lose data (see the module docstring); nothing is touched."""
    refuse_overlap(out, refs)
    target = out.expanduser().resolve()
    if not target.exists() and not target.is_symlink():
        return
    if target.is_dir() and not any(target.iterdir()):
        return
    if force_any:
        return
    if not force:
        raise CheckpointError(
            f"{target}: output folder exists and is not empty (pass --force to replace an earlier agentmerge output)"
        )
    if not target.is_dir() or not (target / MERGE_RECORD).is_file():
        raise CheckpointError(
            f"{target}: not an earlier agentmerge output (no {MERGE_RECORD}); --force replaces only those; "
            "choose another folder, or pass --force-any to replace it anyway"
        )
    others = sorted(p.name for p in target.iterdir() if not _merge_output_file(p))
    if others:
        raise CheckpointError(
            f"{target}: holds files a merge did not write ({', '.join(others[:3])}); move them away, "
            "or pass --force-any to delete them with the old output"
        )


def _merge_output_file(p: Path) -> bool:
    return p.is_file() and not p.is_symlink() and (p.name in _MERGE_OUTPUT_FILES or bool(_SHARD.fullmatch(p.name)))


@contextlib.contextmanager
def output_lock(out: Path) -> Iterator[None]:
    """Hold an exclusive lock on the output name ``out`` (a hidden ``.NAME.lock`` sibling) for the block."""
    lock = out.parent / f".{out.name}.lock"
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise CheckpointError(f"{out.parent}: cannot write there ({e.strerror}); choose another output") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise CheckpointError(
                    f"{out}: another agentmerge run is writing this output now; wait for it or choose another name"
                ) from None
            raise
        try:  # the holder before us may have removed the file after we opened it: lock the live one
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)
        os.close(fd)


def mark_tmp(tmp: Path) -> None:
    """Mark a fresh hidden temporary folder as agentmerge's, so a later run may remove it if its process died."""
    (tmp / TMP_MARKER).write_bytes(b"")


def remove_stale_siblings(parent: Path) -> list[Path]:
    """Remove every marked ``.NAME.tmp-PID-*`` / ``.NAME.old-PID-*`` folder in ``parent`` whose process is gone."""
    removed: list[Path] = []
    try:
        entries = list(parent.iterdir())
    except OSError:
        return removed
    for p in entries:
        m = _TMP_SIBLING.fullmatch(p.name)
        if m is None or not p.is_dir() or p.is_symlink() or not (p / TMP_MARKER).is_file():
            continue
        if not _alive(int(m.group(1))):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def check_writable_parent(out: Path) -> None:
    """``CheckpointError`` when the output's nearest existing parent folder cannot be written."""
    p = out.expanduser().resolve().parent
    while not p.exists() and p != p.parent:
        p = p.parent
    if not p.is_dir() or not os.access(p, os.W_OK | os.X_OK):
        raise CheckpointError(f"{out}: cannot write in {p} (permission denied); choose another output folder")


def check_report_path(path: Path, flag: str) -> None:
    """A report path must name a file in an existing folder (checked before the work, so nothing is wasted)."""
    target = path.expanduser()
    if target.is_dir():
        raise CheckpointError(f"{target}: {flag} names a folder; give a file name")
    if not target.parent.is_dir():
        raise CheckpointError(f"{target}: {flag}: folder {target.parent} does not exist; create it first")


def write_report(path: str | Path, data: str, flag: str) -> None:
    """Write a text report atomically (a hidden sibling renamed into place), or one clear error."""
    write_report_with(path, flag, lambda tmp: tmp.write_text(data))


def write_report_with(path: str | Path, flag: str, writer: Callable[[Path], object]) -> None:
    """``writer(tmp)`` writes the report into a hidden sibling, which then replaces ``path`` in one rename."""
    target = Path(path).expanduser()
    check_report_path(target, flag)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}{target.suffix}"
    try:
        writer(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise CheckpointError(f"{target}: cannot write {flag} ({e.strerror})") from None
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated()


@contextlib.contextmanager
def terminate_as_exception() -> Iterator[None]:
    """While the block runs in the main thread, SIGTERM raises ``Terminated`` (cleanup runs as for Ctrl-C)."""
    try:
        before = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def interrupted_message(e: BaseException) -> tuple[str, int]:
    """The one line and exit status for Ctrl-C (130) and SIGTERM (143)."""
    if isinstance(e, Terminated):
        return "agentmerge: terminated (SIGTERM); nothing was left half-written", 128 + signal.SIGTERM
    return "agentmerge: interrupted; nothing was left half-written", 130
