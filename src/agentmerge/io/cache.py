"""agentmerge's cache folder: small JSON stores keyed by the identity of input files.

A file's identity is its real path, size, modification time, change time and inode: a file rewritten in
place gets a new one (even with its mtime restored: the kernel sets ctime on every write), so nothing stale
is ever used for it. Stores are best effort: a missing, unreadable or broken
store reads as empty, and a read-only home or a full disk never fails the work that wanted to cache.

- ``sha256.json``, ``xxh3_128.json``: digests of input weight files (``digests.InputDigests``).
- ``stats/<key>.json``: overlap histograms of one input set, per tensor and threshold
  (``engine.counting.overlap_stats``), so that RAM+ merges and probes of the same files (a sweep of r, say)
  count them once.
- ``levels/<key>.json``: adaptive mask thresholds of one input set, per tensor and rule
  (``engine.counting.mask_levels``), so that a sweep of RAM trials with ``epsilon_rule`` percentile / valley
  computes them once.

``<key>`` is ``files_key`` of the input set (``InputSetStore``).

``$AGENTMERGE_CACHE`` moves the folder (default ``$XDG_CACHE_HOME/agentmerge``, i.e. ``~/.cache/agentmerge``);
``AGENTMERGE_NO_CACHE=1`` turns the statistics caches (``stats``, ``levels``) off.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any


def cache_dir() -> Path:
    """``$AGENTMERGE_CACHE``, else ``$XDG_CACHE_HOME/agentmerge`` (default ``~/.cache/agentmerge``)."""
    root = os.environ.get("AGENTMERGE_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "agentmerge"


def file_key(path: Path) -> str:
    """The identity of a file: ``real path|size|mtime_ns|ctime_ns|inode``."""
    st = path.stat()
    return f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}|{st.st_ino}"


def files_key(groups: Sequence[Sequence[Path]]) -> str:
    """One short key for an ordered list of checkpoints, each an ordered list of files (identities hashed)."""
    joined = "\n".join(f"{i}|{file_key(p)}" for i, group in enumerate(groups) for p in group)
    return hashlib.blake2b(joined.encode(), digest_size=16).hexdigest()


def load_store(path: Path) -> dict[str, Any]:
    """A JSON object store, or ``{}`` when it is missing or broken."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save_store(path: Path, entries: dict[str, Any]) -> None:
    """Write ``entries`` atomically (a temporary sibling, then a rename); errors are ignored."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(json.dumps(entries))
        os.replace(tmp, path)
    except OSError:
        pass


class InputSetStore:
    """One JSON store per input set (checkpoints in order, each its files) under ``cache_dir() / kind``.

    Entries are keyed by text (a tensor name and a rule, say); a changed file gives the set a new key, so
    nothing stale is read. ``AGENTMERGE_NO_CACHE=1`` turns it off: ``get`` finds nothing, ``put`` keeps nothing.
    """

    def __init__(self, kind: str, files: Sequence[Sequence[Path]]) -> None:
        on = os.environ.get("AGENTMERGE_NO_CACHE") != "1"
        self.path = cache_dir() / kind / f"{files_key(files)}.json" if on else None

    def get(self, keys: Iterable[str]) -> dict[str, Any]:
        """The stored entries of ``keys`` (those it has; callers check their shape)."""
        if self.path is None:
            return {}
        store = load_store(self.path)
        return {key: store[key] for key in keys if key in store}

    def put(self, entries: Mapping[str, Any]) -> None:
        """Add ``entries`` (JSON values) to the store, best effort."""
        if self.path is None or not entries:
            return
        store = load_store(self.path)
        store.update(entries)
        save_store(self.path, store)
