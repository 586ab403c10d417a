"""Write a native agentmerge config as a mergekit YAML: the reverse of ``mergekit_compat.from_mergekit``.

Only what both tools compute the same way is written (``mergekit_names.MERGEKIT`` names the shared methods);
the rest is refused by name (``ConfigError``), never dropped: methods mergekit has no counterpart of
(``unique_only``, ``fisher``, ``ram_ties``; ``ram_plus`` other than mergekit's tensor-local paper form),
our own parameters away from the value mergekit computes (``MethodMap.ours_only``, ``fixed``), tensor
patterns that are not a plain substring, ``include`` / ``exclude``. Settings that only change how the merge
runs (threads, memory, the seed of the random drops) are left out with a note.

Parameters are written with their resolved values, so mergekit's own defaults never apply. Where our
value is an affine image of mergekit's (``MethodMap.convert``: ``ours = a + b * theirs``), mergekit's is
``theirs = (ours - a) / b``: DARE's and DELLA's kept fraction ``density = 1 - p``, DELLA's half-width
``epsilon = eps / 2``. Our overrides (the last match wins) become mergekit's filtered values (the first
match wins), so they are written in reverse order, with the tensor-wide value last:

    parameters: {density: [{filter: mlp, value: 0.5}, {value: 0.2}]}   # overrides: [{pattern: "*mlp*", ...}]

The round trip ``from_mergekit(to_mergekit(cfg))`` gives back the same resolved parameters for every tensor
and model (``tests/test_mergekit_export.py`` checks each shared method).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from agentmerge.config.mergekit import Converted
from agentmerge.config.mergekit_names import MERGEKIT, MethodMap, Scalar
from agentmerge.config.schema import MergeConfig, ModelSpec
from agentmerge.errors import ConfigError
from agentmerge.io.formats.localpath import is_adapter
from agentmerge.io.guards.units import FLOAT_DTYPE_NAMES
from agentmerge.methods import METHODS, POST_STEP_NAMES

MERGEKIT_DTYPES = ("bfloat16", "float16", "float32")
_GLOB = set("*?[]")


def to_mergekit(cfg: MergeConfig, source: str = "config") -> Converted:
    """Translate a validated native config into mergekit's (``ConfigError`` naming what mergekit cannot express)."""
    name, mmap = mergekit_method(cfg.method, source)
    _check_expressible(cfg, name, mmap, source)
    notes: list[str] = []
    out: dict[str, Any] = {"merge_method": name}
    models = list(cfg.models)
    if mmap.endpoints:
        if cfg.base is not None and cfg.base != models[0].path:
            raise ConfigError(f"{source}: slerp's base must be its first model for mergekit (its t = 0 end)")
        out["base_model"], models = _reference(models[0].path, cfg.base, notes), models[1:]
    elif cfg.base is not None and mmap.uses_base:
        out["base_model"] = cfg.base
    elif cfg.base is not None and mmap.base_joins:
        notes.append(f"base {cfg.base} left out: mergekit's {name} would average base_model in as one more model")
    elif cfg.base is not None:
        notes.append(f"base {cfg.base} left out: mergekit's {name} does not use base_model")
    per_model = sorted({k for m in models for k in m.params})
    out["models"] = [_model_entry(m, per_model, cfg, mmap, notes) for m in models]
    params = _top_parameters(cfg, per_model, mmap)
    if mmap.ours_normalize is not None and mmap.normalize != mmap.ours_normalize:
        params["normalize"] = mmap.ours_normalize  # what agentmerge computes, where mergekit's default differs
    if params:
        out["parameters"] = params
    out.update(_dtype(cfg.dtype, source, notes))
    if cfg.tokenizer_source is not None:  # mergekit knows ``base``; an agent's index becomes its path
        out["tokenizer_source"] = "base" if cfg.tokenizer_source == "base" else cfg.tokenizer_ref
    notes += _left_out(cfg)
    return Converted(out, notes)


def mergekit_method(method: str, source: str) -> tuple[str, MethodMap]:
    """mergekit's name of our ``method`` and its mapping; ``ConfigError`` when mergekit has no counterpart."""
    for name, mmap in MERGEKIT.items():
        if mmap.target == method:
            return name, mmap
    shared = sorted({m.target for m in MERGEKIT.values() if m.target in METHODS})
    raise ConfigError(
        f"{source}: method {method!r} cannot be written for mergekit: mergekit has no counterpart of it "
        f"(methods both tools have: {', '.join(shared)}); merge it with agentmerge"
    )


# --------------------------------------------------------------------------- what mergekit cannot express


def _places(cfg: MergeConfig) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every set of parameter values the config holds: the resolved ones, each override's, each model's."""
    yield "params", cfg.shared_params
    for i, o in enumerate(cfg.overrides):
        yield f"overrides[{i}].params", o.params
    for i, m in enumerate(cfg.models):
        yield f"models[{i}].params", m.params


def _check_expressible(cfg: MergeConfig, name: str, mmap: MethodMap, source: str) -> None:
    ours = (*mmap.ours_only, *POST_STEP_NAMES)
    required = dict(mmap.fixed) | {p.name: p.default for p in cfg.spec.params if p.name in ours}
    for where, values in _places(cfg):
        for key, want in required.items():
            if key in values and values[key] != want:
                why = "fixes" if key in mmap.fixed else "has no such parameter; it computes"
                raise ConfigError(
                    f"{source}: {where}: {key} = {values[key]!r} cannot be written for mergekit: its {name} "
                    f"{why} {key} = {want!r}"
                )
    for key in ("include", "exclude"):
        if getattr(cfg, key):
            raise ConfigError(f"{source}: {key!r} cannot be written for mergekit (it merges every tensor); remove it")
    for i, o in enumerate(cfg.overrides):
        if o.weights is not None:
            raise ConfigError(
                f"{source}: overrides[{i}].weights (per-model weights of some tensors) are not written for "
                "mergekit yet; merge this config with agentmerge merge"
            )
        if _substring(o.pattern) is None:
            raise ConfigError(
                f"{source}: overrides[{i}].pattern {o.pattern!r} cannot be written for mergekit, whose filters "
                "are substrings of tensor names; write it as '*SUBSTRING*'"
            )
    both = {k for m in cfg.models for k in m.params} & {k for o in cfg.overrides for k in o.params}
    if both:
        raise ConfigError(
            f"{source}: {sorted(both)[0]!r} is set both per model and in overrides; mergekit reads a model's own "
            "value before any filter, so give it one way only"
        )


def _substring(pattern: str) -> str | None:
    """``*mlp*`` -> ``mlp`` (what mergekit's filter matches); None for any other glob."""
    inner = pattern[1:-1] if len(pattern) > 2 and pattern[0] == pattern[-1] == "*" else ""
    return inner if inner and not set(inner) & _GLOB else None


# --------------------------------------------------------------------------- pieces


def _theirs(key: str, value: Any, mmap: MethodMap) -> tuple[str, Scalar]:
    """Our parameter ``key: value`` -> mergekit's name and value (the inverse of ``MethodMap.convert``)."""
    for theirs, (ours, a, b) in mmap.convert.items():
        if ours == key:
            return theirs, round((float(value) - a) / b, 12)
    return key, value


def _exported_keys(cfg: MergeConfig, mmap: MethodMap) -> list[str]:
    """Our parameter names that mergekit reads (not fixed by its method, not ours only)."""
    ours = (*mmap.fixed, *mmap.ours_only, *POST_STEP_NAMES)
    return [p.name for p in cfg.spec.params if p.name not in ours]


def _top_parameters(cfg: MergeConfig, per_model: list[str], mmap: MethodMap) -> dict[str, Any]:
    """Every parameter at its resolved value; one the overrides set, as mergekit's filtered list."""
    shared = cfg.shared_params  # resolved once, when the config was validated
    out: dict[str, Any] = {}
    for key in _exported_keys(cfg, mmap):
        if key in per_model and all(key in m.params for m in cfg.models):
            continue  # every model has its own value: a tensor-wide one would never be read
        name, value = _theirs(key, shared[key], mmap)
        conds = [
            {"filter": _substring(o.pattern), "value": _theirs(key, o.params[key], mmap)[1]}
            for o in reversed(cfg.overrides)
            if key in o.params
        ]
        out[name] = [*conds, {"value": value}] if conds else value
    return out


def _reference(path: str, base: str | None, notes: list[str]) -> str:
    """A model as mergekit names it: a LoRA adapter folder (ours: applied to the base) is ``BASE+ADAPTER``."""
    if not is_adapter(path) or base is None:
        return path
    notes.append(f"LoRA adapter {path} written as {base}+{path} (mergekit's model+lora)")
    return f"{base}+{path}"


def _model_entry(
    m: ModelSpec, per_model: list[str], cfg: MergeConfig, mmap: MethodMap, notes: list[str]
) -> dict[str, Any]:
    """``{model: PATH, parameters: {weight, per-model values}}``."""
    params: dict[str, Any] = {}
    if cfg.spec.uses_weights and (m.weight != 1.0 or mmap.weights_required):
        params["weight"] = m.weight
    shared = cfg.shared_params
    for key in per_model:
        name, value = _theirs(key, m.params.get(key, shared[key]), mmap)
        params[name] = value
    ref = _reference(m.path, cfg.base, notes)
    return {"model": ref, "parameters": params} if params else {"model": ref}


def _dtype(dtype: str | None, source: str, notes: list[str]) -> dict[str, str]:
    """agentmerge computes in float32 and writes ``dtype``: mergekit's ``dtype: float32`` and ``out_dtype``."""
    if dtype is None:
        notes.append("dtype not set: agentmerge keeps the base's dtype, mergekit's output dtype is its own default")
        return {}
    name = FLOAT_DTYPE_NAMES.get(dtype.lower().removeprefix("torch."), dtype)
    if name not in MERGEKIT_DTYPES:
        raise ConfigError(f"{source}: dtype {dtype!r} cannot be written for mergekit (it writes {MERGEKIT_DTYPES})")
    return {"dtype": "float32"} if name == "float32" else {"dtype": "float32", "out_dtype": name}


def _left_out(cfg: MergeConfig) -> list[str]:
    """Notes on the settings that do not change what is computed, or that mergekit takes on its command line."""
    defaults = MergeConfig.model_fields
    notes = []
    if cfg.spec.param("p") is not None:  # DARE and DELLA draw random drops
        notes.append(
            f"seed {cfg.seed} left out: mergekit draws its own random drops (mergekit-yaml --random-seed), "
            "so they differ from agentmerge's"
        )
    if cfg.max_shard_size != defaults["max_shard_size"].default:
        notes.append(f"max_shard_size {cfg.max_shard_size} left out: pass mergekit-yaml --out-shard-size")
    named = [m.name for m in cfg.models if m.name]
    if named:
        notes.append(f"model names ({', '.join(named)}) left out: mergekit names models by path")
    return notes
