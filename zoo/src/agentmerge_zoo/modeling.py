"""The zoo's base architecture and checkpoint I/O: a tiny ``LlamaForCausalLM`` in ordinary HF folders.

A checkpoint folder holds ``model.safetensors`` (bfloat16 by default, like a released model; float32 for
agents whose recipe exports float32), ``config.json``,
``generation_config.json`` and the tokenizer files, so ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained`` read it. A ``zoo_stage.json`` written last marks the folder complete.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers

from agentmerge.api import dumps_json
from agentmerge_zoo.vocab import BOS_ID, EOS_ID, PAD_ID, build_tokenizer, char_vocab

AutoModelForCausalLM: Any = transformers.AutoModelForCausalLM
GenerationConfig: Any = transformers.GenerationConfig
LlamaConfig: Any = transformers.LlamaConfig
LlamaForCausalLM: Any = transformers.LlamaForCausalLM

STAGE_FILE = "zoo_stage.json"


@dataclass(frozen=True)
class ModelShape:
    """Size of the tiny base model."""

    hidden: int = 96
    layers: int = 4
    heads: int = 4
    intermediate: int = 256
    max_positions: int = 256


def llama_config(shape: ModelShape) -> Any:
    """A standard Llama config for the character vocabulary (tied embeddings, no biases)."""
    return LlamaConfig(
        vocab_size=len(char_vocab()),
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.heads,
        max_position_embeddings=shape.max_positions,
        tie_word_embeddings=True,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        rms_norm_eps=1e-5,
    )


def new_model(shape: ModelShape, seed: int) -> Any:
    """A freshly initialised float32 model; the seed fixes the initial weights."""
    torch.manual_seed(seed)
    return LlamaForCausalLM(llama_config(shape)).float()


def load_model(path: str | Path) -> Any:
    """Load any causal-LM checkpoint folder for float32 compute (bf16 weights are upcast exactly)."""
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    model.eval()
    return model


def round_to_bf16_(model: torch.nn.Module) -> None:
    """Round every parameter to the nearest bfloat16 value in place (kept in float32 for compute)."""
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(param.to(torch.bfloat16).to(param.dtype))


EXPORT_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp32": torch.float32}


def save_checkpoint(model: Any, out: Path, meta: dict[str, Any], export: str = "bf16") -> None:
    """Write a complete HF folder in ``export`` dtype (bf16 or fp32), then the stage marker (atomically)."""
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    copy = _typed_copy(model, EXPORT_DTYPES[export])
    copy.save_pretrained(str(tmp), safe_serialization=True)
    build_tokenizer().save_pretrained(str(tmp))
    GenerationConfig(
        bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID, do_sample=False, max_new_tokens=80
    ).save_pretrained(str(tmp))
    (tmp / STAGE_FILE).write_text(dumps_json(meta, indent=2, sort_keys=True) + "\n")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)


def _typed_copy(model: Any, dtype: torch.dtype) -> Any:
    config: Any = model.config
    copy = LlamaForCausalLM(config)
    copy.load_state_dict(model.state_dict())
    copy = copy.to(dtype)
    copy.config.dtype = dtype
    return copy


def is_complete(path: Path) -> bool:
    """True when a checkpoint folder was fully written (marker present and weights readable)."""
    return (path / STAGE_FILE).is_file() and (path / "model.safetensors").is_file()


def read_stage(path: Path) -> dict[str, Any]:
    """The metadata written with a checkpoint."""
    data: dict[str, Any] = json.loads((path / STAGE_FILE).read_text())
    return data
