"""GRPO for a Hugging Face causal LM, full fine-tuning: one step of group sampling, rewards and a policy gradient.

Each step takes ``prompts_per_step`` prompts of the agent's skill, samples ``group_size`` completions of each at
``temperature`` (``sampling.sample_group``: the prompt runs once and its cache is shared by the group), scores
them with the skill's verifier, and normalises the rewards within each group,
``A_i = (r_i - mean_g r) / (std_g r + 1e-6)`` (a group whose rewards are all equal carries no signal and is
skipped: no forward, no backward). The loss is the plain on-policy policy gradient

    L = -(1 / P) sum_groups (1 / G) sum_i A_i * (1 / |y_i|) sum_t log pi_T(y_i,t | x, y_i,<t)

where pi_T = softmax(logits / T) is the distribution the completions were sampled from (verl's convention), so
the gradient is on-policy at any ``temperature``; with one optimiser step per batch, the PPO ratio is 1 and
clipping has nothing to clip; there is no KL term (KL-free, as DAPO and Dr. GRPO). The training forward also
shares the prompt: it runs once with gradients, its cache repeated over the group, so the gradient through the
prompt's keys and values is exact.

Precision (``storage``): ``fp32_master`` keeps float32 weights and AdamW state, the forward and backward under
bfloat16 autocast when ``autocast`` (verl's regime: bf16 compute, fp32 master weights, exported bf16);
``bf16`` rounds every weight to the nearest bfloat16 value after each optimiser step (bf16 weight storage: an
update below half a bf16 ulp is lost, the sparse task vectors of the paper's agents).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from agentmerge_zoo.grpo import group_advantages
from agentmerge_zoo.modeling import round_to_bf16_
from agentmerge_zoo.real.sampling import completion_mask, decode, prompt_ids, sample_group
from agentmerge_zoo.real.suite import skill
from agentmerge_zoo.real.tasks import Example

STORAGES = ("fp32_master", "bf16")
EXPORTS = ("bf16", "fp32")
REWARDS = ("partial", "strict")


@dataclass(frozen=True)
class Recipe:
    """One agent's GRPO recipe (written next to the agent)."""

    skill: str
    lr: float
    steps: int
    prompts_per_step: int = 2
    group_size: int = 8
    max_new_tokens: int = 0  # 0: the skill's own
    temperature: float = 1.0
    reward: str = "partial"
    storage: str = "fp32_master"
    export: str = "bf16"
    autocast: bool = True
    beta1: float = 0.9
    beta2: float = 0.99
    weight_decay: float = 0.0
    grad_clip: float = 1.0

    def __post_init__(self) -> None:
        for value, allowed, what in (
            (self.storage, STORAGES, "storage"),
            (self.export, EXPORTS, "export"),
            (self.reward, REWARDS, "reward"),
        ):
            if value not in allowed:
                raise ValueError(f"{what} must be one of {allowed}, not {value!r}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 (GRPO samples its groups), not {self.temperature!r}")

    @property
    def new_tokens(self) -> int:
        return self.max_new_tokens or skill(self.skill).max_new_tokens

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def make_optimizer(model: Any, recipe: Recipe) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        model.parameters(), lr=recipe.lr, betas=(recipe.beta1, recipe.beta2), weight_decay=recipe.weight_decay
    )


def policy_loss(
    model: Any,
    prompt: Sequence[int],
    completions: torch.Tensor,
    adv: torch.Tensor,
    eos_id: int,
    autocast: bool,
    temperature: float = 1.0,
) -> torch.Tensor:
    """``-(1/G) sum_i A_i * mean_t log pi_T(y_i,t)`` for one group, the prompt run once (see the module docstring)."""
    mask = completion_mask(completions, eos_id)
    width = int(mask.sum(dim=1).max())
    completions, mask = completions[:, :width], mask[:, :width]
    n = completions.shape[0]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(input_ids=torch.tensor([list(prompt)]), use_cache=True, logits_to_keep=1)
        first = out.logits[:, -1:].expand(n, 1, -1)
        if width > 1:
            cache = out.cache
            cache.batch_repeat_interleave(n)
            rest = model(input_ids=completions[:, :-1], cache=cache, use_cache=True).logits
            first = torch.cat([first, rest], dim=1)
    logp = torch.log_softmax(first.float() / temperature, dim=-1).gather(-1, completions.unsqueeze(-1)).squeeze(-1)
    per_seq = (logp * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    return -(adv * per_seq).mean()


def grpo_step(
    model: Any,
    tokenizer: Any,
    opt: torch.optim.Optimizer,
    recipe: Recipe,
    examples: Sequence[Example],
    generator: torch.Generator,
) -> dict[str, float]:
    """Sample, score, update; returns the step's row of the reward curve."""
    task, eos = skill(recipe.skill), int(tokenizer.eos_token_id)
    started = time.perf_counter()
    model.eval()
    groups, strict, partial, tokens = [], [], [], 0
    for ex in examples:
        ids = prompt_ids(tokenizer, ex.messages())
        comp = sample_group(model, ids, recipe.group_size, recipe.new_tokens, eos, recipe.temperature, generator)
        scores = [task.score(ex, text) for text in decode(tokenizer, comp, eos)]
        strict += [s["strict"] for s in scores]
        partial += [s["partial"] for s in scores]
        tokens += int(completion_mask(comp, eos).sum())
        groups.append((ids, comp, torch.tensor([s[recipe.reward] for s in scores], dtype=torch.float32)))
    sampled = time.perf_counter()
    signal = [(ids, comp, group_advantages(r, recipe.group_size)) for ids, comp, r in groups if float(r.std()) > 0]
    if signal:
        model.train()
        opt.zero_grad(set_to_none=True)
        for ids, comp, adv in signal:
            loss = policy_loss(model, ids, comp, adv, eos, recipe.autocast, recipe.temperature) / len(groups)
            loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
        opt.step()
        if recipe.storage == "bf16":
            round_to_bf16_(model)
        model.eval()
    return {
        "reward": sum(partial if recipe.reward == "partial" else strict) / len(strict),
        "strict": sum(strict) / len(strict),
        "partial": sum(partial) / len(partial),
        "signal": len(signal) / len(groups),
        "tokens": float(tokens),
        "sample_seconds": sampled - started,
        "train_seconds": time.perf_counter() - sampled,
    }
