"""Digests of the input weight files that merge.json records, computed on a background thread.

Three modes (``agentmerge merge --hash``, ``merge(..., hashing=...)``, ``$AGENTMERGE_HASH``):

- ``fast`` (default): a file's sha256 when knowing it costs nothing (a Hugging Face cache stores LFS files
  as ``blobs/<sha256>``, found by following the snapshot's link: recorded with ``"sha256_from": "hub blob
  name"``, since the bytes were not read; or ``sha256.json`` already holds it from an earlier read), else
  its xxh3_128. xxh3_128 is a 128-bit non-cryptographic hash that runs at memory speed (about 0.17 CPU seconds
  per GB on this project's machine, against 0.68 for sha256), so a first merge of new files is not held back
  by hashing (docs/performance.md, "First merge of new files"). It identifies a file against accidental
  change (two different files agree with probability about 2^-128), not against a crafted collision: use
  ``sha256`` for that.
- ``sha256``: sha256 of every file's bytes (the digest the Hub shows for LFS files), read even when a Hub
  blob's name gives one: a blob whose bytes do not match its name is noted in ``errors`` (a damaged or
  tampered cache); slow on a first merge.
- ``none``: no digests (``sha256: null``). ``AGENTMERGE_NO_HASH=1`` is an alias of ``AGENTMERGE_HASH=none``.

Files are read through memory maps of ``WINDOW`` bytes at a time (no copy into Python buffers, resident
memory bounded by one window); both hashes release the GIL on large blocks, so the background thread
overlaps the merge's kernels, at a lowered priority. The digests are cached in ``cache_dir()``
(``sha256.json``, ``xxh3_128.json``) by file identity (``cache.file_key``: real path, size, mtime_ns,
ctime_ns, inode), so a file changed in any way is hashed again and an unchanged one never is.

Hashing serves the record, not the merge: a file that cannot be read, a cancelled run, or anything else that
goes wrong on the thread leaves its digest null and a note in ``InputDigests.errors``; it never fails the
merge. The stores' entries are sealed with a checksum (``cache.seal``): a damaged entry is hashed again.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

import xxhash

from agentmerge.errors import ConfigError
from agentmerge.io.cache.store import cache_dir, file_key, load_store, save_store, seal, unseal

HashMode = Literal["fast", "sha256", "none"]
HASH_MODES: tuple[HashMode, ...] = ("fast", "sha256", "none")
ALGORITHMS = ("sha256", "xxh3_128")  # what a digest may be, strongest first
WINDOW = 64 * 1024 * 1024  # bytes mapped at a time (a multiple of mmap.ALLOCATIONGRANULARITY)
HEX_LENGTH = {"sha256": 64, "xxh3_128": 32}
CACHE_ENTRIES = 10_000  # per store, the most recent kept


def hash_mode(mode: str | None = None) -> HashMode:
    """``mode`` if given, else ``$AGENTMERGE_HASH``, else ``none`` when ``AGENTMERGE_NO_HASH=1``, else ``fast``."""
    source = "hashing"
    if mode is None:
        mode, source = os.environ.get("AGENTMERGE_HASH") or None, "AGENTMERGE_HASH"
    if mode is None:
        return "none" if os.environ.get("AGENTMERGE_NO_HASH") == "1" else "fast"
    if mode not in HASH_MODES:
        raise ConfigError(f"{source}={mode!r} is not a hashing mode: use one of {', '.join(HASH_MODES)}")
    return mode


@dataclass(frozen=True)
class Digest:
    """What is known of one file: its sha256, or else its xxh3_128 (hex), or neither."""

    sha256: str | None = None
    xxh3_128: str | None = None
    from_name: bool = False  # the sha256 is a Hub blob's name, its bytes not read

    def fields(self) -> dict[str, str | None]:
        """merge.json's fields: ``sha256`` (hex or null), ``sha256_from`` when it was read from a Hub blob's name,
        and ``xxh3_128`` when that is the digest taken."""
        named = {"sha256_from": "hub blob name"} if self.from_name else {}
        return {"sha256": self.sha256} | named | ({"xxh3_128": self.xxh3_128} if self.xxh3_128 else {})


class InputDigests:
    """Digests of input weight files, computed (or looked up) on a background thread while the merge runs."""

    def __init__(self, files: Sequence[Path], mode: HashMode = "fast", *, background: bool = False) -> None:
        self.files = [Path(f) for f in dict.fromkeys(str(f) for f in files)]
        self.mode = mode
        self.errors: list[str] = []
        self._digests: dict[str, Digest] = {}
        self._ran = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if background and mode != "none":
            self._thread = threading.Thread(target=self._run, name="agentmerge-digests", daemon=True)
            self._thread.start()

    @classmethod
    def start(cls, files: Sequence[Path], mode: HashMode = "fast") -> InputDigests:
        """Start on a background thread."""
        return cls(files, mode, background=True)

    def cancel(self) -> None:
        """Stop within one window of reading (a failed merge should not keep reading its inputs)."""
        self._stop.set()

    def result(self) -> dict[str, Digest]:
        """``{str(path): Digest}`` for every file (empty digests where none was taken); waits for the thread."""
        if self._thread is None:
            self._run()
        else:
            self._thread.join()
        return {str(f): self._digests.get(str(f), Digest()) for f in self.files}

    def _run(self) -> None:
        if self.mode == "none" or self._ran:
            return
        self._ran = True
        try:
            self._hash_all()
        except Exception as e:  # the thread must not die silently: the record says why digests are missing
            self.errors.append(f"digests: {type(e).__name__}: {str(e)[:200]}")

    def _hash_all(self) -> None:
        if self._thread is not None:
            with contextlib.suppress(OSError, AttributeError):  # Linux: lower this thread's priority only
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        stores = {algo: _load_cache(algo) for algo in ALGORITHMS}
        fresh: dict[str, dict[str, str]] = {algo: {} for algo in ALGORITHMS}
        for f in self.files:
            try:
                if self._stop.is_set():
                    raise _Cancelled
                key = file_key(f)
                digest, computed = self._digest(f, key, stores)
            except _Cancelled:
                self.errors.append(f"{f}: not hashed (the merge stopped first)")
                continue
            except Exception as e:  # the record loses one digest; the merge goes on
                self.errors.append(f"{f}: could not hash it ({type(e).__name__}: {e})")
                continue
            self._digests[str(f)] = digest
            if computed:
                fresh[computed][key] = cast(str, getattr(digest, computed))
        for algo, entries in fresh.items():
            if entries:
                _save_cache(algo, entries)

    def _digest(self, f: Path, key: str, stores: dict[str, dict[str, str]]) -> tuple[Digest, str | None]:
        """The digest of ``f`` and the algorithm run to get it (None when it was free)."""
        known, named = stores["sha256"].get(key), hub_blob_digest(f)
        if known:
            return Digest(sha256=known), None
        if self.mode == "sha256":
            real = sha256_file(f, self._stop)
            if named and named != real:
                self.errors.append(f"{f}: its bytes have sha256 {real}, not the {named} its Hub blob name says")
            return Digest(sha256=real), "sha256"
        if named:
            return Digest(sha256=named, from_name=True), None
        cached = stores["xxh3_128"].get(key)
        if cached:
            return Digest(xxh3_128=cached), None
        return Digest(xxh3_128=xxh3_file(f, self._stop)), "xxh3_128"


class _Cancelled(Exception):
    """``stop`` was set while a file was being read."""


def hub_blob_digest(path: Path) -> str | None:
    """The sha256 a Hugging Face cache already names the file by (``blobs/<sha256>``, LFS files), else None."""
    real = path.resolve()
    name = real.name
    if real.parent.name == "blobs" and len(name) == 64 and all(c in "0123456789abcdef" for c in name):
        return name
    return None


def sha256_file(path: Path, stop: threading.Event | None = None) -> str:
    """Hex sha256 of a file."""
    h = hashlib.sha256()
    _feed(path, h.update, stop)
    return h.hexdigest()


def xxh3_file(path: Path, stop: threading.Event | None = None) -> str:
    """Hex xxh3_128 of a file (the same as ``xxhash.xxh3_128(data).hexdigest()`` of its bytes)."""
    h = xxhash.xxh3_128()
    _feed(path, h.update, stop)
    return h.hexdigest()


def _feed(path: Path, update: Callable[[mmap.mmap], object], stop: threading.Event | None) -> None:
    """Pass a file's bytes to ``update`` one memory-mapped ``WINDOW`` at a time; stops when ``stop`` is set."""
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        for offset in range(0, size, WINDOW):
            if stop is not None and stop.is_set():
                raise _Cancelled
            length = min(WINDOW, size - offset)
            with mmap.mmap(f.fileno(), length, access=mmap.ACCESS_READ, offset=offset) as window:
                with contextlib.suppress(AttributeError, OSError):  # madvise: Python >= 3.8 on Unix
                    window.madvise(mmap.MADV_SEQUENTIAL)
                update(window)


def cache_path(algo: str) -> Path:
    """The digest store of one algorithm: ``cache_dir() / f"{algo}.json"``."""
    return cache_dir() / f"{algo}.json"


def _load_cache(algo: str) -> dict[str, str]:
    """The intact entries of a digest store: sealed, hex of the algorithm's length."""
    n = HEX_LENGTH[algo]
    found = {k: unseal(k, v) for k, v in load_store(cache_path(algo)).items()}
    return {k: v for k, v in found.items() if isinstance(v, str) and len(v) == n and _hex(v)}


def _hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


def _save_cache(algo: str, entries: dict[str, str]) -> None:
    """Add ``entries`` to the store as it is now (another merge may have added its own); best effort."""
    merged = list((_load_cache(algo) | entries).items())[-CACHE_ENTRIES:]
    save_store(cache_path(algo), {k: seal(k, v) for k, v in merged})
