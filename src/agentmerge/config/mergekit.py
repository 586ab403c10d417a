"""Read mergekit YAML configs: translate them into agentmerge's native config, or refuse clearly.

A mergekit config is recognised by its ``merge_method`` key. The translation covers the methods both
tools have (``mergekit_names.MERGEKIT``), top-level and per-model ``parameters`` (plain values, and filtered
values for global parameters, which become ``overrides``), ``base_model``, ``dtype`` / ``out_dtype``
and ``tokenizer_source``; model references (``org/name@rev`` and ``{path, revision}`` become our
``org/name@rev``, ``model+lora`` our ``MODEL+ADAPTER``). Everything else (``slices``, ``modules``,
gradients, a revision on a local path, a ``union`` tokenizer...) is refused with a ``ConfigError`` that
names the key, never silently dropped. Harmless differences are returned as notes for the user to read.

    conv = from_mergekit(yaml.safe_load(text))
    conv.config   # a dict for ``config_from_dict``
    conv.notes    # what was translated approximately, one sentence each
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agentmerge.config.mergekit_models import endpoints, join_base, model_list, model_ref, param_mapping
from agentmerge.config.mergekit_names import MERGEKIT, MERGEKIT_WITHOUT_COUNTERPART, MethodMap, Scalar
from agentmerge.config.userinput import did_you_mean, read_yaml
from agentmerge.errors import ConfigError
from agentmerge.methods.method import Method
from agentmerge.methods.registry import METHODS

TOP_KEYS = (
    "merge_method",
    "base_model",
    "models",
    "parameters",
    "dtype",
    "out_dtype",
    "tokenizer_source",
    "tokenizer",
    "chat_template",
    "slices",
    "modules",
)
UNSUPPORTED_TOP = {
    "slices": "layer slicing (frankenmerges) is not supported; list whole models under 'models'",
    "modules": "per-module merges are not supported; list whole models under 'models'",
    "chat_template": "setting a chat template is not supported; edit tokenizer_config.json after the merge",
}
SPECIAL = ("weight", "normalize", "rescale", "int8_mask")  # handled by dedicated code, not as method params


@dataclass
class Converted:
    """A translated config dict (native, or mergekit's for ``mergekit_export``) and the notes on it."""

    config: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def to_yaml(self) -> str:
        """The YAML, with the notes as leading comments."""
        head = "".join(f"# note: {n}\n" for n in self.notes)
        return head + yaml.safe_dump(self.config, sort_keys=False)


def is_mergekit(data: object) -> bool:
    """Whether a loaded YAML document is a mergekit config (it has ``merge_method``)."""
    return isinstance(data, Mapping) and "merge_method" in data


def load_mergekit(path: str | Path) -> Converted:
    """Read and translate a mergekit YAML file."""
    p = Path(path)
    return from_mergekit(read_yaml(p), str(p))


def from_mergekit(data: object, source: str = "mergekit config") -> Converted:
    """Translate a parsed mergekit config into agentmerge's native dict (``ConfigError`` if impossible)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a mapping with merge_method, models, ...")
    _check_top_keys(data, source)
    mmap, method = _method(data.get("merge_method"), source)
    notes: list[str] = []
    base = model_ref(data["base_model"], f"{source}: base_model") if data.get("base_model") is not None else None
    top = param_mapping(data.get("parameters"), f"{source}: parameters")
    joins = base is not None and mmap.base_joins  # mergekit's planner adds it as one more input (karcher)
    if base is not None and not mmap.uses_base and not joins:
        notes.append(f"base_model is not used by {method.name!r}; models listed under 'models' are averaged")
        base = None
    models = model_list(data.get("models"), None if joins else base, source, notes)
    if base is not None and joins:
        models, base = join_base(models, base, method.name, notes), None
    if mmap.endpoints:
        models = endpoints(models, base, source)
        base = None
    out: dict[str, Any] = {"method": method.name}
    if base is not None:
        out["base"] = base
    specs: list[dict[str, Any]] = [{"path": path} for path, _ in models]
    params: dict[str, Any] = dict(mmap.fixed)
    overrides: list[dict[str, Any]] = []
    per_model_keys = {k for _, p in models for k in p if k not in SPECIAL}
    for key in sorted(per_model_keys):
        _per_model_param(key, models, top, specs, params, mmap, method, source)
    for key, value in top.items():
        if key not in SPECIAL and key not in per_model_keys and value is not None:
            overrides += _global_param(key, value, params, mmap, method, source)
    given = per_model_keys | {k for k, v in top.items() if v is not None}
    _fill_defaults(given, params, mmap, method, source, notes)
    _no_sparsification(
        method.name, [params, *(s.get("params", {}) for s in specs), *(o["params"] for o in overrides)], notes
    )
    weights = _weights(models, top, method, source)
    weights = _normalize(top.get("normalize"), weights, params, mmap, method, source, notes)
    _rescale(top.get("rescale"), params, mmap, method, source)
    if top.get("int8_mask") is not None:
        notes.append("int8_mask has no effect in agentmerge (masks are always boolean); ignored")
    for spec, w in zip(specs, weights, strict=True):
        if w != 1.0:
            spec["weight"] = w
    out["models"] = specs
    if params:
        out["params"] = params
    if overrides:
        out["overrides"] = overrides
    _dtype(data, out, notes)
    _tokenizer(data, base if base is not None else data.get("base_model"), out, source)
    return Converted(out, notes)


# --------------------------------------------------------------------------- pieces


def _fill_defaults(
    given: set[str], params: dict[str, Any], mmap: MethodMap, method: Method, source: str, notes: list[str]
) -> None:
    """Apply mergekit's default of every parameter the config leaves out, and say so (one note each)."""
    for key, value in mmap.defaults.items():
        if key in given:
            continue
        name, ours = _translate(key, value, mmap, method, f"{source}: default {key}")
        params[name] = ours
        as_ours = "" if (name, ours) == (key, value) else f", agentmerge's {name} = {ours}"
        notes.append(f"{key} not given: mergekit's default {key} = {value} filled in{as_ours}")


def _no_sparsification(method: str, groups: Sequence[dict[str, Any]], notes: list[str]) -> None:
    """mergekit does not sparsify at all at density >= 1 (breadcrumbs' gamma and della's epsilon then do
    nothing): the same parameters here are gamma = 0 and, with p = 0, eps = 0."""
    for params in groups:
        if method == "breadcrumbs" and float(params.get("density", 0.0)) >= 1.0 and params.get("gamma", 0.0) != 0.0:
            params["gamma"] = 0.0
            notes.append("breadcrumbs with density 1.0: mergekit does not sparsify, so gamma is set to 0")
        if method == "della" and "p" in params and float(params["p"]) <= 0.0 and params.get("eps", 0.0) != 0.0:
            params["eps"] = 0.0
            notes.append("della with density 1.0: mergekit does not prune, so eps is set to 0")


def _check_top_keys(data: Mapping[str, Any], source: str) -> None:
    for key in data:
        if key not in TOP_KEYS:
            raise ConfigError(f"{source}: unknown mergekit key {key!r}{did_you_mean(str(key), TOP_KEYS)}")
        if key in UNSUPPORTED_TOP and data[key] is not None:
            raise ConfigError(f"{source}: mergekit key {key!r} is not supported: {UNSUPPORTED_TOP[key]}")
    if data.get("models") is None:
        raise ConfigError(f"{source}: 'models' is required (agentmerge merges whole models)")


def _method(name: object, source: str) -> tuple[MethodMap, Method]:
    if not isinstance(name, str):
        raise ConfigError(f"{source}: merge_method must be a method name (got {name!r})")
    if name in MERGEKIT_WITHOUT_COUNTERPART:
        raise ConfigError(f"{source}: mergekit method {name!r} has no agentmerge counterpart; see `agentmerge methods`")
    if name not in MERGEKIT:
        known = (*MERGEKIT, *MERGEKIT_WITHOUT_COUNTERPART)
        raise ConfigError(f"{source}: unknown mergekit merge_method {name!r}{did_you_mean(name, known)}")
    mmap = MERGEKIT[name]
    if mmap.target not in METHODS:
        raise ConfigError(
            f"{source}: mergekit method {name!r} maps to agentmerge's {mmap.target!r}, which this version does "
            "not implement; see `agentmerge methods`"
        )
    return mmap, METHODS[mmap.target]


def _scalar(value: object, where: str) -> Scalar:
    """A plain value; gradients (lists) and filtered values are refused here."""
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
        raise ConfigError(f"{where}: filtered values are only supported for global parameters, not per model")
    if isinstance(value, list):
        raise ConfigError(
            f"{where}: gradients (lists interpolated across layers) are not supported; give one value, "
            "or use 'overrides' with tensor-name patterns in a native config"
        )
    raise ConfigError(f"{where}: expected a number, boolean or string (got {value!r})")


def _translate(key: str, value: Scalar, mmap: MethodMap, method: Method, where: str) -> tuple[str, Scalar]:
    """mergekit's ``key: value`` -> our parameter name and value; refuse parameters we do not have."""
    name, a, b = mmap.convert.get(key, (key, 0.0, 1.0))
    if method.param(name) is None:
        ours = ", ".join(p.name for p in method.params) or "none"
        hint = did_you_mean(name, tuple(p.name for p in method.params))
        raise ConfigError(
            f"{where}: parameter {key!r} is not supported for {method.name!r}{hint}; agentmerge's takes: {ours}"
        )
    if name in mmap.fixed:
        raise ConfigError(f"{where}: {key!r} is fixed by the mergekit method; remove it")
    if (a, b) == (0.0, 1.0):
        return name, value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}: {key!r} must be a number (got {value!r})")
    return name, round(a + b * float(value), 12)


def _per_model_param(
    key: str,
    models: Sequence[tuple[str, dict[str, Any]]],
    top: Mapping[str, Any],
    specs: list[dict[str, Any]],
    params: dict[str, Any],
    mmap: MethodMap,
    method: Method,
    source: str,
) -> None:
    """A parameter given per model: one value for all -> ``params``; different values -> per-model params."""
    values = []
    for i, (_, p) in enumerate(models):
        raw = p.get(key, top.get(key))
        where = f"{source}: models[{i}].parameters.{key}"
        if raw is None:
            raise ConfigError(f"{where}: missing (set it for every model, or under top-level parameters)")
        values.append(_translate(key, _scalar(raw, where), mmap, method, where))
    name = values[0][0]
    distinct = {v for _, v in values}
    if len(distinct) == 1:
        params[name] = values[0][1]
        return
    spec = method.param(name)
    if not getattr(spec, "per_model", False):
        raise ConfigError(
            f"{source}: models have different values of {key!r} ({sorted(map(str, distinct))}); "
            f"agentmerge's {method.name!r} applies one value to every model"
        )
    for s, (_, v) in zip(specs, values, strict=True):
        s["params"] = {**s.get("params", {}), name: v}
    if isinstance(top.get(key), bool | int | float | str):  # the tensor-wide value, as mergekit records it
        params[name] = _translate(key, top[key], mmap, method, f"{source}: parameters.{key}")[1]


def _global_param(
    key: str, value: object, params: dict[str, Any], mmap: MethodMap, method: Method, source: str
) -> list[dict[str, Any]]:
    """A top-level parameter: a value -> ``params``; ``{filter, value}`` entries -> overrides (returned)."""
    where = f"{source}: parameters.{key}"
    default, conds = _filtered(value, where)
    if default is not None:
        name, v = _translate(key, default, mmap, method, where)
        params[name] = v
    overrides = []
    for flt, raw in reversed(conds):  # mergekit uses the first match; our overrides let the last one win
        name, v = _translate(key, raw, mmap, method, where)
        overrides.append({"pattern": f"*{flt}*", "params": {name: v}})
    return overrides


def _filtered(value: object, where: str) -> tuple[Scalar | None, list[tuple[str, Scalar]]]:
    """A mergekit value or list of ``{filter, value}`` -> (default, [(substring, value)] in mergekit's order)."""
    if not (isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value)):
        return _scalar(value, where), []
    default: Scalar | None = None
    conds: list[tuple[str, Scalar]] = []
    for j, cond in enumerate(value):
        if set(cond) - {"filter", "value"} or "value" not in cond:
            raise ConfigError(f"{where}[{j}]: expected {{filter: NAME, value: X}}")
        v = _scalar(cond["value"], f"{where}[{j}].value")
        flt = cond.get("filter")
        if flt is None or flt == "*":
            default = v
            break  # mergekit stops at the first entry that matches everything
        if not isinstance(flt, str) or not flt or any(c in flt for c in "*?[]"):
            raise ConfigError(f"{where}[{j}].filter: expected a plain substring of tensor names (got {flt!r})")
        conds.append((flt, v))
    return default, conds


def _weights(
    models: Sequence[tuple[str, dict[str, Any]]], top: Mapping[str, Any], method: Method, source: str
) -> list[float]:
    """One weight per model (mergekit's per-model ``weight``, else the top-level one, else 1)."""
    out = []
    for i, (_, p) in enumerate(models):
        raw = p.get("weight", top.get("weight", 1.0))
        w = _scalar(raw, f"{source}: models[{i}].parameters.weight")
        if isinstance(w, bool) or not isinstance(w, int | float):
            raise ConfigError(f"{source}: models[{i}].parameters.weight must be a number (got {w!r})")
        out.append(float(w))
    if not method.uses_weights and any(w != 1.0 for w in out):
        raise ConfigError(f"{source}: agentmerge's {method.name!r} does not weight models; remove 'weight'")
    return out


def _normalize(
    given: object,
    weights: list[float],
    params: dict[str, Any],
    mmap: MethodMap,
    method: Method,
    source: str,
    notes: list[str],
) -> list[float]:
    """mergekit's ``normalize`` flag: passed on, folded into the weights, noted, or refused."""
    where = f"{source}: parameters.normalize"
    if given is not None and not isinstance(given, bool):
        raise ConfigError(f"{where}: must be true or false (got {given!r})")
    if method.param("normalize") is not None:
        if given is not None:
            params["normalize"] = given
        return weights
    if mmap.ours_normalize is None:
        if given is not None:
            raise ConfigError(f"{where}: not supported for {method.name!r} (it has no normalize flag)")
        return weights
    effective = mmap.normalize if given is None else given
    if effective == mmap.ours_normalize:
        return weights
    if method.name == "task_arithmetic" and effective:
        total = sum(weights)
        if total == 0:
            raise ConfigError(f"{where}: true with model weights summing to zero")
        notes.append("normalize: true folded into the model weights (each divided by their sum)")
        return [w / total for w in weights]
    ours = "weighted mean" if mmap.ours_normalize else "weighted sum"
    if given is None:
        notes.append(
            f"mergekit's default for this method is normalize: {str(effective).lower()}; agentmerge's "
            f"{method.name!r} always takes the {ours} of the task vectors, so results differ from mergekit's"
        )
        return weights
    raise ConfigError(f"{where}: {str(given).lower()} is not supported; agentmerge's {method.name!r} takes the {ours}")


def _rescale(given: object, params: dict[str, Any], mmap: MethodMap, method: Method, source: str) -> None:
    """mergekit's ``rescale`` flag (DARE's 1/keep scaling): passed on, accepted when it matches, or refused."""
    if given is None:
        return
    where = f"{source}: parameters.rescale"
    if method.param("rescale") is not None:
        params["rescale"] = given
    elif mmap.rescale is None:
        raise ConfigError(f"{where}: not supported for {method.name!r} (it has no rescale flag)")
    elif given != mmap.rescale:
        raise ConfigError(
            f"{where}: {given!r} is not supported; agentmerge's {method.name!r} always computes "
            f"rescale: {str(mmap.rescale).lower()}"
        )


def _dtype(data: Mapping[str, Any], out: dict[str, Any], notes: list[str]) -> None:
    dtype, out_dtype = data.get("dtype"), data.get("out_dtype")
    chosen = out_dtype if out_dtype is not None else dtype
    if chosen is not None:
        out["dtype"] = str(chosen)
    if dtype is not None and out_dtype is not None and dtype != out_dtype:
        notes.append(f"dtype {dtype} ignored: agentmerge always computes in float32 and writes out_dtype {out_dtype}")
    elif dtype is not None:
        notes.append(f"agentmerge computes in float32 and writes {dtype} (mergekit's dtype is also its compute dtype)")


def _tokenizer(data: Mapping[str, Any], base: object, out: dict[str, Any], source: str) -> None:
    src: object = data.get("tokenizer_source")
    tok = data.get("tokenizer")
    if tok is not None:
        if src is not None:
            raise ConfigError(f"{source}: give tokenizer_source or tokenizer, not both")
        if not isinstance(tok, Mapping) or set(tok) - {"source"}:
            raise ConfigError(f"{source}: 'tokenizer' is only supported as {{source: PATH}} (no tokens, padding)")
        src = tok.get("source", "union")
    if src is None or src == "base":
        return  # agentmerge copies the base's tokenizer by default
    if src == "union":
        raise ConfigError(f"{source}: tokenizer_source: union is not supported; models must share one tokenizer")
    out["tokenizer_source"] = model_ref(src, f"{source}: tokenizer_source")
