"""How a model's tensors map onto a PEFT LoRA adapter: which module each tensor belongs to, and the adapter's names.

The module types come from the model itself: transformers builds it from ``config.json`` on the ``meta``
device (no memory, no weights read), and each checkpoint tensor ``X.p`` is the parameter ``p`` of module ``X``:

- the ``weight`` of an ``nn.Linear``: a LoRA target (``X.lora_A.weight`` ``[r, in]``, ``X.lora_B.weight`` ``[out, r]``);
- the ``bias`` of an ``nn.Linear``: saved as a trained bias (peft's ``bias: all``; ``X.base_layer.bias`` when ``X``
  is also a LoRA target, as peft names it);
- a parameter of any other module (embeddings, norms): the module saved whole (``modules_to_save``).

Adapter tensors carry peft's ``base_model.model.`` prefix. A tied output embedding (``tie_word_embeddings``, the
checkpoint stores no ``lm_head.weight``) is written next to a saved input embedding under the head's name, with
``ensure_weight_tying``, which is what peft needs to keep the two tied when it loads the adapter.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentmerge.errors import CheckpointError
from agentmerge.io.guards import jsontext

PREFIX = "base_model.model."
ADAPTER_FILE = "adapter_model.safetensors"
KINDS = ("linear", "bias", "module", "unknown")


@dataclass(frozen=True)
class Role:
    """A checkpoint tensor's place in the model: its module, the module's type, and how an adapter holds it."""

    tensor: str
    module: str
    module_type: str  # e.g. Linear, Embedding, Qwen2RMSNorm
    kind: str  # one of KINDS


@dataclass(frozen=True)
class Layout:
    """The roles of every tensor, and the tied output embedding's name (None when the head is stored or absent)."""

    roles: dict[str, Role]
    tied_head: str | None  # e.g. lm_head.weight, when it is the input embedding's weight and not stored
    input_embedding: str | None  # e.g. model.embed_tokens


def model_layout(folder: Path, names: Sequence[str]) -> Layout:
    """The roles of ``names`` in the model ``folder/config.json`` describes, built by transformers on ``meta``."""
    model = _meta_model(folder)
    modules = dict(model.named_modules())
    roles = {name: _role(name, modules) for name in names}
    head = _module_name(modules, model.get_output_embeddings())
    embedding = _module_name(modules, model.get_input_embeddings())
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    tied_head = f"{head}.weight" if tied and head and f"{head}.weight" not in roles else None
    return Layout(roles, tied_head, embedding)


def _meta_model(folder: Path) -> Any:
    try:
        import torch
        import transformers
    except ImportError:
        raise CheckpointError("extract-lora needs transformers: pip install 'agentmerge[hf]'") from None
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{folder}: no config.json; the module types of the model come from it")
    try:
        config = transformers.AutoConfig.from_pretrained(folder)
        with torch.device("meta"):
            return transformers.AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    except (ValueError, KeyError, OSError, TypeError) as e:
        raise CheckpointError(
            f"{folder}: transformers cannot build this model from its config.json ({str(e).splitlines()[0]}); "
            "extract-lora needs an architecture transformers knows"
        ) from None


def _module_name(modules: dict[str, Any], module: Any) -> str | None:
    return next((name for name, m in modules.items() if m is module), None) if module is not None else None


def _role(name: str, modules: dict[str, Any]) -> Role:
    module, _, param = name.rpartition(".")
    owner = modules.get(module)
    if owner is None or param not in dict(owner.named_parameters(recurse=False)):
        return Role(name, module, "?", "unknown")
    kind = type(owner).__name__
    import torch

    if isinstance(owner, torch.nn.Linear):
        return Role(name, module, kind, "linear" if param == "weight" else "bias")
    return Role(name, module, kind, "module")


def adapter_key(role: Role, targets: set[str]) -> str:
    """Where a tensor saved whole goes in the adapter (LoRA factors are ``lora_keys``)."""
    if role.kind == "bias" and role.module in targets:
        return f"{PREFIX}{role.module}.base_layer.bias"
    return f"{PREFIX}{role.tensor}"


def lora_keys(module: str) -> tuple[str, str]:
    return f"{PREFIX}{module}.lora_A.weight", f"{PREFIX}{module}.lora_B.weight"


def adapter_config(
    base_ref: str, ranks: dict[str, int], saved_modules: Sequence[str], biases: bool, tied: bool
) -> dict[str, Any]:
    """``adapter_config.json``: one default rank (the most common), the others in ``rank_pattern``.

    ``lora_alpha`` equals each module's rank (``alpha_pattern`` mirrors ``rank_pattern``), so the scale
    ``alpha / r`` is 1 everywhere and ``Delta W = B @ A`` exactly as the factors were written.
    """
    r = Counter(ranks.values()).most_common(1)[0][0]
    pattern = {re.escape(m): k for m, k in sorted(ranks.items()) if k != r}
    cfg: dict[str, Any] = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_ref,
        "r": r,
        "lora_alpha": r,
        "rank_pattern": pattern,
        "alpha_pattern": dict(pattern),
        "target_modules": sorted(ranks),
        "modules_to_save": sorted(saved_modules) or None,
        "bias": "all" if biases else "none",
        "fan_in_fan_out": False,
        "lora_dropout": 0.0,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "layers_to_transform": None,
        "layers_pattern": None,
        "revision": None,
    }
    if tied:
        cfg["ensure_weight_tying"] = True
    return cfg


def write_adapter_config(folder: Path, cfg: dict[str, Any]) -> None:
    (folder / "adapter_config.json").write_text(jsontext.dumps(cfg, indent=2) + "\n")
