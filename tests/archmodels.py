"""Tiny models of the architectures users merge now, built from a config with transformers (float32, random init).

Qwen3 (q/k norms), Qwen3-MoE (per-expert tensors, router), Gemma 3 (scaled embeddings, tied head, sliding layers),
two vision-language models (Qwen2-VL: ``visual.*`` tower and merger; LLaVA: ``vision_tower.*`` and
``multi_modal_projector.*``) and three hybrids (Bamba: Mamba-2 and attention layers; LFM2: short convolutions and
attention; Qwen3-Next: gated delta-rule linear attention, full attention, MoE with a shared expert). All run on
CPU through transformers' PyTorch fallbacks (no custom kernels). Each family is a base and agents that are the base plus sparse updates on *every* floating tensor,
on disjoint element sets: RAM's merge is then exactly ``base + sum_i tau_i`` (each update is unique), a known
answer for every tensor, the vision tower's and the Mamba layers' included.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors.torch import load_file

from tinylm import tokenizer

DENSITY = 0.05  # fraction of each tensor's elements one agent updates
STEP = 0.05  # the size of an update


def _text(tok: Any, **extra: Any) -> dict[str, Any]:
    return {
        "vocab_size": len(tok),
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
        **extra,
    }


def _qwen2_vl(tok: Any) -> Any:
    text = _text(tok, rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 1e4})
    vision = {
        "depth": 1,
        "embed_dim": 16,
        "hidden_size": 32,
        "num_heads": 2,
        "mlp_ratio": 2,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    }
    ids = {"image_token_id": 5, "video_token_id": 6, "vision_start_token_id": 7, "vision_end_token_id": 8}
    return transformers.Qwen2VLConfig(text_config=text, vision_config=vision, **ids)


def _llava(tok: Any) -> Any:
    vision = transformers.CLIPVisionConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14
    )
    text = transformers.LlamaConfig(**_text(tok))
    return transformers.LlavaConfig(text_config=text, vision_config=vision, image_token_id=5)


def _bamba(tok: Any) -> Any:
    mamba = {"mamba_n_heads": 4, "mamba_d_head": 16, "mamba_d_state": 8, "mamba_n_groups": 1, "mamba_chunk_size": 16}
    return transformers.BambaConfig(**_text(tok), attn_layer_indices=[1], **mamba)


def _qwen3_next(tok: Any) -> Any:
    linear = {
        "linear_num_value_heads": 2,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 8,
    }
    moe = {
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 16,
    }
    layers = ["linear_attention", "full_attention"]
    return transformers.Qwen3NextConfig(**_text(tok, head_dim=8), layer_types=layers, **linear, **moe)


CONFIGS: dict[str, Callable[[Any], Any]] = {
    "qwen3": lambda tok: transformers.Qwen3Config(**_text(tok, head_dim=16), tie_word_embeddings=False),
    "qwen3_moe": lambda tok: transformers.Qwen3MoeConfig(
        **_text(tok, head_dim=8), num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16
    ),
    "gemma3": lambda tok: transformers.Gemma3TextConfig(
        **_text(tok, head_dim=8), sliding_window=4, layer_types=["sliding_attention", "full_attention"]
    ),
    "qwen2_vl": _qwen2_vl,
    "llava": _llava,
    "bamba": _bamba,
    "lfm2": lambda tok: transformers.Lfm2Config(**_text(tok), layer_types=["conv", "full_attention"]),
    "qwen3_next": _qwen3_next,
}
VISION = {"qwen2_vl": ("visual.",), "llava": ("vision_tower.", "multi_modal_projector.")}


def image_inputs(arch: str) -> dict[str, torch.Tensor]:
    """A prompt with one 28 x 28 image for a VLM of ``CONFIGS`` (image token id 5), as its processor would give."""
    g = torch.Generator().manual_seed(0)
    if arch == "qwen2_vl":  # 2 x 2 patches of 14 px, 2 frames, merged 2 x 2 into one image token between 7 and 8
        ids = torch.tensor([[10, 7, 5, 8, 11, 12]])
        pixels = torch.randn(4, 3 * 2 * 14 * 14, generator=g)
        return {
            "input_ids": ids,
            "pixel_values": pixels,
            "image_grid_thw": torch.tensor([[1, 2, 2]]),
            "mm_token_type_ids": (ids == 5).long(),
        }
    ids = torch.tensor([[10, 5, 5, 5, 5, 11, 12]])  # LLaVA: one token per 14 px patch, the class token dropped
    return {"input_ids": ids, "pixel_values": torch.randn(1, 3, 28, 28, generator=g)}


def model_class(arch: str) -> Any:
    """The class that loads the whole model (the vision tower too, for the VLMs)."""
    return transformers.AutoModelForImageTextToText if arch in VISION else transformers.AutoModelForCausalLM


def base_model(arch: str, folder: Path, seed: int = 0) -> Path:
    """A random ``arch`` model with the character tokenizer, saved with ``save_pretrained``."""
    tok = tokenizer()
    torch.manual_seed(seed)
    model = model_class(arch).from_config(CONFIGS[arch](tok))
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def tensors(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def write_like(base: Path, folder: Path, values: dict[str, torch.Tensor]) -> Path:
    """``folder``: ``base``'s config and tokenizer files with the weights ``values`` (one safetensors file)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    for f in base.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and not f.name.endswith(".index.json"):
            (folder / f.name).write_bytes(f.read_bytes())
    save_file(values, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def sparse_updates(base: dict[str, torch.Tensor], n: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """``n`` task vectors, each touching ``DENSITY`` of every floating tensor, on disjoint elements."""
    g = torch.Generator().manual_seed(seed)
    out: list[dict[str, torch.Tensor]] = [{} for _ in range(n)]
    for name, t in sorted(base.items()):
        if not t.dtype.is_floating_point:
            continue
        k = max(1, int(DENSITY * t.numel()))
        order = torch.randperm(t.numel(), generator=g)
        for i in range(n):
            tau = torch.zeros(t.numel())
            idx = order[i * k : (i + 1) * k]
            tau[idx] = STEP * (1 + torch.rand(len(idx), generator=g)) * torch.sign(torch.randn(len(idx), generator=g))
            out[i][name] = tau.view(t.shape)
    return out


def family(arch: str, root: Path, n: int = 2) -> tuple[Path, list[Path], list[dict[str, torch.Tensor]]]:
    """``root/base`` and ``root/agent{i}`` (base + sparse updates), and the updates."""
    base = base_model(arch, root / "base")
    weights = tensors(base)
    taus = sparse_updates(weights, n)
    agents = [
        write_like(base, root / f"agent{i}", {k: v + tau.get(k, 0) for k, v in weights.items()})
        for i, tau in enumerate(taus)
    ]
    return base, agents, taus
