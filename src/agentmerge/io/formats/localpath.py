"""Telling a mistyped local path from a hub id, and suggesting the folder that was probably meant.

``mdoels/agent0`` has the shape of a hub id (``owner/name``), but when ``models/agent0`` exists here it is
a typo of a local path, and fetching it from the hub would fail later with a confusing message (or,
worse, download someone else's model). A reference looks local when it starts with ``.``, ``/`` or ``~``,
has more than one separator, or its first part (or a close spelling of it) is a folder here. A local
folder with ``adapter_config.json`` is a PEFT LoRA adapter (``is_adapter``).
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from agentmerge.io.formats.hubref import split_revision
from agentmerge.io.guards.bounded import check_reference

ADAPTER_CONFIG = "adapter_config.json"  # what makes a folder a PEFT adapter (read by lora.py)


def _close(word: str, options: list[str]) -> str | None:
    found = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return found[0] if found else None


def _subfolders(folder: Path) -> list[str]:
    try:
        return sorted(p.name for p in folder.iterdir() if p.is_dir())
    except OSError:
        return []


def suggest_local(ref: str) -> str | None:
    """The closest existing path to a missing ``ref``, walking it part by part (None when nothing is close)."""
    path = Path(ref).expanduser()
    parts = path.parts
    if not parts:
        return None
    current = Path(parts[0]) if path.is_absolute() else Path(".")
    rest = parts[1:] if path.is_absolute() else parts
    for part in rest:
        candidate = current / part
        if not candidate.exists():
            options = _subfolders(current) if part != rest[-1] else _entries(current)
            match = _close(part, options)
            if match is None:
                return None
            candidate = current / match
        current = candidate
    return str(current) if current.exists() else None


def _entries(folder: Path) -> list[str]:
    try:
        return sorted(p.name for p in folder.iterdir())
    except OSError:
        return []


def looks_local(ref: str) -> bool:
    """Whether a reference that does not exist is meant as a local path rather than a hub id."""
    text = str(ref)
    if text.startswith((".", "/", "~")) or (os.sep != "/" and os.sep in text):
        return True
    parts = [p for p in text.split("/") if p]
    if len(parts) != 2:
        return len(parts) > 2
    first = parts[0]
    if Path(first).is_dir():
        return True
    close = _close(first, _subfolders(Path(".")))
    return close is not None and (Path(close) / parts[1]).exists()


def missing_local_message(ref: str) -> str:
    """One line for a local-looking path that does not exist, with a suggestion when one is close."""
    hint = suggest_local(ref)
    tail = f" (did you mean {hint!r}?)" if hint and hint != ref else ""
    return f"{ref}: no such file or folder{tail}"


def is_adapter(ref: str | Path) -> bool:
    """Whether ``ref`` is a local PEFT adapter folder (anything named adapter_config.json counts, so that the
    adapter reader names what is wrong with a FIFO or device there)."""
    try:
        path = Path(ref).expanduser()
        return path.is_dir() and (path / ADAPTER_CONFIG).exists()
    except (OSError, ValueError):  # a name too long for the file system, or holding a NUL: no folder
        return False


def is_missing_local(ref: str) -> bool:
    """Whether ``ref`` names no existing file and is not a Hub id either (``org/name[@revision]``): a bad path."""
    if Path(ref).expanduser().exists():
        return False
    hub = split_revision(ref)
    return hub is None or looks_local(hub.repo_id)


def missing_local_inputs(refs: list[str]) -> list[str]:
    """One message per reference meant as a local path that does not exist (``MODEL+ADAPTER`` checked by part).

    ``checkpoint.resolve_model_path``'s test (``is_missing_local``) without importing torch, so that a mistyped
    path is reported in a fraction of a second instead of after the engine has loaded.
    """
    out = []
    for ref in refs:
        check_reference(ref)
        parts = [ref] if Path(ref).expanduser().exists() or "+" not in ref else ref.rsplit("+", 1)
        out += [missing_local_message(part) for part in parts if is_missing_local(part)]
    return out
