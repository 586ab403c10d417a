"""Model references in a mergekit config, and its ``models`` list, in agentmerge's spelling.

``org/name@rev`` and mergekit's ``{path, revision}`` become our ``org/name@rev``, ``{model, lora}`` our
``MODEL+ADAPTER``; a local folder wins over a hub id of the same spelling. A revision on a local path,
``override_architecture`` and unknown keys are refused with a ``ConfigError`` naming the entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentmerge.errors import ConfigError
from agentmerge.io.formats.hubref import split_revision


def param_mapping(value: object, where: str) -> dict[str, Any]:
    """A ``parameters`` block as ``{name: value}`` (none given: empty)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected a mapping of parameter names to values")
    return {str(k): v for k, v in value.items()}


def model_ref(ref: object, where: str) -> str:
    """A mergekit model reference -> a path, a hub id (``org/name@rev`` with a revision), or ``MODEL+ADAPTER``."""
    if isinstance(ref, Mapping) and "path" in ref:
        return _path_of(ref, where)  # {path, revision}: mergekit's ModelPath, written where a model goes
    if isinstance(ref, Mapping):
        extra = set(ref) - {"model", "lora", "override_architecture"}
        if extra or ref.get("override_architecture"):
            raise ConfigError(f"{where}: only model and lora are supported (no override_architecture)")
        model = (
            model_ref(ref.get("model"), where)
            if not isinstance(ref.get("model"), Mapping)
            else _path_of(ref["model"], where)
        )
        lora = ref.get("lora")
        if lora is None:
            return model
        return f"{model}+{_path_of(lora, where) if isinstance(lora, Mapping) else model_ref(lora, where)}"
    if not isinstance(ref, str) or not ref:
        raise ConfigError(f"{where}: expected a model path or hub id (got {ref!r})")
    if Path(ref).expanduser().exists():
        return ref  # a local folder wins, '@' in its name or not
    if ref.count("@") > 1 or any("@" in part and split_revision(part) is None for part in ref.split("+")):
        raise ConfigError(f"{where}: {ref!r}: '@revision' is read after a hub id (org/name@rev) only, once per model")
    return ref  # a hub id (with its revision), or MODEL+ADAPTER (checked when the inputs are opened)


def _path_of(entry: Mapping[str, Any], where: str) -> str:
    """mergekit's ``{path: ..., revision: ...}`` form -> ``path`` or ``org/name@revision``."""
    extra = set(entry) - {"path", "revision"}
    if extra:
        raise ConfigError(f"{where}: unknown key {sorted(map(str, extra))[0]!r} (expected path, revision)")
    path, rev = entry.get("path"), entry.get("revision")
    if rev is None:
        return model_ref(path, where)
    if not isinstance(path, str) or not isinstance(rev, str) or not rev:
        raise ConfigError(f"{where}: expected {{path: ORG/NAME, revision: REV}} (got {dict(entry)!r})")
    if Path(path).expanduser().exists():
        raise ConfigError(f"{where}: revision {rev!r} given for the local path {path!r}; remove it or name a hub id")
    ref = f"{path}@{rev}"
    if split_revision(ref) is None:
        raise ConfigError(
            f"{where}: {ref!r} is not a hub id with a revision (expected org/name and a branch, tag or commit)"
        )
    return ref


def model_list(raw: object, base: str | None, source: str, notes: list[str]) -> list[tuple[str, dict[str, Any]]]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{source}: 'models' must be a non-empty list of {{model: PATH, parameters: {{...}}}}")
    out = []
    for i, entry in enumerate(raw):
        where = f"{source}: models[{i}]"
        if not isinstance(entry, Mapping) or "model" not in entry:
            raise ConfigError(f"{where}: expected a mapping with a 'model' key")
        extra = set(entry) - {"model", "parameters"}
        if extra:
            raise ConfigError(f"{where}: unknown key {sorted(map(str, extra))[0]!r} (expected model, parameters)")
        path = model_ref(entry["model"], f"{where}.model")
        params = param_mapping(entry.get("parameters"), f"{where}.parameters")
        if base is not None and _same_model(path, base):
            notes.append(f"models[{i}] is the base model; it serves as the base only, as in mergekit")
            continue
        out.append((path, params))
    if not out:
        raise ConfigError(f"{source}: no models to merge besides the base model")
    return out


def join_base(
    models: list[tuple[str, dict[str, Any]]], base: str, method: str, notes: list[str]
) -> list[tuple[str, dict[str, Any]]]:
    """mergekit's planner adds a base_model that the models do not list as one more input model (karcher)."""
    if any(_same_model(path, base) for path, _ in models):
        return models
    notes.append(f"base_model joins {method!r} as one more model (the last), as mergekit's planner adds it")
    return [*models, (base, {})]


def _same_model(a: str, b: str) -> bool:
    """The same reference, or two spellings of one local folder."""
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    return a == b or (pa.exists() and pb.exists() and pa.resolve() == pb.resolve())


def endpoints(
    models: list[tuple[str, dict[str, Any]]], base: str | None, source: str
) -> list[tuple[str, dict[str, Any]]]:
    """SLERP: mergekit's base is the t = 0 end, the one other model the t = 1 end."""
    if base is None or len(models) != 1:
        raise ConfigError(f"{source}: slerp takes a base_model and exactly one other model")
    return [(base, {}), models[0]]
