"""Tiny dense Llama / Qwen2 / Qwen3 families (float32, character tokenizer) for the MoE and LoRA-extraction tests.

Each agent has its own token group (agent 0 digits, agent 1 lower-case letters, agent 2 upper-case letters), and
the base's embedding rows of a group share a strong direction of their own, as if pretraining had taught the
model that the groups mean different things: the agents' prompts then have clearly different hidden states.
The agents are the base plus noise on their MLPs (and, if asked, on everything else).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers

from tinylm import tokenizer

GROUPS = ("0123456789", "abcdefghij", "ABCDEFGHIJ")
PROMPTS = (  # each agent's prompts, from its own group only
    ["0123", "98765", "42", "77771", "314159"],
    ["abc", "hedge", "figjade", "digabed", "cab"],
    ["ABC", "HIDE", "BADCAFE", "JIG", "FACE"],
)


def config(arch: str, tok: Any, intermediate: int = 48) -> Any:
    common = {
        "vocab_size": len(tok),
        "hidden_size": 32,
        "intermediate_size": intermediate,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
    }
    if arch == "llama":
        return transformers.LlamaConfig(**common, tie_word_embeddings=False)
    if arch == "qwen3":  # q/k norms, a head_dim other than hidden / heads
        return transformers.Qwen3Config(**common, head_dim=16, tie_word_embeddings=True)
    return transformers.Qwen2Config(**common, tie_word_embeddings=True)


def base_model(arch: str, seed: int = 0, intermediate: int = 48) -> tuple[Any, Any]:
    """A random base whose token groups' embeddings carry a group direction each."""
    tok = tokenizer()
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config(arch, tok, intermediate))
    g = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        for group in GROUPS:
            direction = torch.randn(emb.shape[1], generator=g)
            ids = tok.convert_tokens_to_ids(list(group))
            emb[ids] += 0.2 * direction
    return model, tok


def save(model: Any, tok: Any, folder: Path) -> Path:
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def agent(base: Any, seed: int, mlp: float = 0.05, other: float = 0.0) -> Any:
    """The base plus N(0, mlp^2) on its MLP weights and N(0, other^2) on every other tensor."""
    model = transformers.AutoModelForCausalLM.from_config(base.config)
    model.load_state_dict(base.state_dict())
    g = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            std = mlp if ".mlp." in name else other
            if std:
                p.add_(torch.randn(p.shape, generator=g) * std)
    return model


def family(root: Path, arch: str, n: int = 2, *, other: float = 0.0, seed: int = 0) -> tuple[Path, list[Path]]:
    """``root/base`` and ``root/agent{i}``, each a transformers folder with the tokenizer."""
    model, tok = base_model(arch, seed)
    base = save(model, tok, root / "base")
    agents = [save(agent(model, seed * 10 + i, other=other), tok, root / f"agent{i}") for i in range(n)]
    return base, agents


def moe_dict(base: Path, agents: list[Path], **settings: Any) -> dict[str, Any]:
    """A moe config with each agent's prompts from its own token group."""
    experts = [{"path": str(a), "prompts": PROMPTS[i]} for i, a in enumerate(agents)]
    return {"base": str(base), "experts": experts, **settings}
