"""The merge configuration: frozen pydantic models of the YAML file, validated before any heavy work.

```yaml
method: ram_plus
base: ./qwen-base
models:
  - path: ./agent-code
  - path: ./agent-tool
    weight: 1.0            # used by methods that weight models
params: {r: 0.1, alpha: 2.0}
overrides:               # per-tensor-pattern parameters (fnmatch globs on tensor names)
  - pattern: "*mlp*"
    params: {epsilon: 1e-6}
  - pattern: "*.layers.0.*"
    weights: [1.2, 0.8]    # per-model weights of these tensors (methods that weight models; the last match wins)
dtype: bfloat16          # default: each tensor keeps the base's dtype
max_shard_size: 5GB
include: []              # globs; empty means every tensor
exclude: ["*norm*"]      # excluded tensors are copied from the base unchanged
seed: 0
```

Unknown keys, methods and parameters are refused with the closest valid name suggested. Once validated, the
config holds each tensor group's typed parameter record (``param_table.ParamTable``): ``tensor_params``,
``model_params`` and ``shared_params`` hand out records, never dicts to resolve again.
"""

from __future__ import annotations

import fnmatch
import functools
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from agentmerge.config.limits import PatternSet
from agentmerge.config.mergekit import from_mergekit, is_mergekit
from agentmerge.config.param_table import ParamTable
from agentmerge.config.userinput import did_you_mean, read_yaml
from agentmerge.errors import ConfigError
from agentmerge.io.guards.units import FLOAT_DTYPE_NAMES, check_dtype_name, parse_size
from agentmerge.methods import METHODS, Method, MethodParams, ParamValue
from agentmerge.methods.lines import lines_on
from agentmerge.methods.poststeps import check_base

MAX_WEIGHT = 1e6  # |weight| above this is a typo or an attack, not a merge
NEAR_ZERO_SUM = 1e-6  # |sum of weights| below this fraction of sum |weights| is refused
DEPRECATED_KEYS = {  # accepted in a config and dropped, with a note: key -> the rest of the note
    "allow_dtype_mismatch": "has no effect (models in another floating dtype than the base's are always "
    "accepted); remove it",
}


def check_weight(v: float) -> float:
    """A model weight must be finite and at most ``MAX_WEIGHT`` in size."""
    if not math.isfinite(v):
        raise ValueError(f"model weight must be a finite number (got {v})")
    if abs(v) > MAX_WEIGHT:
        raise ValueError(f"model weight {v:g} is out of range [-{MAX_WEIGHT:g}, {MAX_WEIGHT:g}]")
    return v


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ModelSpec(_Frozen):
    """One input model: a local folder (or hub id), an optional weight and per-model parameters."""

    path: str
    weight: float = 1.0
    name: str | None = None
    params: dict[str, ParamValue] = Field(default_factory=dict)
    fisher: str | None = None  # folder or file of this model's diagonal Fisher (for method: fisher)

    @field_validator("weight")
    @classmethod
    def _sane_weight(cls, v: float) -> float:
        return check_weight(v)

    @property
    def label(self) -> str:
        return self.name or Path(self.path).name or self.path


def join_lists(params: Any) -> Any:
    """A parameter given as a list of strings (YAML, or ``--param groups=[a, b]``) -> one whitespace-separated
    string; a list of anything else is refused by name (a parameter takes one value)."""
    if not isinstance(params, Mapping):
        return params
    lists = {k: v for k, v in params.items() if isinstance(v, list)}
    for k, v in lists.items():
        if not all(isinstance(x, str) for x in v):
            raise ValueError(f"{k}: give one value, not a list ({v!r}); only text parameters such as groups take one")
    return {**params, **{k: " ".join(v) for k, v in lists.items()}}


class Override(_Frozen):
    """Parameters for the tensors whose names match ``pattern`` (fnmatch glob), and optionally their model
    weights (one per model, for methods that weight models: the per-layer-group weights of ``agentmerge search``)."""

    pattern: str
    params: dict[str, ParamValue] = Field(default_factory=dict)
    weights: list[float] | None = None

    @field_validator("weights")
    @classmethod
    def _sane_weights(cls, v: list[float] | None) -> list[float] | None:
        return None if v is None else [check_weight(w) for w in v]

    _lists = field_validator("params", mode="before")(classmethod(lambda cls, v: join_lists(v)))


class MergeConfig(_Frozen):
    method: str
    base: str | None = None
    models: list[ModelSpec] = Field(min_length=1)
    params: dict[str, ParamValue] = Field(default_factory=dict)
    overrides: list[Override] = Field(default_factory=list)
    dtype: str | None = None
    max_shard_size: str | int = "5GB"
    include: list[str] = Field(default_factory=list)
    exclude: list[str] = Field(default_factory=list)
    seed: int = 0
    tokenizer_source: str | None = None
    threads: int | None = Field(default=None, ge=1)
    max_memory: str | int = "1GB"
    chunk_size: int | None = Field(default=None, ge=1)  # elements per chunk; derived from max_memory if unset
    _table: ParamTable = PrivateAttr()  # the typed records of params, overrides and models (set when validated)

    _lists = field_validator("params", mode="before")(classmethod(lambda cls, v: join_lists(v)))

    @model_validator(mode="before")
    @classmethod
    def _one_name_per_parameter(cls, data: Any) -> Any:
        return canonical_names(data)

    @field_validator("method")
    @classmethod
    def _known_method(cls, v: str) -> str:
        if v not in METHODS:
            raise ValueError(f"unknown method {v!r}{did_you_mean(v, tuple(METHODS))}; see `agentmerge methods`")
        return v

    @field_validator("tokenizer_source", mode="before")
    @classmethod
    def _tokenizer_source(cls, v: object) -> object:
        """An agent's index may be given as a number (``tokenizer_source: 1``); it is kept as text."""
        return str(v) if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else v

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, v: str | None) -> str | None:
        if v is not None:
            check_dtype_name(v)
            if v.lower().removeprefix("torch.") not in FLOAT_DTYPE_NAMES:  # no bool, int or fp8 output
                raise ValueError(f"output dtype {v!r} is not a floating type; use bfloat16, float16 or float32")
        return v

    @field_validator("max_shard_size", "max_memory")
    @classmethod
    def _size(cls, v: str | int) -> str | int:
        if parse_size(v) <= 0:
            raise ValueError("must be positive")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> MergeConfig:
        m = self.spec
        if m.needs_base and self.base is None:
            raise ValueError(f"method {m.name!r} needs a base model (base: PATH)")
        n = len(self.models)
        if n < m.min_models or (m.max_models is not None and n > m.max_models):
            most = "any number of" if m.max_models is None else f"at most {m.max_models}"
            raise ValueError(f"method {m.name!r} takes at least {m.min_models} and {most} models, got {n}")
        self._check_weights(m, [s.weight for s in self.models], "model weights")
        index = agent_index(self.tokenizer_source)
        if index is not None and index >= n:
            raise ValueError(
                f"tokenizer_source {self.tokenizer_source}: an agent's index counts from 0, and there are {n} models "
                f"(0..{n - 1}); give base, an index, or a model folder (./{self.tokenizer_source} for a folder of "
                "that name)"
            )
        for i, o in enumerate(self.overrides):
            if o.weights is not None:
                if len(o.weights) != n:
                    raise ValueError(f"overrides[{i}].weights: give one weight per model ({n}), got {len(o.weights)}")
                self._check_weights(m, o.weights, f"overrides[{i}].weights")
        for i, spec in enumerate(self.models):
            _check_model_spec(m, spec, i)
        overrides = [(o.pattern, o.params) for o in self.overrides]
        self._table = ParamTable.build(m, self.params, overrides, [spec.params for spec in self.models])
        if self.base is None and any(lines_on(p) for p in [self.params, *(o.params for o in self.overrides)]):
            raise ValueError(
                f"LiNeS (lines_beta / lines_shallow) scales {m.name!r}'s merged task vector against a base model; "
                "give one (base: PATH)"
            )
        check_base(m.name, [self.params, *(o.params for o in self.overrides)], self.base is not None)
        return self

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> MergeConfig:
        """A copy; with ``update``, validated again (its parameter records are resolved from the new values)."""
        if not update:
            return super().model_copy(deep=deep)
        return type(self).model_validate({**self.model_dump(), **update})

    def _check_weights(self, m: Method, weights: list[float], what: str) -> None:
        if not m.uses_weights and any(w != 1.0 for w in weights):
            where = "models" if what == "model weights" else what.removesuffix(".weights")
            raise ValueError(f"method {m.name!r} does not use model weights; remove 'weight' from {where}")
        if m.uses_weights and sum(weights) == 0:
            raise ValueError(f"{what} sum to zero")
        if m.uses_weights and abs(sum(weights)) < NEAR_ZERO_SUM * sum(abs(w) for w in weights):
            raise ValueError(
                f"{what} sum to {sum(weights):.3g}, nearly zero next to their sizes; dividing by it "
                "would blow the merge up; choose weights that do not cancel out"
            )

    @property
    def spec(self) -> Method:
        return METHODS[self.method]

    @property
    def tokenizer_ref(self) -> str | None:
        """The folder or Hub id ``tokenizer_source`` names: ``base`` is the base (the first model when there is none),
        a number the model at that index (0: the first), anything else a path or Hub id; None when not given."""
        src = self.tokenizer_source
        if src == "base":
            return self.base if self.base is not None else self.models[0].path
        index = agent_index(src)
        return self.models[index].path if index is not None else src

    @property
    def shard_bytes(self) -> int:
        return parse_size(self.max_shard_size)

    @property
    def memory_bytes(self) -> int:
        return parse_size(self.max_memory)

    @property
    def shared_params(self) -> MethodParams:
        """The merge's own parameters: the method's record of defaults and ``params`` (no override's, even ``*``)."""
        return self._table.shared

    def tensor_params(self, tensor: str) -> MethodParams:
        """The record of ``tensor``: defaults, then ``params``, then matching overrides in order (resolved once per
        group of overrides, ``ParamTable``)."""
        return self._table.tensor(tensor)

    def tensor_weights(self, tensor: str) -> tuple[float, ...] | None:
        """The model weights of ``tensor``: the last matching override's ``weights``; None: the models' own."""
        found = None
        for o in self.overrides:
            if o.weights is not None and fnmatch.fnmatchcase(tensor, o.pattern):
                found = tuple(o.weights)
        return found

    def model_params(self, tensor: str) -> tuple[MethodParams, ...]:
        """Per-model records for ``tensor``: its params, then the model's own on top; () when no model sets any."""
        return self._table.tensor_models(tensor)

    def selected(self, tensor: str) -> bool:
        """Whether ``tensor`` is merged (True) or copied from the base (False) by include/exclude."""
        inc = self._include.empty or self._include.matches(tensor)
        return inc and not self._exclude.matches(tensor)

    @functools.cached_property
    def _include(self) -> PatternSet:
        return PatternSet(self.include)

    @functools.cached_property
    def _exclude(self) -> PatternSet:
        return PatternSet(self.exclude)


def canonical_names(data: Any) -> Any:
    """A config's raw data with each parameter alias (``lambda``, TSV's ``alpha``) under its parameter's name
    (``scale``) in ``params``, ``overrides`` and ``models``, so everything after validation reads one name."""
    method = data.get("method") if isinstance(data, dict) else None
    if not isinstance(method, str) or method not in METHODS:
        return data
    m = METHODS[method]

    def fix(item: Any) -> Any:
        if isinstance(item, ModelSpec | Override):
            return item.model_copy(update={"params": m.canonical(item.params)})
        if isinstance(item, Mapping) and isinstance(item.get("params"), Mapping):
            return {**item, "params": m.canonical(item["params"])}
        return item

    out = fix(data)
    for key in ("overrides", "models"):
        if isinstance(out.get(key), list):
            out[key] = [fix(i) for i in out[key]]
    return out


def agent_index(tokenizer_source: str | None) -> int | None:
    """The agent's index a ``tokenizer_source`` of 1 to 6 ASCII digits gives (``"1"``: the second model), else None."""
    src = tokenizer_source
    return int(src) if src is not None and 0 < len(src) <= 6 and src.isascii() and src.isdigit() else None


def _check_model_spec(method: Method, spec: ModelSpec, index: int) -> None:
    """Per-model params must be ones the method reads per model; Fisher merging needs each model's Fisher."""
    for key in spec.params:
        p = method.param(key)
        if p is not None and not p.per_model:
            per_model = [q.name for q in method.params if q.per_model]
            raise ValueError(
                f"models[{index}].params: {key!r} cannot be set per model for {method.name!r} "
                f"(per-model parameters: {', '.join(per_model) or 'none'}); set it in params or overrides"
            )
    if "fisher" in method.model_inputs and spec.fisher is None:
        raise ValueError(
            f"models[{index}]: method {method.name!r} needs this model's Fisher (fisher: PATH; "
            f"make it with `agentmerge fisher {spec.path} --out DIR`)"
        )


def config_from_dict(data: Mapping[str, Any], source: str = "config") -> MergeConfig:
    """Build a ``MergeConfig``, turning pydantic's errors into one readable ``ConfigError``.

    Keys of ``DEPRECATED_KEYS`` are dropped (``read_config`` tells the user about them)."""
    data = without_deprecated(data)[0]
    _check_keys(data, MergeConfig, source)
    if not isinstance(data.get("models") or [], list):
        raise ConfigError(f"{source}: 'models' must be a list of {{path: PATH}} entries")
    for i, m in enumerate(data.get("models") or []):
        if isinstance(m, Mapping):
            _check_keys(m, ModelSpec, f"{source}: models[{i}]")
    try:
        return MergeConfig.model_validate(dict(data))
    except ValidationError as e:
        raise ConfigError(f"{source}: {_explain(e)}") from None


def read_config(path: str | Path) -> tuple[dict[str, Any], list[str]]:
    """A YAML config file as a plain dict (validated later, after flags are applied), and notes for the user.

    A mergekit config (it has ``merge_method``) is translated here, the one place that tells the two
    apart; its notes say what was translated approximately. A native config's notes name the deprecated keys
    it holds (accepted, without effect).
    """
    p = Path(path)
    data = read_yaml(p)
    if is_mergekit(data):
        conv = from_mergekit(data, str(p))
        return conv.config, conv.notes  # models are already {path: ...} mappings
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a mapping with keys such as method, base, models")
    if isinstance(data.get("models"), list):
        data["models"] = [{"path": m} if isinstance(m, str) else m for m in data["models"]]
    return without_deprecated(data)


def without_deprecated(data: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``data`` without the keys of ``DEPRECATED_KEYS``, and a note for each one it had."""
    kept = {k: v for k, v in data.items() if k not in DEPRECATED_KEYS}
    return kept, [f"{k} {DEPRECATED_KEYS[k]}" for k in data if k in DEPRECATED_KEYS]


def load_config(path: str | Path) -> dict[str, Any]:
    """Read a YAML config file (native or mergekit) into a plain dict; see ``read_config``."""
    return read_config(path)[0]


def _check_keys(data: Mapping[str, Any], model: type[BaseModel], source: str) -> None:
    known = tuple(model.model_fields)
    for key in data:
        if key not in known:
            raise ConfigError(f"{source}: unknown key {key!r}{did_you_mean(str(key), known)}")


def _explain(e: ValidationError) -> str:
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


def input_refs(cfg: MergeConfig) -> list[str]:
    """Every path the merge reads: base, models, their Fisher files and the tokenizer source."""
    refs = [cfg.base] if cfg.base else []
    refs += [m.path for m in cfg.models]
    refs += [m.fisher for m in cfg.models if m.fisher]
    if cfg.tokenizer_ref:
        refs.append(cfg.tokenizer_ref)
    return refs
