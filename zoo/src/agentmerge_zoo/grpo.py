"""An on-policy GRPO-style RL loop with verifiable rewards and bfloat16 weight storage.

Each step samples ``prompts_per_step`` prompts of the agent's domain, draws ``group_size`` completions per prompt
at temperature 1, scores them with the task verifier, normalises rewards within each group (mean 0, std 1;
groups with equal rewards carry no signal), and takes one policy-gradient step on
``-mean_i A_i * mean_t log p(token_t)`` (a single on-policy update per batch, so the PPO ratio is 1 and no
clipping or KL term is needed).

Weight storage: the weights live in bfloat16, as in RL post-training that keeps bf16 parameters. After every
optimiser step each parameter is rounded to the nearest bf16 value (the update is computed in float32 from the
bf16 weights; AdamW's moment estimates stay in float32). An update smaller than half a bf16 ulp of the weight is
therefore lost rather than accumulated, which is what makes RL task vectors sparse. ``storage="fp32_master"``
keeps unrounded float32 weights instead, as trainers with float32 master weights (verl) do. ``export`` is the
dtype of the saved checkpoint: ``bf16`` rounds once at save (verl's converter), ``fp32`` keeps the master
weights (as the paper's tool agent was released). Precision is a recipe axis of the zoo (see ``config.py``).

A training can be continued exactly (``grpo_run(resume=...)``, :class:`TrainState`): the learning rate is
constant, so continuing an N-step training to M steps from its saved weights, AdamW state, RNG state and stream
position gives the same weights as training M steps at once (``tests/zoo/test_converge.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from agentmerge_zoo.batching import completion_mask, decode_completions, position_ids
from agentmerge_zoo.generation import generate_ids
from agentmerge_zoo.modeling import round_to_bf16_
from agentmerge_zoo.splits import train_stream
from agentmerge_zoo.taskbase import Example
from agentmerge_zoo.tasks import training_task

STORAGES = ("bf16", "fp32_master")
EXPORTS = ("bf16", "fp32")


@dataclass(frozen=True)
class Recipe:
    """One team's RL recipe for one domain (written as recipe.json next to the agent)."""

    domain: str
    team: str
    lr: float
    steps: int
    prompts_per_step: int
    group_size: int
    temperature: float = 1.0
    reward: str = "strict"
    beta1: float = 0.9
    beta2: float = 0.99
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    storage: str = "bf16"
    export: str = "bf16"

    def __post_init__(self) -> None:
        if self.storage not in STORAGES:
            raise ValueError(f"storage must be one of {STORAGES}, not {self.storage!r}")
        if self.export not in EXPORTS:
            raise ValueError(f"export must be one of {EXPORTS}, not {self.export!r}")

    def training_dict(self) -> dict[str, Any]:
        """The settings that determine the trained weights (everything but the export dtype)."""
        data = asdict(self)
        del data["export"]
        return data

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def group_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(r - group mean) / (group std + 1e-6), flattened back; zero where a group has no spread."""
    grouped = rewards.view(-1, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, keepdim=True, unbiased=False)
    return (centred / (std + 1e-6)).view(-1)


def _rewards(domain: str, reward: str, prompts: list[str], completions: list[str]) -> torch.Tensor:
    task = training_task(domain)
    values: list[float] = []
    for prompt, text in zip(prompts, completions, strict=True):
        scores = task.score(prompt, text)
        values.append(scores[task.metrics[-1 if reward == "partial" else 0]])
    return torch.tensor(values, dtype=torch.float32)


def _policy_loss(
    model: Any, batch: dict[str, torch.Tensor], completion: torch.Tensor, adv: torch.Tensor, eos_id: int
) -> torch.Tensor:
    """-mean over sequences of advantage x mean token log-probability of the sampled completion."""
    cmask = completion_mask(completion, eos_id)
    ids = torch.cat([batch["input_ids"], completion], dim=1)
    mask = torch.cat([batch["attention_mask"], cmask], dim=1)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).logits
    width = batch["input_ids"].shape[1]
    logp = torch.log_softmax(logits[:, width - 1 : -1].float(), dim=-1)
    token_logp = logp.gather(-1, completion.unsqueeze(-1)).squeeze(-1)
    per_seq = (token_logp * cmask).sum(dim=1) / cmask.sum(dim=1).clamp(min=1)
    return -(adv * per_seq).mean()


@dataclass
class TrainState:
    """Where a training stopped, enough to continue it exactly: the float32 weights, AdamW's state, torch's RNG
    state and the per-step log (the training stream is replayed to its position: ``steps * prompts_per_step``)."""

    steps: int
    weights: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    rng: torch.Tensor
    history: list[dict[str, float]]

    def save(self, path: Path) -> None:
        """Write the state whole (a temporary file renamed), so a killed process leaves no torn file."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        data = {"steps": self.steps, "weights": self.weights, "optimizer": self.optimizer, "rng": self.rng}
        torch.save(data | {"history": self.history}, tmp)
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> TrainState:
        data = torch.load(path, weights_only=True)
        return cls(int(data["steps"]), data["weights"], data["optimizer"], data["rng"], list(data["history"]))


def grpo_train(
    model: Any,
    tokenizer: Any,
    recipe: Recipe,
    seed: int,
    exclude: frozenset[str],
    log: Callable[[str], None] = lambda _msg: None,
) -> list[dict[str, float]]:
    """Run the recipe on ``model`` in place; returns a per-step log (mean reward, signal fraction, time)."""
    return grpo_run(model, tokenizer, recipe, seed, exclude, log).history


def grpo_run(
    model: Any,
    tokenizer: Any,
    recipe: Recipe,
    seed: int,
    exclude: frozenset[str],
    log: Callable[[str], None] = lambda _msg: None,
    resume: TrainState | None = None,
) -> TrainState:
    """Train ``model`` in place up to ``recipe.steps``, from scratch or from ``resume`` (a state of the same
    recipe and seed at fewer steps: the result equals training the whole recipe at once); returns the end state."""
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=recipe.lr,
        betas=(recipe.beta1, recipe.beta2),
        weight_decay=recipe.weight_decay,
    )
    task = training_task(recipe.domain)
    stream = train_stream({recipe.domain: 1.0}, seed, f"rl-{recipe.domain}-{recipe.team}", exclude)
    history: list[dict[str, float]] = []
    if resume is not None:
        if resume.steps > recipe.steps:
            raise ValueError(f"cannot continue a {resume.steps}-step training to {recipe.steps} steps")
        model.load_state_dict(resume.weights)
        opt.load_state_dict(resume.optimizer)
        torch.set_rng_state(resume.rng)
        history = list(resume.history)
        for _ in range(resume.steps * recipe.prompts_per_step):
            next(stream)
    offset = history[-1]["seconds"] if history else 0.0
    started = time.perf_counter()
    for step in range(len(history), recipe.steps):
        signal, reward = _grpo_step(
            model, tokenizer, recipe, task, [next(stream) for _ in range(recipe.prompts_per_step)], opt
        )
        row = {"step": step + 1, "reward": reward, "signal": signal}
        row["seconds"] = offset + time.perf_counter() - started
        history.append(row)
        if (step + 1) % 10 == 0 or step + 1 == recipe.steps:
            recent = history[-10:]
            mean_r = sum(r["reward"] for r in recent) / len(recent)
            log(f"rl {recipe.domain} step {step + 1}/{recipe.steps} reward {mean_r:.3f} signal {signal:.2f}")
    model.eval()
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return TrainState(recipe.steps, weights, opt.state_dict(), torch.get_rng_state(), history)


def _grpo_step(
    model: Any, tokenizer: Any, recipe: Recipe, task: Any, examples: list[Example], opt: torch.optim.Optimizer
) -> tuple[float, float]:
    """One on-policy step: sample the groups, score them, one update when some group has spread."""
    prompts = [ex.prompt for ex in examples for _ in range(recipe.group_size)]
    model.eval()
    batch, completion = generate_ids(
        model, tokenizer, prompts, task.max_new_tokens, sample=True, temperature=recipe.temperature
    )
    texts = decode_completions(tokenizer, completion, tokenizer.eos_token_id)
    rewards = _rewards(recipe.domain, recipe.reward, prompts, texts)
    adv = group_advantages(rewards, recipe.group_size)
    signal = float((rewards.view(-1, recipe.group_size).std(dim=1) > 0).float().mean())
    if signal > 0:
        model.train()
        loss = _policy_loss(model, batch, completion, adv, tokenizer.eos_token_id)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
        opt.step()
        if recipe.storage == "bf16":
            round_to_bf16_(model)
    return signal, float(rewards.mean())
