"""What each default merge of a seed kept of each agent, in weight space (``agentmerge probe --merged``).

For every benched method at its defaults the merge is made again from its test trial's own config and seed (so it
is the same bits the test scored), measured by ``agentmerge.engine.retention`` (kept = <Δ, τ_i> / <τ_i, τ_i>
per agent, over its updated elements and per overlap region) and deleted. One record per method in
``WORK/seedS/kept/``, tagged with the seed's fingerprint (a rerun with the same agents reads it).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from agentmerge.api import dumps_json
from agentmerge_zoo.real.bench import SeedInputs, sweep_of, trial_entry


def merge_again(
    inputs: SeedInputs, method: str, out: Path, threads: int, params: dict[str, Any] | None = None, name: str = ""
) -> Path:
    """The merge of ``method`` over every agent (at its defaults, or with ``params``), as its test trial ``name``
    (default: the method's name) made it, written to ``out``."""
    from agentmerge import merge
    from agentmerge.api import sweep_grid as grid
    from agentmerge.api import sweep_trials as trials
    from agentmerge.api import trial_merge_config as merge_config

    entry = trial_entry(name or method, method, params or {}, inputs, tuple(range(len(inputs.trained))))
    sweep = sweep_of(inputs, [entry], threads)
    (trial,) = trials(sweep, grid(sweep))
    merge(merge_config(sweep, trial), out, quiet=True)
    return out


def kept_of(inputs: SeedInputs, method: str, folder: Path, threads: int) -> dict[str, Any]:
    """``Retention.to_dict()`` of the method's default merge (from ``folder``'s record when it is this seed's)."""
    from agentmerge.api import retention

    record = folder / f"{method}.json"
    if record.is_file():
        data: dict[str, Any] = json.loads(record.read_text())
        if data.get("fingerprint") == inputs.fingerprint:
            cached: dict[str, Any] = data["kept"]
            return cached
    scratch = folder / f".{method}.merge"
    shutil.rmtree(scratch, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        merged = merge_again(inputs, method, scratch, threads)
        (kept,) = retention(
            str(inputs.base), inputs.models, [str(merged)], labels=list(inputs.trained), threads=threads, quiet=True
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result = kept.to_dict() | {"merged": method}
    tmp = record.with_name(f".{record.name}.tmp")
    tmp.write_text(dumps_json({"fingerprint": inputs.fingerprint, "kept": result}) + "\n")
    tmp.replace(record)
    return result
