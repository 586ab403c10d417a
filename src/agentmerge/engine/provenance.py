"""Provenance of a merge: what it did (``MergeResult``), its inputs' digests (``digests``), its merge.json record."""

from __future__ import annotations

import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agentmerge._version import __version__
from agentmerge.config.schema import MergeConfig
from agentmerge.engine.probe import AgentStats, agent_stats
from agentmerge.io.cache.digests import ALGORITHMS, InputDigests, hash_mode
from agentmerge.io.formats.checkpoint import Readable
from agentmerge.io.formats.hubref import hub_repo_id, is_hub_ref, parse_hub_ref, snapshot_commit
from agentmerge.io.guards import jsontext
from agentmerge.methods.spec import ParamValue


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
    scales: list[dict[str, Any]] = field(
        default_factory=list
    )  # rho and lambda per rescaling group (the method's Scales hook)
    vocab: dict[str, Any] | None = None  # added vocabulary rows (vocab.VocabPlan.record), None when none
    sources: dict[str, Any] | None = None  # tokenizer / generation config source and checks (sources.py)
    thresholds: dict[str, Any] | None = None  # adaptive mask rules only (masks.levels_record), else None
    lines: dict[str, Any] | None = None  # LiNeS depth scaling: its layer count and alpha (lines_pass), else None
    warnings: list[str] = field(default_factory=list)  # what the kernels warned about (e.g. Iso-C on a low-rank sum)
    notes: list[str] = field(default_factory=list)  # e.g. the quantization note (quantnote) for GGUF inputs

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
            "vocab": self.vocab,
            "sources": self.sources,
            **({"thresholds": self.thresholds} if self.thresholds else {}),
            **({"lines": self.lines} if self.lines else {}),
            **({"warnings": self.warnings} if self.warnings else {}),
            **({"notes": self.notes} if self.notes else {}),
        }

    def agents(self) -> list[AgentStats] | None:
        """Per-agent density, overlap and rho over the merged tensors (None when no statistics were kept)."""
        if self.model_hist is None:
            return None
        return agent_stats(torch.tensor(self.model_hist, dtype=torch.int64), self.numel, self.model_labels)


def reproducibility_record(
    cfg: MergeConfig, checkpoints: Sequence[Readable], result: MergeResult, digests: InputDigests | None = None
) -> dict[str, Any]:
    """merge.json: the resolved configuration, tool versions, input files with digests, statistics and timing.

    Each input file is ``{"file", "bytes", "sha256": hex or null}``, plus ``"xxh3_128": hex`` where that is
    the digest taken (``digests``, mode ``fast``); ``hashing`` names the mode, ``hash_errors`` (only when
    there are some) the files left without a digest and why.
    """
    digests = digests or InputDigests([f for c in checkpoints for f in c.weight_files], hash_mode())
    sums = digests.result()
    files = {}
    for ckpt in checkpoints:
        files[input_ref(ckpt.ref)] = [
            {"file": f.name, "bytes": f.stat().st_size, **sums[str(f)].fields()} for f in ckpt.weight_files
        ]
    return {
        "agentmerge": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": recorded_config(cfg),
        "resolved_params": result.params,
        "inputs": files,
        "hashing": digests.mode,
        **({"hash_errors": list(digests.errors)} if digests.errors else {}),
        "hub": hub_commits(checkpoints),
        "probe": [a.__dict__ | {"rho": a.rho if a.rho != float("inf") else "inf"} for a in result.agents() or []],
        "scales": result.scales,
        "vocab": result.vocab,
        "sources": result.sources,
        **({"thresholds": result.thresholds} if result.thresholds else {}),
        **({"lines": result.lines} if result.lines else {}),
        **({"warnings": result.warnings} if result.warnings else {}),
        **({"notes": result.notes} if result.notes else {}),
        "seconds": round(result.seconds, 3),
    }


ONE_LINE_ROWS = ("tensors", "fallback")  # merge.json's thresholds entries written one tensor per line


def record_text(record: dict[str, Any]) -> str:
    """merge.json's text: ``jsontext.dumps(record, indent=2)``, except that the per-tensor lists of the adaptive
    thresholds (``thresholds.tensors`` and ``.fallback``, a few hundred short lists) take one line per tensor."""
    thresholds = record.get("thresholds")
    if not thresholds:
        return jsontext.dumps(record, indent=2) + "\n"
    holes = {key: f"\x00{key}\x00" for key in ONE_LINE_ROWS}  # strings no record holds (JSON escapes them)
    text = jsontext.dumps({**record, "thresholds": {**thresholds, **holes}}, indent=2)
    for key, hole in holes.items():
        rows = ",\n".join(f"      {jsontext.dumps(name)}: {jsontext.dumps(v)}" for name, v in thresholds[key].items())
        text = text.replace(jsontext.dumps(hole), "{\n" + rows + "\n    }" if rows else "{}", 1)
    return text + "\n"


def input_ref(ref: str) -> str:
    """How merge.json and the model card name an input: its Hub id, else its absolute path (never cwd-relative)."""
    return ref if is_hub_ref(ref) else str(Path(ref).expanduser().resolve())


def hub_commits(checkpoints: Sequence[Readable]) -> dict[str, dict[str, str | None]]:
    """Each input fetched from the Hub: its repository id, the revision asked for and the commit it resolved to."""
    out: dict[str, dict[str, str | None]] = {}
    for ckpt in checkpoints:
        hub = parse_hub_ref(ckpt.ref)
        if hub is not None:
            out[ckpt.ref] = {"repo_id": hub.repo_id, "revision": hub.revision, "commit": snapshot_commit(ckpt.folder)}
    return out


def recorded_config(cfg: MergeConfig, *, recipe: bool = False) -> dict[str, Any]:
    """The resolved configuration with every input named by ``input_ref``.

    ``recipe``: only what differs from the defaults, the native YAML a user would write to merge again.
    """
    data = cfg.model_dump(mode="json", exclude_defaults=recipe)
    for key in ("base", "tokenizer_source"):
        if data.get(key) and not (key == "tokenizer_source" and cfg.tokenizer_ref != cfg.tokenizer_source):
            data[key] = input_ref(data[key])  # a path; ``base`` and an agent's index stay as written
    for model in data["models"]:
        model["path"] = input_ref(model["path"])
        if model.get("fisher"):
            model["fisher"] = input_ref(model["fisher"])
    return data


def hub_ids(cfg: MergeConfig) -> list[str]:
    """The repository ids (without revision) of the inputs, base first, then the models, that come from the Hub."""
    refs = ([cfg.base] if cfg.base else []) + [m.path for m in cfg.models]
    return list(dict.fromkeys(i for i in map(hub_repo_id, refs) if i is not None))


def input_warnings(cfg: MergeConfig, record: dict[str, Any]) -> list[str]:
    """What the user should hear about the inputs: models given twice (``duplicate_inputs``), files not hashed."""
    return duplicate_inputs(cfg, record) + [f"no digest in merge.json for {e}" for e in record.get("hash_errors", [])]


def duplicate_inputs(cfg: MergeConfig, record: dict[str, Any]) -> list[str]:
    """Warnings for models given twice: the same folder (after resolving links), or the same weight files.

    Two inputs hold the same weights when every file's digest agrees, compared on a digest both have
    (sha256 first, else xxh3_128); the warning says which.
    """
    warnings = []
    seen: dict[str, str] = {}
    by_files: dict[tuple[str, tuple[str, ...]], str] = {}
    if cfg.base:
        seen[input_ref(cfg.base)] = cfg.base
        by_files |= dict.fromkeys(_file_sums(record, input_ref(cfg.base)), cfg.base)
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
        same = next((key for key in sums if key in by_files), None)
        if same is not None:
            what = "the base's weights" if by_files[same] == cfg.base else f"the same weights as {by_files[same]}"
            warnings.append(f"{m.path} holds {what} (same {same[0]})")
        for key in sums:
            by_files.setdefault(key, m.path)
    return warnings


def _file_sums(record: dict[str, Any], ref: str) -> list[tuple[str, tuple[str, ...]]]:
    """``(algorithm, digest of each weight file)`` for each algorithm every file of an input was hashed with."""
    entries = record.get("inputs", {}).get(ref, [])
    out = []
    for algo in ALGORITHMS:
        sums = tuple(e.get(algo) for e in entries)
        if sums and all(isinstance(x, str) for x in sums):
            out.append((algo, tuple(str(x) for x in sums)))
    return out
