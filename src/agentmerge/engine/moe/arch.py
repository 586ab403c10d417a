"""Dense decoders and their MoE counterparts in transformers: the config, and the output's tensor names.

- ``llama``, ``mistral`` -> ``MixtralForCausalLM``; per layer L (``P = model.layers.L.``):
  ``P block_sparse_moe.gate.weight`` ``[N, H]``, and for expert e ``P block_sparse_moe.experts.e.w1.weight``
  (the agent's gate_proj), ``w3`` (up_proj), ``w2`` (down_proj);
- ``qwen2`` -> ``Qwen2MoeForCausalLM``: ``P mlp.gate.weight`` ``[N, H]``,
  ``P mlp.experts.e.{gate,up,down}_proj.weight``, ``P mlp.shared_expert.{gate,up,down}_proj.weight``
  (intermediate size S; 0 without a shared expert) and ``P mlp.shared_expert_gate.weight`` ``[1, H]``;
- ``qwen3`` -> ``Qwen3MoeForCausalLM``: ``P mlp.gate.weight`` ``[N, H]`` and
  ``P mlp.experts.e.{gate,up,down}_proj.weight`` (no shared expert); the attention's ``q_norm`` / ``k_norm``
  and ``head_dim`` are kept as the dense model has them.

These are the names transformers' ``save_pretrained`` writes (5.x fuses the experts into 3-D tensors in memory and
converts them on load, 4.x reads them as they are). Every other tensor keeps its name. Both outputs renormalise
the top-k routing weights (Mixtral always; Qwen2-MoE and Qwen3-MoE with ``norm_topk_prob: true``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentmerge.errors import CheckpointError, MergeError

FAMILIES = {"llama": "mixtral", "mistral": "mixtral", "qwen2": "qwen2_moe", "qwen3": "qwen3_moe"}
ARCHITECTURES = {
    "mixtral": "MixtralForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}
PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
_MIXTRAL_NAMES = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
_MLP = re.compile(r"^(?P<prefix>.*\.layers\.(?P<layer>\d+)\.)mlp\.(?P<rest>.+)$")
_COMMON = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "max_position_embeddings",
    "initializer_range",
    "rms_norm_eps",
    "tie_word_embeddings",
    "rope_parameters",
    "sliding_window",
    "attention_dropout",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
)
_QWEN2 = ("use_sliding_window", "max_window_layers", "layer_types")
_QWEN3 = ("use_sliding_window", "attention_bias")


@dataclass(frozen=True)
class MoeNames:
    """Where the MoE parts of layer L are stored, for one output family."""

    family: str

    def gate(self, prefix: str) -> str:
        return prefix + ("block_sparse_moe.gate.weight" if self.family == "mixtral" else "mlp.gate.weight")

    def expert(self, prefix: str, e: int, proj: str) -> str:
        if self.family == "mixtral":
            return f"{prefix}block_sparse_moe.experts.{e}.{_MIXTRAL_NAMES[proj]}.weight"
        return f"{prefix}mlp.experts.{e}.{proj}.weight"

    def shared(self, prefix: str, proj: str) -> str:
        return f"{prefix}mlp.shared_expert.{proj}.weight"

    def shared_gate(self, prefix: str) -> str:
        return f"{prefix}mlp.shared_expert_gate.weight"

    @property
    def has_shared(self) -> bool:
        return self.family == "qwen2_moe"


def mlp_tensor(name: str) -> tuple[str, int, str] | None:
    """``(layer prefix, layer, projection)`` of a dense MLP weight; None for a tensor outside every MLP.

    An MLP tensor other than the three projection weights (a bias) has no place in an expert: refused.
    """
    m = _MLP.match(name)
    if m is None:
        return None
    rest = m["rest"]
    proj = rest.removesuffix(".weight")
    if proj not in PROJECTIONS or not rest.endswith(".weight"):
        raise MergeError(f"tensor {name!r}: the MoE experts hold only gate_proj, up_proj and down_proj weights")
    return m["prefix"], int(m["layer"]), proj


def moe_family(config: dict[str, Any], folder: Path) -> str:
    """``mixtral`` or ``qwen2_moe`` for a dense config; one clear line for anything else."""
    model_type = config.get("model_type")
    if model_type not in FAMILIES:
        raise CheckpointError(
            f"{folder}: model_type {model_type!r} has no MoE counterpart in transformers that agentmerge writes "
            "(Llama and Mistral become MixtralForCausalLM, Qwen2 Qwen2MoeForCausalLM, Qwen3 Qwen3MoeForCausalLM)"
        )
    if model_type == "llama" and (config.get("attention_bias") or config.get("mlp_bias")):
        raise CheckpointError(
            f"{folder}: this Llama has attention or MLP biases, which MixtralForCausalLM does not have"
        )
    if model_type == "qwen3" and config.get("use_sliding_window"):
        raise CheckpointError(
            f"{folder}: this Qwen3 slides its attention window from layer max_window_layers on, which "
            "Qwen3MoeForCausalLM cannot express (it slides on every layer or none)"
        )
    return FAMILIES[str(model_type)]


def moe_config(dense: Any, family: str, experts: int, per_token: int, shared_size: int, dtype: str) -> Any:
    """The transformers config object of the MoE output, from the dense config object ``dense``."""
    import transformers

    values = {k: getattr(dense, k) for k in _COMMON if getattr(dense, k, None) is not None}
    values["dtype"] = dtype
    if family == "mixtral":
        return transformers.MixtralConfig(
            **values, num_local_experts=experts, num_experts_per_tok=per_token, architectures=[ARCHITECTURES[family]]
        )
    if family == "qwen3_moe":
        return _qwen3_moe(dense, values, experts, per_token)
    values.update({k: getattr(dense, k) for k in _QWEN2 if getattr(dense, k, None) is not None})
    return transformers.Qwen2MoeConfig(
        **values,
        num_experts=experts,
        num_experts_per_tok=per_token,
        moe_intermediate_size=dense.intermediate_size,
        shared_expert_intermediate_size=shared_size,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        qkv_bias=True,
        architectures=[ARCHITECTURES[family]],
    )


def _qwen3_moe(dense: Any, values: dict[str, Any], experts: int, per_token: int) -> Any:
    """Qwen3-MoE: every layer sparse, each expert of the dense MLP's size, top-k weights renormalised."""
    import transformers

    values.update({k: getattr(dense, k) for k in _QWEN3 if getattr(dense, k, None) is not None})
    return transformers.Qwen3MoeConfig(
        **values,
        num_experts=experts,
        num_experts_per_tok=per_token,
        moe_intermediate_size=dense.intermediate_size,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        architectures=[ARCHITECTURES["qwen3_moe"]],
    )


def modeling_classes(family: str) -> tuple[Any, Any, Any]:
    """transformers' ``(Attention, RMSNorm, RotaryEmbedding)`` classes of the MoE family (the router calibration
    runs the attention the output will run)."""
    if family == "mixtral":
        from transformers.models.mixtral import modeling_mixtral as m

        return m.MixtralAttention, m.MixtralRMSNorm, m.MixtralRotaryEmbedding
    if family == "qwen3_moe":
        from transformers.models.qwen3_moe import modeling_qwen3_moe as q3

        return q3.Qwen3MoeAttention, q3.Qwen3MoeRMSNorm, q3.Qwen3MoeRotaryEmbedding
    from transformers.models.qwen2_moe import modeling_qwen2_moe as q

    return q.Qwen2MoeAttention, q.Qwen2MoeRMSNorm, q.Qwen2MoeRotaryEmbedding
