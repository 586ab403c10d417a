"""A PEFT LoRA adapter's ``adapter_config.json``, read and checked before any tensor is.

What decides the update ``Delta W = s * B @ A`` of a module: its rank ``r`` and ``lora_alpha`` (the first
``rank_pattern`` / ``alpha_pattern`` key that matches the end of the module's name wins, as in peft), and
``use_rslora`` (``s = alpha / sqrt(r)``, else ``alpha / r``). Refused with one line naming the file and the
field, as peft refuses them or as they would make a broken model:

- ``r`` (and every ``rank_pattern`` value) not a whole number in ``1 .. MAX_RANK``;
- ``lora_alpha`` (and every ``alpha_pattern`` value) not a finite number, or 0 (peft accepts 0, but the
  adapter then changes nothing: the merge would silently be the host model);
- a scale ``|s| > MAX_SCALE`` (``lora_alpha: 1e9``: the merged weights would be ~1e7, a broken model);
- pattern keys that are not valid regular expressions, longer than ``userregex.MAX_PATTERN``, or that run
  past ``userregex.MATCH_SECONDS`` on one module name (catastrophic backtracking; the keys come from a file);
  patterns that are not a mapping of keys to numbers;
- flags (``use_rslora``, ``fan_in_fan_out``, ``use_dora``) that are not true / false;
- a file that is not a regular file of at most ``MAX_CONFIG_BYTES``, not JSON, or nested too deeply.

DoRA, layer replication and adapter types other than LoRA are refused by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentmerge.errors import CheckpointError
from agentmerge.io.formats.localpath import ADAPTER_CONFIG
from agentmerge.io.guards.bounded import read_bounded
from agentmerge.io.guards.strict_json import loads_strict
from agentmerge.io.guards.userregex import UserPattern

MAX_CONFIG_BYTES = 16 << 20
MAX_RANK = 1 << 20
MAX_SCALE = 1e6  # |alpha / r|: the bound a merge puts on any coefficient of a task vector (config.schema)
_FLAGS = ("use_rslora", "fan_in_fan_out", "use_dora")


@dataclass(frozen=True)
class LoraSettings:
    """The checked settings of one adapter: default rank and alpha, the patterns, the flags."""

    file: Path
    r: int
    alpha: float
    rank_pattern: tuple[tuple[UserPattern, int], ...]
    alpha_pattern: tuple[tuple[UserPattern, float], ...]
    rslora: bool
    fan_in_fan_out: bool

    def rank_and_alpha(self, module: str) -> tuple[int, float]:
        """The module's ``(r, alpha)``: the first matching pattern key of each, else the defaults."""
        r = _first(self.rank_pattern, module, self.file, "rank_pattern")
        alpha = _first(self.alpha_pattern, module, self.file, "alpha_pattern")
        return (self.r if r is None else int(r)), (self.alpha if alpha is None else float(alpha))

    def scale(self, module: str) -> float:
        """``s`` of the module, checked to be at most ``MAX_SCALE`` in size."""
        r, alpha = self.rank_and_alpha(module)
        s = alpha / math.sqrt(r) if self.rslora else alpha / r
        if abs(s) > MAX_SCALE:
            raise CheckpointError(
                f"{self.file}: module {module!r}: lora_alpha {alpha:g} with r {r} scales its update by {s:g} "
                f"(at most {MAX_SCALE:g}); the merged weights would be broken: fix lora_alpha"
            )
        return s


def _first(patterns: tuple[tuple[UserPattern, Any], ...], module: str, file: Path, field: str) -> Any:
    """peft's rule: the value of the first key ``K`` with ``(.*\\.)?(K)$`` matching the module name (each
    pattern is compiled in that form, so a full match of it is peft's match)."""
    for pattern, value in patterns:
        if pattern.fullmatch(module, f"{file}: {field} key"):
            return value
    return None


def read_lora_config(folder: Path) -> tuple[dict[str, Any], LoraSettings]:
    """The raw ``adapter_config.json`` of ``folder`` and its checked ``LoraSettings``."""
    f = folder / ADAPTER_CONFIG
    cfg = loads_strict(read_bounded(f, "adapter config", MAX_CONFIG_BYTES), str(f))
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{f}: expected a JSON object")
    kind = cfg.get("peft_type", "LORA")
    if kind != "LORA":
        raise CheckpointError(
            f"{f}: {str(kind)[:40]} adapters are not supported (peft_type; LoRA only); merge it into its model first"
        )
    for key in _FLAGS:
        if not (cfg.get(key) is None or isinstance(cfg[key], bool)):
            raise CheckpointError(f"{f}: {key} must be true or false (got {str(cfg[key])[:40]!r})")
    for key, what in (("use_dora", "DoRA"), ("layer_replication", "layer replication")):
        if cfg.get(key):
            raise CheckpointError(f"{folder}: {what} adapters are not supported; merge it with peft's merge_and_unload")
    r = _rank(f, "r", cfg.get("r"))
    settings = LoraSettings(
        file=f,
        r=r,
        alpha=_alpha(f, "lora_alpha", cfg.get("lora_alpha", 8)),
        rank_pattern=_patterns(f, "rank_pattern", cfg.get("rank_pattern"), _rank),
        alpha_pattern=_patterns(f, "alpha_pattern", cfg.get("alpha_pattern"), _alpha),
        rslora=bool(cfg.get("use_rslora")),
        fan_in_fan_out=bool(cfg.get("fan_in_fan_out")),
    )
    return cfg, settings


def _rank(f: Path, field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_RANK:
        shown = str(value)[:40] + ("..." if len(str(value)) > 40 else "")
        raise CheckpointError(f"{f}: {field} must be a positive integer, at most {MAX_RANK} (got {shown})")
    return value


def _alpha(f: Path, field: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CheckpointError(f"{f}: {field} must be a number (got {str(value)[:40]!r})")
    try:
        alpha = float(value)
    except OverflowError:
        alpha = math.inf
    if not math.isfinite(alpha):
        raise CheckpointError(f"{f}: {field} must be a finite number (got {str(value)[:40]})")
    if alpha == 0:
        raise CheckpointError(
            f"{f}: {field} is 0, so the adapter changes nothing (peft scales its update by alpha / r); "
            "set the alpha it was trained with"
        )
    return alpha


def _patterns(f: Path, field: str, value: object, check: Any) -> tuple[tuple[UserPattern, Any], ...]:
    """``rank_pattern`` / ``alpha_pattern``: null or ``{regex: number}``, each key compiled, each value checked."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise CheckpointError(f"{f}: {field} must map module-name patterns to numbers (got {type(value).__name__})")
    out = []
    for key, number in value.items():
        where = f"{f}: {field} key"
        UserPattern.compile(key, where, CheckpointError)  # the key alone: its own mistakes, named as written
        peft_form = UserPattern.compile(f"(?:.*\\.)?(?:{key})", where, CheckpointError)
        out.append((UserPattern(key, peft_form.compiled, CheckpointError), check(f, f"{field}[{key[:40]!r}]", number)))
    return tuple(out)
