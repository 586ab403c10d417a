"""Tiny Llama families where agents resize their vocabulary (``resize_token_embeddings``), for the vocab tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors.torch import load_file, save_file

from tinylm import CHAT, llama_config, tokenizer

VOCAB_TENSORS = ("model.embed_tokens.weight", "lm_head.weight")


def base_model(folder: Path, seed: int = 0, eos: int | None = None, chat_template: str | None = CHAT) -> Path:
    """A random bf16 Llama (hidden 16, one layer) with the character tokenizer of ``tinylm``."""
    tok = tokenizer(chat_template)
    cfg = llama_config(tok, eos)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def agent(
    base: Path,
    folder: Path,
    seed: int,
    added: tuple[str, ...] = (),
    density: float = 0.4,
    dtype: torch.dtype = torch.bfloat16,
) -> Path:
    """The base with a sparse random update (``density`` of the elements), after adding ``added`` tokens."""
    model: Any = transformers.AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
    tok: Any = transformers.AutoTokenizer.from_pretrained(base)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            keep = torch.rand(p.shape, generator=gen) < density
            p.add_(torch.randn(p.shape, generator=gen) * 0.05 * keep)
    if added:
        tok.add_tokens(list(added))
        model.resize_token_embeddings(len(tok), mean_resizing=False)
        with torch.no_grad():
            for t in (model.model.embed_tokens.weight, model.lm_head.weight):
                rows = t[-len(added) :]
                rows.copy_(torch.randn(rows.shape, generator=gen))
    model.to(dtype).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def truncated(agent_dir: Path, folder: Path, rows: int) -> Path:
    """A copy of an agent with its vocabulary tensors cut to the first ``rows`` rows (config.json to match)."""
    folder.mkdir(parents=True)
    tensors = load_file(agent_dir / "model.safetensors")
    cut = {n: (t[:rows].clone() if n in VOCAB_TENSORS else t) for n, t in tensors.items()}
    save_file(cut, folder / "model.safetensors", metadata={"format": "pt"})
    cfg = json.loads((agent_dir / "config.json").read_text())
    cfg["vocab_size"] = rows
    (folder / "config.json").write_text(json.dumps(cfg))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (agent_dir / name).exists():
            shutil.copy(agent_dir / name, folder / name)
    return folder


def tensors(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out
