"""Reading files a user hands over within bounds: regular files only, at most so many bytes, so many per line.

``check_reference`` refuses a model reference no file system and no Hub could hold (a 5,000-character
"hub id", a 100 k-character path, a NUL byte) before anything asks the file system about it. A path that
names a device (``/dev/zero``), a FIFO or a folder where a file is expected would make a read
never end, or block forever on open; each reader here checks with ``stat`` (following links) before it
opens anything, and reads at most ``limit + 1`` bytes, so a file that grows while it is read is refused
too. Every refusal is one line of the caller's error type, naming the file, what it was read as, and the
limit.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from agentmerge.errors import AgentMergeError, CheckpointError

MIB = 1 << 20
MAX_PATH_CHARS = 4096  # PATH_MAX on Linux
MAX_NAME_BYTES = 255  # NAME_MAX: one file or folder name; a Hub id part is at most 96 characters


def check_reference(ref: str | Path, what: str = "model reference") -> None:
    """``CheckpointError`` when ``ref`` cannot name a file or a Hub repository: too long, or holding a NUL."""
    text = str(ref)
    longest = max((len(p.encode("utf-8", "surrogateescape")) for p in text.split("/")), default=0)
    if len(text) > MAX_PATH_CHARS or longest > MAX_NAME_BYTES or "\x00" in text:
        raise CheckpointError(
            f"{text[:60]}... ({len(text)} characters): not a usable {what}: a path is at most {MAX_PATH_CHARS} "
            f"characters and each of its names {MAX_NAME_BYTES} bytes, a Hub id at most 96 characters per part"
        )


def _mib(n: int) -> str:
    return f"{n / MIB:g} MiB" if n >= MIB else f"{n} bytes"


def regular_file_size(
    path: Path, what: str, limit: int | None = None, error: type[AgentMergeError] = CheckpointError
) -> int:
    """The size of ``path``, which must be a regular file (links followed) of at most ``limit`` bytes."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise error(f"{path}: cannot read this {what} ({e.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device"
        raise error(f"{path}: not a regular file ({kind}); give the {what} itself")
    if limit is not None and st.st_size > limit:
        raise error(f"{path}: {st.st_size} bytes is too large for a {what} (at most {_mib(limit)})")
    return st.st_size


def read_bounded(path: Path, what: str, limit: int, error: type[AgentMergeError] = CheckpointError) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (one line of ``error`` otherwise)."""
    regular_file_size(path, what, limit, error)
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise error(f"{path}: cannot read this {what} ({e.strerror})") from None
    if len(data) > limit:
        raise error(f"{path}: too large for a {what} (at most {_mib(limit)}; it grew while read)")
    return data


def text_lines(
    path: Path, what: str, limit: int, line_limit: int, error: type[AgentMergeError] = CheckpointError
) -> list[str]:
    """The UTF-8 lines of a bounded text file, each at most ``line_limit`` characters."""
    data = read_bounded(path, what, limit, error)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text (byte {e.start}); save the {what} as UTF-8") from None
    lines = text.splitlines()
    for n, line in enumerate(lines, 1):
        if len(line) > line_limit:
            raise error(f"{path}:{n}: a line of {len(line)} characters; a {what} line holds at most {line_limit}")
    return lines
