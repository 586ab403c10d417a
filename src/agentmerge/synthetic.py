"""Synthetic model families (a base and RL-like agents) in real Hugging Face layouts, for demos, tests and benchmarks.

Weights are generated chunk by chunk from seeded generators and written with the streaming writer,
so a 7B-wide family needs no more memory than a tiny one. Each agent's task vector is RL-like:
sparse (a chosen density of elements moves) and stored in bf16, so that a small update that rounds
away is no update at all, as in real RL post-training.

    base    theta_0 ~ N(0, init_std)
    agent i theta_i = bf16(theta_0 + m_i * n_i),   m_i ~ Bernoulli(density_i),   n_i ~ N(0, delta_std)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from agentmerge.io.guards import jsontext
from agentmerge.io.output.shards import PlannedTensor, plan_shards
from agentmerge.io.output.writer import ShardWriter
from agentmerge.methods.deltas import RNG_BLOCK, seeded_uniform


@dataclass(frozen=True)
class Architecture:
    """A Qwen2-style decoder: enough to write a config.json that transformers loads."""

    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    tie_embeddings: bool = True

    def config(self, dtype: torch.dtype = torch.bfloat16) -> dict[str, object]:
        return {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "max_position_embeddings": 512,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "tie_word_embeddings": self.tie_embeddings,
            "hidden_act": "silu",
            "torch_dtype": str(dtype).removeprefix("torch."),
            "bos_token_id": 0,
            "eos_token_id": 1,
        }

    def tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        """Tensor names and shapes, as ``Qwen2ForCausalLM`` stores them."""
        h, kv = self.hidden, self.hidden // self.heads * self.kv_heads
        out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (self.vocab, h))]
        for i in range(self.layers):
            p = f"model.layers.{i}."
            out += [
                (p + "input_layernorm.weight", (h,)),
                (p + "self_attn.q_proj.weight", (h, h)),
                (p + "self_attn.q_proj.bias", (h,)),
                (p + "self_attn.k_proj.weight", (kv, h)),
                (p + "self_attn.k_proj.bias", (kv,)),
                (p + "self_attn.v_proj.weight", (kv, h)),
                (p + "self_attn.v_proj.bias", (kv,)),
                (p + "self_attn.o_proj.weight", (h, h)),
                (p + "post_attention_layernorm.weight", (h,)),
                (p + "mlp.gate_proj.weight", (self.intermediate, h)),
                (p + "mlp.up_proj.weight", (self.intermediate, h)),
                (p + "mlp.down_proj.weight", (h, self.intermediate)),
            ]
        out.append(("model.norm.weight", (h,)))
        if not self.tie_embeddings:
            out.append(("lm_head.weight", (self.vocab, h)))
        return out


SHAPES: dict[str, Architecture] = {
    "tiny": Architecture(vocab=96, hidden=32, intermediate=64, layers=2, heads=4, kv_heads=2),
    "qwen2.5-0.5b": Architecture(vocab=151936, hidden=896, intermediate=4864, layers=24, heads=14, kv_heads=2),
    "qwen2.5-1.5b": Architecture(vocab=151936, hidden=1536, intermediate=8960, layers=28, heads=12, kv_heads=2),
    "qwen2.5-7b-wide-2layer": Architecture(
        vocab=152064, hidden=3584, intermediate=18944, layers=2, heads=28, kv_heads=4, tie_embeddings=False
    ),
}


def _values(name: str, shape: tuple[int, ...], start: int, stop: int, seed: int, std: float) -> torch.Tensor:
    """Seeded normal draws for elements ``start:stop`` (Box-Muller on the block-seeded uniforms)."""
    u = seeded_uniform(seed, name, start, stop, 2)
    z = torch.sqrt(-2.0 * torch.log1p(-u[0])) * torch.cos(2 * torch.pi * u[1])
    if name.endswith("norm.weight"):
        return 1.0 + 0.1 * z
    return std * z


def write_model(
    folder: Path,
    arch: Architecture,
    *,
    seed: int,
    agent: int | None = None,
    density: float = 0.0,
    delta_std: float = 2e-3,
    init_std: float = 0.02,
    dtype: torch.dtype = torch.bfloat16,
    max_shard_size: int = 5 * 10**9,
    chunk: int = 4 * RNG_BLOCK,
) -> Path:
    """Write the base (``agent=None``) or agent ``agent`` of the family identified by ``seed``."""
    folder.mkdir(parents=True, exist_ok=True)
    planned = [PlannedTensor(n, dtype, s) for n, s in arch.tensors()]
    writer = ShardWriter(folder, plan_shards(planned, max_shard_size), planned)
    try:
        for t in planned:
            numel = t.nbytes // torch.empty((), dtype=dtype).element_size()
            for start in range(0, numel, chunk):
                stop = min(start + chunk, numel)
                w = _values(t.name, t.shape, start, stop, seed, init_std)
                if agent is not None:
                    w = w.to(dtype).float() + _agent_delta(t.name, start, stop, seed, agent, density, delta_std)
                writer.write(t.name, start, w.to(dtype))
    finally:
        writer.close()
    (folder / "config.json").write_text(jsontext.dumps(arch.config(dtype), indent=2) + "\n")
    (folder / "generation_config.json").write_text(jsontext.dumps({"bos_token_id": 0, "eos_token_id": 1}) + "\n")
    return folder


def _agent_delta(name: str, start: int, stop: int, seed: int, agent: int, density: float, std: float) -> torch.Tensor:
    u = seeded_uniform(seed * 1000 + agent + 1, name, start, stop, 3)
    z = torch.sqrt(-2.0 * torch.log1p(-u[1])) * torch.cos(2 * torch.pi * u[2])
    return torch.where(u[0] < density, std * z, 0.0)


def write_family(
    root: Path,
    arch: Architecture | str,
    densities: Sequence[float],
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    max_shard_size: int = 5 * 10**9,
    delta_std: float = 2e-3,
) -> tuple[Path, list[Path]]:
    """Write ``root/base`` and ``root/agent{i}`` (one per density); returns their folders."""
    spec = SHAPES[arch] if isinstance(arch, str) else arch
    base = write_model(root / "base", spec, seed=seed, dtype=dtype, max_shard_size=max_shard_size)
    agents = [
        write_model(
            root / f"agent{i}",
            spec,
            seed=seed,
            agent=i,
            density=d,
            dtype=dtype,
            max_shard_size=max_shard_size,
            delta_std=delta_std,
        )
        for i, d in enumerate(densities)
    ]
    return base, agents
