"""agentmerge's cache folder: small JSON stores keyed by the identity of input files.

A file's identity is its real path, size, modification time, change time and inode: a file rewritten in
place gets a new one (even with its mtime restored: the kernel sets ctime on every write), so nothing stale
is ever used for it. Stores are best effort: a missing, unreadable or broken
store reads as empty, and a read-only home or a full disk never fails the work that wanted to cache.

Every entry is stored sealed: ``{"value": V, "check": C}`` with ``C`` the blake2b-128 of the canonical JSON of
its key and ``V`` (``seal``). An entry whose check does not match (edited, truncated, NaN written in by
hand, an older format) reads as missing (``unseal``), so it is recomputed and replaced, never used; the
readers check the shape and range of what they get on top (``stream.OverlapCache``, ``masks.levels_from_json``).
A store that is not a regular file of at most ``MAX_STORE_BYTES``, not JSON or nested too deeply reads as
empty.

- ``sha256.json``, ``xxh3_128.json``: digests of input weight files (``digests.InputDigests``).
- ``stats/<key>.json``: overlap histograms of one input set, per tensor and threshold
  (``engine.counting.overlap_stats``), so that RAM+ merges and probes of the same files (a sweep of r, say)
  count them once.
- ``levels/<key>.json``: adaptive mask thresholds of one input set, per tensor and rule
  (``engine.counting.mask_levels``), so that a sweep of RAM trials with ``epsilon_rule`` percentile / valley
  computes them once.

``<key>`` is ``files_key`` of the input set (``InputSetStore``): the identities of every file whose bytes
decide the values, in order (a LoRA adapter's ``adapter_config.json`` among them: ``LoraModel.weight_files``).

``$AGENTMERGE_CACHE`` moves the folder (default ``$XDG_CACHE_HOME/agentmerge``, i.e. ``~/.cache/agentmerge``);
``AGENTMERGE_NO_CACHE=1`` turns the statistics caches (``stats``, ``levels``) off.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentmerge.errors import AgentMergeError
from agentmerge.io.guards import jsontext
from agentmerge.io.guards.bounded import read_bounded
from agentmerge.io.guards.strict_json import loads_strict

MAX_STORE_BYTES = 256 << 20


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
    """A JSON object store, or ``{}`` when it is missing, broken, too large, nested too deeply or not a file."""
    if not path.exists():
        return {}
    try:
        data = loads_strict(read_bounded(path, "cache store", MAX_STORE_BYTES), str(path))
    except AgentMergeError:
        return {}
    return data if isinstance(data, dict) else {}


def _check(key: str, value: Any) -> str:
    text = jsontext.dumps([key, value], sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def seal(key: str, value: Any) -> dict[str, Any]:
    """``value`` stored with the checksum of its key and itself."""
    return {"value": value, "check": _check(key, value)}


def unseal(key: str, entry: Any) -> Any | None:
    """The value of a sealed entry, or None when it is not one or its checksum does not match."""
    if not isinstance(entry, dict) or set(entry) != {"value", "check"} or entry["value"] is None:
        return None
    try:
        ok = entry["check"] == _check(key, entry["value"])
    except (TypeError, ValueError, RecursionError):
        return None
    return entry["value"] if ok else None


def save_store(path: Path, entries: dict[str, Any]) -> None:
    """Write ``entries`` atomically (a temporary sibling, then a rename); errors are ignored."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(jsontext.dumps(entries))
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
        """The stored entries of ``keys`` (those it has, intact; callers check their shape and range)."""
        if self.path is None:
            return {}
        store = load_store(self.path)
        found = {key: unseal(key, store.get(key)) for key in keys}
        return {key: value for key, value in found.items() if value is not None}

    def put(self, entries: Mapping[str, Any]) -> None:
        """Add ``entries`` (JSON values) to the store, sealed, best effort."""
        if self.path is None or not entries:
            return
        store = load_store(self.path)
        store.update({key: seal(key, value) for key, value in entries.items()})
        save_store(self.path, store)
