"""Provenance of a merge: what it did (``MergeResult``), the sha256 of its inputs, and its merge.json record."""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import agentmerge
from agentmerge.cache import cache_dir, file_key, load_store, save_store
from agentmerge.checkpoint import Readable, is_hub_ref
from agentmerge.config import MergeConfig
from agentmerge.probe import AgentStats, agent_stats
from agentmerge.spec import ParamValue


@dataclass(frozen=True)
class MergeResult:
    """What a merge did: where it wrote, how long it took, and the overlap statistics it saw."""

    out_dir: Path
    method: str
    params: dict[str, ParamValue]
    seconds: float
    tensors: int
    merged_tensors: int
    model_hist: list[list[int]] | None = None  # [N][N] overlap histogram over merged tensors
    model_labels: list[str] = field(default_factory=list)
    numel: int = 0
    scales: list[dict[str, Any]] = field(default_factory=list)  # rho and lambda per rescaling group (group_scales)

    def to_dict(self) -> dict[str, Any]:
        return {
            "out_dir": str(self.out_dir),
            "method": self.method,
            "params": self.params,
            "seconds": round(self.seconds, 3),
            "tensors": self.tensors,
            "merged_tensors": self.merged_tensors,
            "model_hist": self.model_hist,
            "model_labels": self.model_labels,
            "numel": self.numel,
            "scales": self.scales,
        }

    def agents(self) -> list[AgentStats] | None:
        """Per-agent density, overlap and rho over the merged tensors (None when no statistics were kept)."""
        if self.model_hist is None:
            return None
        return agent_stats(torch.tensor(self.model_hist, dtype=torch.int64), self.numel, self.model_labels)


def reproducibility_record(
    cfg: MergeConfig, checkpoints: Sequence[Readable], result: MergeResult, hashes: InputHashes | None = None
) -> dict[str, Any]:
    """merge.json: the resolved configuration, tool versions, input files with sha256, statistics and timing."""
    sums = (hashes or InputHashes([f for c in checkpoints for f in c.weight_files])).result()
    files = {}
    for ckpt in checkpoints:
        files[input_ref(ckpt.ref)] = [
            {"file": f.name, "bytes": f.stat().st_size, "sha256": sums.get(str(f))} for f in ckpt.weight_files
        ]
    return {
        "agentmerge": agentmerge.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": recorded_config(cfg),
        "resolved_params": result.params,
        "inputs": files,
        "probe": [a.__dict__ | {"rho": a.rho if a.rho != float("inf") else "inf"} for a in result.agents() or []],
        "scales": result.scales,
        "seconds": round(result.seconds, 3),
    }


def input_ref(ref: str) -> str:
    """How merge.json and the model card name an input: its Hub id, else its absolute path (never cwd-relative)."""
    return ref if is_hub_ref(ref) else str(Path(ref).expanduser().resolve())


def recorded_config(cfg: MergeConfig) -> dict[str, Any]:
    """The resolved configuration with every input named by ``input_ref``."""
    data = cfg.model_dump(mode="json")
    for key in ("base", "tokenizer_source"):
        if data.get(key):
            data[key] = input_ref(data[key])
    for model in data["models"]:
        model["path"] = input_ref(model["path"])
        if model.get("fisher"):
            model["fisher"] = input_ref(model["fisher"])
    return data


def hub_ids(cfg: MergeConfig) -> list[str]:
    """The inputs (base first, then the models) that came from the Hugging Face Hub."""
    refs = ([cfg.base] if cfg.base else []) + [m.path for m in cfg.models]
    return list(dict.fromkeys(r for r in refs if is_hub_ref(r)))


def duplicate_inputs(cfg: MergeConfig, record: dict[str, Any]) -> list[str]:
    """Warnings for models given twice: the same folder (after resolving links), or the same weight files."""
    warnings = []
    seen: dict[str, str] = {}
    by_files: dict[tuple[str, ...], str] = {}
    if cfg.base:
        seen[input_ref(cfg.base)] = cfg.base
        by_files[_file_sums(record, input_ref(cfg.base))] = cfg.base
    for m in cfg.models:
        ref = input_ref(m.path)
        if cfg.base and seen.get(ref) == cfg.base:
            warnings.append(f"{m.path} is the base as well: its task vector is zero")
            continue
        if ref in seen:
            warnings.append(f"{m.path} is given twice as a model ({seen[ref]} and {m.path}): it counts as two agents")
            continue
        seen[ref] = m.path
        sums = _file_sums(record, ref)
        if sums and sums in by_files:
            what = "the base's weights" if by_files[sums] == cfg.base else f"the same weights as {by_files[sums]}"
            warnings.append(f"{m.path} holds {what} (same sha256)")
        by_files.setdefault(sums, m.path)
    return warnings


def _file_sums(record: dict[str, Any], ref: str) -> tuple[str, ...]:
    """The sha256 of an input's weight files as merge.json records them; () when unknown or not hashed."""
    sums = tuple(str(f.get("sha256")) for f in record.get("inputs", {}).get(ref, []))
    return sums if sums and "None" not in sums else ()


# --------------------------------------------------------------------------- input hashes

HASH_BLOCK = 8 * 1024 * 1024


class InputHashes:
    """sha256 of input weight files, computed on a background thread while the merge runs.

    hashlib releases the GIL on large blocks, so hashing overlaps the merge; reads hit the page cache the
    merge fills. Results are cached by (real path, size, mtime_ns, inode) in ``hash_cache_path()``, so
    repeated merges of the same inputs (parameter sweeps) hash nothing again; files in a Hugging Face cache
    are named by their sha256 already. ``AGENTMERGE_NO_HASH=1`` skips hashing (``sha256: null``).
    """

    def __init__(self, files: Sequence[Path], *, background: bool = False) -> None:
        self.files = [Path(f) for f in dict.fromkeys(str(f) for f in files)]
        self._sums: dict[str, str] = {}
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._run, name="agentmerge-hash", daemon=True)
            self._thread.start()

    @classmethod
    def start(cls, checkpoints: Sequence[Readable]) -> InputHashes:
        """Start hashing every weight file of ``checkpoints`` in the background."""
        return cls([f for c in checkpoints for f in c.weight_files], background=True)

    def cancel(self) -> None:
        """Stop before the next file (a failed merge should not keep reading its inputs)."""
        self._stop.set()

    def result(self) -> dict[str, str]:
        """``{str(path): hex digest}``; waits for the background thread (or hashes now)."""
        if self._thread is None:
            self._run()
        else:
            self._thread.join()
        if self._error is not None:
            raise self._error
        return dict(self._sums)

    def _run(self) -> None:
        if self._thread is not None:
            with contextlib.suppress(OSError, AttributeError):  # Linux: lower this thread's priority only
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        try:
            cache = _load_hash_cache()
            fresh = {}
            skip = os.environ.get("AGENTMERGE_NO_HASH") == "1"
            for f in self.files:
                if skip or self._stop.is_set():
                    continue
                key = file_key(f)
                digest = cache.get(key) or hub_blob_digest(f) or sha256_file(f)
                fresh[key] = digest
                self._sums[str(f)] = digest
            _save_hash_cache(cache | fresh)
        except BaseException as e:  # re-raised in result(), on the caller's thread
            self._error = e


def hub_blob_digest(path: Path) -> str | None:
    """The sha256 a Hugging Face cache already names the file by (``blobs/<sha256>``, LFS files), else None."""
    real = path.resolve()
    name = real.name
    if real.parent.name == "blobs" and len(name) == 64 and all(c in "0123456789abcdef" for c in name):
        return name
    return None


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in ``HASH_BLOCK`` pieces (bounded memory)."""
    h = hashlib.sha256()
    buf = bytearray(HASH_BLOCK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def hash_cache_path() -> Path:
    """The digest store: ``cache_dir() / sha256.json``."""
    return cache_dir() / "sha256.json"


def _load_hash_cache() -> dict[str, str]:
    data = load_store(hash_cache_path())
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str) and len(v) == 64}


def _save_hash_cache(entries: dict[str, str]) -> None:
    """Best effort: a read-only home or a full disk must not fail the merge."""
    save_store(hash_cache_path(), dict(list(entries.items())[-10_000:]))
