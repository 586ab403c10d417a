"""Router weights without training, from the hidden states of each agent's example prompts (``hidden`` mode).

The prompts run through the MoE being written, one layer at a time, with the weights as they are written
(the output dtype's values): layer L's router is made from the inputs its MLP block sees, after layers
``0..L-1`` (with their routers) are fixed. For expert i with prompt tokens ``t`` and router inputs ``x_t``
(the post-attention-norm hidden state) at layer L:

    m_i   = mean_t  x_t / ||x_t||                         the mean direction of agent i's tokens
    d_i   = m_i / ||m_i||
    row_i = c * (d_i - mean_j d_j)                        router weight row i   [N, H]

so the router picks the expert whose mean direction is nearest (cosine) to the token's state; subtracting the
common part changes no routing or softmax weight but keeps the logits small, which a bf16 router needs. The
scale ``c`` makes the mean margin of an agent's own logit over the best other one, on its own tokens, equal to
``router_margin`` (4: the own expert takes about 98 % of a top-2 mix on a typical token). The share of each
agent's tokens whose top-1 expert is its own ("own share") is recorded per layer.

An MoE block then computes, per token, ``softmax`` over the logits, the top ``k`` experts, their weights
renormalised to sum to 1, and ``sum_k w_k E_k(x)`` (plus ``sigmoid(g . x) S(x)`` for a Qwen2-MoE shared expert),
exactly as transformers' Mixtral and Qwen2-MoE blocks do; that output moves the prompts on to layer L + 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from agentmerge.engine.moe.arch import modeling_classes

MAX_TOKENS = 512  # tokens of one prompt used for the router


@dataclass(frozen=True)
class Router:
    """One layer's router: weight rows, the scale that set them, and the own share of each agent's tokens."""

    rows: torch.Tensor  # [N, H] float32
    scale: float
    own_share: tuple[float, ...]


def router_rows(inputs: Sequence[torch.Tensor], margin: float) -> Router:
    """The router of one layer from each agent's router inputs ``inputs[i]`` ``[T_i, H]`` (module docstring)."""
    means = torch.stack([(x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)).mean(0) for x in inputs])
    directions = means / means.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    rows = directions - directions.mean(0, keepdim=True)
    margins = torch.cat([_margins(x @ rows.T, i) for i, x in enumerate(inputs)])
    mean = float(margins.mean())
    spread = float(margins.abs().mean())
    scale = margin / mean if mean > 0 else (margin / spread if spread > 0 else 1.0)
    rows = rows * scale
    share = tuple(float(((x @ rows.T).argmax(-1) == i).float().mean()) for i, x in enumerate(inputs))
    return Router(rows, scale, share)


def _margins(logits: torch.Tensor, own: int) -> torch.Tensor:
    others = torch.cat([logits[:, :own], logits[:, own + 1 :]], dim=1)
    return logits[:, own] - others.max(dim=1).values


def route(x: torch.Tensor, rows: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(experts [T, k], weights [T, k])``: top-k of the softmax over ``x @ rows^T``, renormalised."""
    probs = torch.softmax(x @ rows.T, dim=-1)
    top, index = torch.topk(probs, k, dim=-1)
    return index, top / top.sum(dim=-1, keepdim=True)


def mlp(
    x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, act: Callable[..., Any]
) -> torch.Tensor:
    """A gated MLP ``down(act(gate x) * up x)`` in float32."""
    out: torch.Tensor = F.linear(act(F.linear(x, gate)) * F.linear(x, up), down)
    return out


class Calibration:
    """Each agent's prompts as hidden states, moved through the MoE one layer at a time (module docstring)."""

    def __init__(self, tokens: Sequence[Sequence[list[int]]], config: Any, family: str) -> None:
        self.tokens = [[t[:MAX_TOKENS] for t in prompts] for prompts in tokens]
        self.config = config
        attention, norm, rotary = modeling_classes(family)
        self._attention, self._norm = attention, norm
        self._rotary = rotary(config)
        self.states: list[list[torch.Tensor]] = []  # per agent, per prompt: [1, T, H]
        self._residual: list[list[torch.Tensor]] = []
        from transformers.activations import ACT2FN

        self.act = ACT2FN[config.hidden_act]

    def embed(self, rows: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Start from the embedding rows of the prompts' tokens (``rows(ids)`` -> ``[T, H]`` float32)."""
        self.states = [[rows(torch.tensor(t))[None] for t in prompts] for prompts in self.tokens]

    def attend(self, layer: int, weights: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """Run layer ``layer``'s attention half; returns each agent's router inputs ``[T_i, H]`` (all its tokens).

        ``weights``: the layer's ``self_attn.*``, ``input_layernorm.weight`` and ``post_attention_layernorm.weight``.
        """
        attention = self._attention(self.config, layer).float()
        attention.load_state_dict({k.removeprefix("self_attn."): v for k, v in weights.items() if "self_attn." in k})
        before, after = self._norm(self.config.hidden_size, eps=self.config.rms_norm_eps), None
        before.load_state_dict({"weight": weights["input_layernorm.weight"]})
        after = self._norm(self.config.hidden_size, eps=self.config.rms_norm_eps)
        after.load_state_dict({"weight": weights["post_attention_layernorm.weight"]})
        inputs, self._residual = [], []
        with torch.no_grad():
            for prompts in self.states:
                residual = [x + self._attend(attention, before(x)) for x in prompts]
                self._residual.append(residual)
                inputs.append(torch.cat([after(h)[0] for h in residual]))
        return inputs

    def _attend(self, attention: Any, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        positions = torch.arange(n)[None]
        cos, sin = self._rotary(x, positions)
        mask = torch.full((n, n), torch.finfo(torch.float32).min).triu(1)[None, None]
        out = attention(hidden_states=x, position_embeddings=(cos, sin), attention_mask=mask)[0]
        return out  # type: ignore[no-any-return]

    def advance(self, outputs: list[torch.Tensor]) -> None:
        """Add each agent's MLP-block outputs ``[T_i, H]`` (its prompts' tokens in order) to the residual stream."""
        states = []
        for residual, out in zip(self._residual, outputs, strict=True):
            pieces = torch.split(out, [h.shape[1] for h in residual])
            states.append([h + piece[None] for h, piece in zip(residual, pieces, strict=True)])
        self.states, self._residual = states, []
