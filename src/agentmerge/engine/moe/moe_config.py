"""The ``agentmerge moe`` configuration, read and checked without torch: experts, their prompts, the static merge.

```yaml
base: ./base
experts:                       # one expert per agent: its MLP, routed to by its prompts
  - path: ./agent-code
    prompts: ["code:q=7;m=q-3;?m>", "code:a=2;b=a*3;?b>"]
  - path: ./agent-tool
    prompts_file: tool.txt     # one prompt a line, or JSONL with a "prompt" field (an eval task file)
merge: {method: ram, params: {}}   # attention, embeddings, norms: any `agentmerge merge` setting but base/models
static: null                   # or the folder of an existing merge of this base (then no merge runs)
experts_per_token: 2           # 1 or 2
shared_expert: none            # none | base | merged   (Qwen2-MoE outputs only)
shared_weight: 0.5             # the shared expert's share of the MLP output when there is one
router_margin: 4.0             # mean logit margin of an agent's own expert on its prompts
chat_template: false           # wrap each prompt in the base's chat template first
dtype: null                    # output dtype (default: the base's); max_shard_size, threads as for merge
```
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentmerge.config.schema import MergeConfig, config_from_dict
from agentmerge.config.userinput import did_you_mean, read_yaml
from agentmerge.errors import ConfigError
from agentmerge.io.guards.bounded import text_lines
from agentmerge.io.guards.strict_json import strict_bool

SHARED = ("none", "base", "merged")
KEYS = (
    "base",
    "experts",
    "merge",
    "static",
    "experts_per_token",
    "shared_expert",
    "shared_weight",
    "router_margin",
    "chat_template",
    "dtype",
    "max_shard_size",
    "threads",
)
EXPERT_KEYS = ("path", "prompts", "prompts_file", "name")
MAX_PROMPTS = 4096
MAX_PROMPTS_BYTES = 32 << 20  # a prompts file: 4096 prompts of 8 k characters each


@dataclass(frozen=True)
class Expert:
    path: str
    prompts: tuple[str, ...]
    name: str


@dataclass(frozen=True)
class MoeConfig:
    """A checked ``moe`` configuration; ``merge`` is the static merge's own (validated) config."""

    base: str
    experts: tuple[Expert, ...]
    merge: MergeConfig
    static: str | None = None
    experts_per_token: int = 2
    shared_expert: str = "none"
    shared_weight: float = 0.5
    router_margin: float = 4.0
    chat_template: bool = False

    def record(self) -> dict[str, Any]:
        """The settings as merge.json records them (prompts counted, not copied)."""
        return {
            "experts_per_token": self.experts_per_token,
            "shared_expert": self.shared_expert,
            "shared_weight": self.shared_weight if self.shared_expert != "none" else 0.0,
            "router_margin": self.router_margin,
            "chat_template": self.chat_template,
            "static": self.static,
        }


def read_moe_file(path: str | Path) -> dict[str, Any]:
    """A YAML ``moe`` file as a dict (checked by ``moe_config_from_dict`` once flags are applied)."""
    data = read_yaml(Path(path))
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with keys base, experts, merge, ...")
    return data


def moe_config_from_dict(data: Mapping[str, Any], source: str = "moe") -> MoeConfig:
    """Check every key and value; prompts are read from their files here. One ``ConfigError`` line on bad input."""
    _known_keys(data, KEYS, source)
    base = data.get("base")
    if not isinstance(base, str) or not base:
        raise ConfigError(f"{source}: 'base' must name the base model folder")
    experts = _experts(data.get("experts"), source)
    k = data.get("experts_per_token", 2)
    if k not in (1, 2) or isinstance(k, bool):
        raise ConfigError(f"{source}: experts_per_token must be 1 or 2 (got {k!r})")
    shared = data.get("shared_expert", "none")
    if shared not in SHARED:
        raise ConfigError(f"{source}: shared_expert must be one of {', '.join(SHARED)} (got {shared!r})")
    weight = _number(data, "shared_weight", 0.5, source)
    if not 0.0 <= weight < 1.0:
        raise ConfigError(f"{source}: shared_weight must lie in [0, 1) (got {weight}); 0 leaves the experts alone")
    margin = _number(data, "router_margin", 4.0, source)
    if not 0.0 < margin <= 100.0:
        raise ConfigError(f"{source}: router_margin must lie in (0, 100] (got {margin})")
    static = data.get("static")
    if static is not None and (not isinstance(static, str) or not static):
        raise ConfigError(f"{source}: 'static' must name a merge output folder")
    merge = _merge_config(data, base, experts, source)
    return MoeConfig(
        base, experts, merge, static, int(k), str(shared), weight, margin,
        strict_bool(data.get("chat_template"), f"{source}: chat_template", error=ConfigError),
    )  # fmt: skip


def _known_keys(data: Mapping[str, Any], known: Sequence[str], where: str) -> None:
    for key in data:
        if key not in known:
            raise ConfigError(f"{where}: unknown key {key!r}{did_you_mean(str(key), known)}")


def _number(data: Mapping[str, Any], key: str, default: float, source: str) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"{source}: {key} must be a number (got {value!r})")
    return float(value)


def _experts(entries: Any, source: str) -> tuple[Expert, ...]:
    if not isinstance(entries, list) or len(entries) < 2:
        raise ConfigError(f"{source}: 'experts' must list at least two agents ({{path: PATH, prompts: [...]}})")
    out = []
    for i, entry in enumerate(entries):
        where = f"{source}: experts[{i}]"
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{where}: expected {{path: PATH, prompts: [...] or prompts_file: FILE}}")
        _known_keys(entry, EXPERT_KEYS, where)
        path = entry.get("path")
        if not isinstance(path, str) or not path:
            raise ConfigError(f"{where}: 'path' must name the agent's folder")
        prompts = _prompts(entry, f"{where} ({path})")
        out.append(Expert(path, prompts, str(entry.get("name") or Path(path).name)))
    return tuple(out)


def _prompts(entry: Mapping[str, Any], where: str) -> tuple[str, ...]:
    given = entry.get("prompts")
    if given is not None and (not isinstance(given, list) or not all(isinstance(p, str) for p in given)):
        raise ConfigError(f"{where}: 'prompts' must be a list of strings")
    prompts = [p for p in (given or []) if p.strip()]
    if entry.get("prompts_file"):
        prompts += read_prompts(str(entry["prompts_file"]))
    if not prompts:
        raise ConfigError(
            f"{where}: no prompts for this agent; its router row is made from them: give prompts: [...] or "
            "prompts_file: FILE (--prompts FILE), one prompt a line"
        )
    if len(prompts) > MAX_PROMPTS:
        raise ConfigError(f"{where}: {len(prompts)} prompts; a few dozen are enough (at most {MAX_PROMPTS})")
    return tuple(prompts)


def read_prompts(path: str) -> list[str]:
    """Prompts from a file: one a line (``.txt``), or a JSONL file's ``prompt`` fields (an eval task file).

    A regular UTF-8 file of at most ``MAX_PROMPTS_BYTES`` (``io.guards.bounded``: a FIFO, ``/dev/zero`` or a folder is
    refused before it is opened); a line may be long, the router reads each prompt's first tokens only.
    """
    file = Path(path).expanduser()
    text = text_lines(file, "prompts file", MAX_PROMPTS_BYTES, MAX_PROMPTS_BYTES, ConfigError)
    if not path.endswith(".jsonl"):
        return [line for line in text if line.strip()]
    prompts = []
    for n, line in enumerate(text, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            raise ConfigError(f"{path}:{n}: not JSON; a .jsonl prompts file holds one object a line") from None
        if isinstance(row, dict) and isinstance(row.get("prompt"), str):
            prompts.append(row["prompt"])
    return prompts


def merge_section(data: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The config's ``merge:`` mapping (a copy; ``{}`` when absent), its ``params`` a mapping too."""
    merge = data.get("merge") or {}
    if not isinstance(merge, Mapping):
        raise ConfigError(f"{source}: 'merge' must be a mapping such as {{method: ram, params: {{r: 0.1}}}}")
    params = merge.get("params")
    if params is not None and not isinstance(params, Mapping):
        raise ConfigError(f"{source}: merge.params must be a mapping of NAME: VALUE, e.g. {{r: 0.1}}")
    return dict(merge)


def _merge_config(data: Mapping[str, Any], base: str, experts: Sequence[Expert], source: str) -> MergeConfig:
    merge = merge_section(data, source)
    for key in ("base", "models"):
        if key in merge:
            raise ConfigError(f"{source}: merge.{key}: set by the moe config itself (base, experts); remove it")
    cfg: dict[str, Any] = {"method": "ram", **merge, "base": base, "models": [{"path": e.path} for e in experts]}
    for key in ("dtype", "max_shard_size", "threads"):
        if data.get(key) is not None:
            cfg[key] = data[key]
    return config_from_dict(cfg, f"{source}: merge")
