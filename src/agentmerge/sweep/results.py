"""``DIR/results.jsonl`` read back field by field, and the only folders a sweep ever removes.

A resumed sweep trusts nothing it reads back: each record must have the fields ``run_trial`` writes, of the types it
writes them: ``trial`` a 16-digit hex id (``sweepfile.trial_of``), ``name`` (when present) a trial name by the rule of
the sweep file (``sweepfile.TRIAL_NAME``), ``method`` a string, ``params`` a mapping of names to plain values,
``models`` a list of strings, ``seed`` a whole number, ``status`` ``ok`` or ``failed``, ``error`` a string,
``metrics`` a mapping of names to finite numbers, ``seconds`` and ``merge_seconds`` finite numbers >= 0, ``kept``
(when present) a list of finite numbers or nulls, ``point`` and ``stderr`` (a search's, when present) mappings of
names to finite numbers; a search with ``early_stop``: ``items`` and ``items_total`` whole numbers >= 0,
``stopped_early`` true and ``best_at_start`` a finite number (a stopped trial's). A record that breaks any of these
stops the sweep with one line naming the file, the line and the field (fix or remove that line, or start over with
``--no-resume``). A line that is not JSON at all is a write torn by a kill and is skipped (the trial runs again); the
next record then starts on a line of its own. The file must be a regular file of at most ``MAX_RESULTS_BYTES``.

A sweep removes a folder only when it is ``DIR/trials/<name>`` itself (not a link, not elsewhere) and
holds ``merge.json``: a merge output it wrote, never a folder a user put there.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentmerge.errors import ConfigError
from agentmerge.io.guards import jsontext
from agentmerge.io.guards.bounded import text_lines
from agentmerge.io.guards.strict_json import MAX_JSON_DEPTH, json_depth
from agentmerge.sweep.sweepfile import TRIAL_ID, TRIAL_NAME

MAX_RESULTS_BYTES = 1 << 30
MAX_LINE_CHARS = 16 << 20


def _text(v: object) -> bool:
    return isinstance(v, str) and len(v) <= 100_000


def _number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _plain(v: object) -> bool:
    return v is None or isinstance(v, str | bool) or _number(v)


def _matches(pattern: Any) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, str) and bool(pattern.fullmatch(v))


def _mapping_of(test: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, dict) and all(test(x) for x in v.values())


FIELDS: dict[str, tuple[bool, str, Callable[[Any], bool]]] = {  # field: (required, what it must be, test)
    "trial": (True, "a 16-digit hex trial id", _matches(TRIAL_ID)),
    "name": (False, "a trial name (letters, digits, . _ + -)", _matches(TRIAL_NAME)),
    "method": (True, "a method name", lambda v: isinstance(v, str) and 0 < len(v) <= 200),
    "params": (True, "a mapping of parameter names to plain values", _mapping_of(_plain)),
    "models": (True, "a list of model paths", lambda v: isinstance(v, list) and all(_text(m) for m in v)),
    "seed": (True, "a whole number", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "status": (True, "ok or failed", lambda v: v in ("ok", "failed")),
    "error": (False, "a string", _text),
    "metrics": (True, "a mapping of metric names to finite numbers", _mapping_of(_number)),
    "seconds": (False, "a number >= 0", lambda v: _number(v) and v >= 0),
    "merge_seconds": (False, "a number >= 0", lambda v: _number(v) and v >= 0),
    "kept": (False, "a list of numbers or nulls", lambda v: isinstance(v, list) and all(_kept(x) for x in v)),
    "stderr": (False, "a mapping of metric names to finite numbers", _mapping_of(_number)),
    "point": (False, "a mapping of coordinate names to finite numbers", _mapping_of(_number)),
    "items": (False, "a whole number >= 0", lambda v: _count(v)),
    "items_total": (False, "a whole number >= 0", lambda v: _count(v)),
    "stopped_early": (False, "true", lambda v: v is True),
    "best_at_start": (False, "a finite number", _number),
}


def _count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _kept(v: object) -> bool:
    return v is None or _number(v)


def check_record(where: str, rec: object) -> dict[str, Any]:
    """``rec`` as a valid record, or a ``ConfigError`` naming ``where`` and the first bad field."""
    if not isinstance(rec, dict):
        raise ConfigError(f"{where}: a record must be a JSON object; {_fix()}")
    for field, (required, what, ok) in FIELDS.items():
        if field not in rec:
            if required:
                raise ConfigError(f"{where}: field {field!r} is missing; {_fix()}")
            continue
        if not ok(rec[field]):
            shown = jsontext.dumps(rec[field])[:60]
            raise ConfigError(f"{where}: field {field!r} must be {what} (got {shown}); {_fix()}")
    return rec


def _fix() -> str:
    return "fix or remove that line, or start over with --no-resume"


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every record of ``results.jsonl``, checked (``check_record``); torn lines skipped."""
    if not path.exists() and not path.is_symlink():
        return []
    out = []
    for n, line in enumerate(text_lines(path, "results file", MAX_RESULTS_BYTES, MAX_LINE_CHARS, ConfigError), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:  # a write torn by a kill: that trial runs again
            continue
        except RecursionError:
            rec = None
        where = f"{path}:{n}"
        if rec is None or json_depth(rec) > MAX_JSON_DEPTH:
            raise ConfigError(f"{where}: JSON nested more than {MAX_JSON_DEPTH} levels deep; {_fix()}")
        out.append(check_record(where, rec))
    return out


def append_record(path: Path, record: dict[str, Any]) -> None:
    """Append one record as a whole line, synced; after a torn last line, on a line of its own."""
    line = jsontext.dumps(record, sort_keys=True) + "\n"
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = "\n" + line
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_trial_folder(folder: Path) -> None:
    """Remove a trial's merged folder, only when it is one: ``.../trials/NAME`` holding ``merge.json``, no link."""
    if folder.parent.name != "trials" or folder.is_symlink() or not folder.is_dir():
        return
    if (folder / "merge.json").is_file():
        shutil.rmtree(folder, ignore_errors=True)


def check_out_folder(root: Path) -> None:
    """``--out`` must be a folder or not exist yet."""
    if root.exists() and not root.is_dir():
        raise ConfigError(f"{root}: --out is not a folder (a file is there); name a folder for the sweep's results")
