"""GRPO on a Hugging Face causal LM: the shared-prompt loss against a full-sequence reference, group sampling,
updates only with a signal, bf16 storage, export, and a resumed run equal to an uninterrupted one."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentmerge_zoo.real import grpo_hf, suite, train
from agentmerge_zoo.real.grpo_hf import Recipe, grpo_step, make_optimizer, policy_loss
from agentmerge_zoo.real.sampling import completion_mask, prompt_ids, sample_group
from agentmerge_zoo.real.tasks import Example, strict_partial
from agentmerge_zoo.real.tiny import make_tiny_base

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_base(tmp_path_factory.mktemp("tiny") / "base")


@dataclass(frozen=True)
class VowelSkill:
    """A test double of a skill: the reward is the share of vowels in the completion (varies between samples)."""

    name: str = "memory"
    max_new_tokens: int = 8

    def sample(self, rng: random.Random) -> Example:
        return suite.SKILLS["capitals"].sample(rng)

    def score(self, example: Example, completion: str) -> dict[str, float]:
        share = sum(c in "aeiou" for c in completion) / max(1, len(completion))
        return strict_partial(share > 0.3, share)


@dataclass(frozen=True)
class ConstantSkill(VowelSkill):
    def score(self, example: Example, completion: str) -> dict[str, float]:
        return strict_partial(False, 0.5)


def _load(base: Path) -> tuple[Any, Any]:
    return AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32), AutoTokenizer.from_pretrained(
        str(base)
    )


def _reference_loss(
    model: Any, prompt: list[int], comps: torch.Tensor, adv: torch.Tensor, eos: int, temperature: float = 1.0
) -> torch.Tensor:
    """Each completion run with its whole prompt, one sequence at a time, log-probabilities of softmax(z / T)."""
    mask = completion_mask(comps, eos)
    terms = []
    for row, m, a in zip(comps, mask, adv, strict=True):
        ids = torch.tensor([prompt + row.tolist()])
        logp = torch.log_softmax(model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature, dim=-1)
        token = logp.gather(-1, row.unsqueeze(-1)).squeeze(-1)
        terms.append(a * (token * m).sum() / m.sum())
    return -torch.stack(terms).mean()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_shared_prompt_loss_and_gradient_match_the_full_sequence_reference(base: Path, temperature: float) -> None:
    model, tok = _load(base)
    eos = int(tok.eos_token_id)
    prompt = prompt_ids(tok, [{"role": "user", "content": "What is the capital of France?"}])
    comps = torch.randint(5, 100, (4, 6))
    comps[0, 2], comps[1, 0] = eos, eos  # completions that end early (the rest is padding)
    adv = torch.tensor([1.0, -0.5, 0.25, -0.75])
    loss = policy_loss(model, prompt, comps, adv, eos, autocast=False, temperature=temperature)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    ref = _reference_loss(model, prompt, comps, adv, eos, temperature)
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), abs=1e-5)
    for name, p in model.named_parameters():
        assert torch.allclose(grads[name], p.grad, atol=1e-5), name  # the gradient through the shared prompt too


def test_sample_group_greedy_equals_generate_and_sampling_follows_the_generator(base: Path) -> None:
    model, tok = _load(base)
    eos = int(tok.eos_token_id)
    prompt = prompt_ids(tok, [{"role": "user", "content": "Name the capital city of Peru."}])
    greedy = sample_group(model, prompt, 2, 10, eos, temperature=0.0)
    ref = model.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False, eos_token_id=eos, pad_token_id=eos)
    assert greedy[0].tolist() == greedy[1].tolist() == ref[0, len(prompt) :].tolist()[: greedy.shape[1]]
    one = sample_group(model, prompt, 3, 10, eos, 1.0, torch.Generator().manual_seed(5))
    two = sample_group(model, prompt, 3, 10, eos, 1.0, torch.Generator().manual_seed(5))
    assert torch.equal(one, two)
    after_end = (completion_mask(one, eos) == 0) & (one != eos)
    assert not bool(after_end.any())  # everything after a completion's end is EOS


def _step(base: Path, monkeypatch: pytest.MonkeyPatch, fake: Any, recipe: Recipe) -> tuple[Any, dict[str, float]]:
    monkeypatch.setitem(suite.SKILLS, "memory", fake)
    model, tok = _load(base)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = make_optimizer(model, recipe)
    examples = [fake.sample(random.Random(i)) for i in range(recipe.prompts_per_step)]
    row = grpo_step(model, tok, opt, recipe, examples, torch.Generator().manual_seed(0))
    moved = any(not torch.equal(before[n], p) for n, p in model.named_parameters())
    return (model if moved else None), row


def test_a_step_updates_only_when_a_group_has_a_signal(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = Recipe(
        skill="memory", lr=1e-2, steps=1, prompts_per_step=2, group_size=4, max_new_tokens=8, autocast=False
    )
    moved, row = _step(base, monkeypatch, ConstantSkill(), recipe)
    assert moved is None and row["signal"] == 0.0
    moved, row = _step(base, monkeypatch, VowelSkill(), recipe)
    assert moved is not None and row["signal"] > 0
    assert 0.0 <= row["reward"] <= 1.0 and row["tokens"] > 0


def test_bf16_storage_keeps_every_weight_on_the_bf16_grid(base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = Recipe(
        skill="memory", lr=1e-2, steps=1, prompts_per_step=2, group_size=4, max_new_tokens=8, storage="bf16"
    )
    model, _ = _step(base, monkeypatch, VowelSkill(), recipe)
    assert model is not None
    for name, p in model.named_parameters():
        assert torch.equal(p, p.to(torch.bfloat16).float()), name


def test_recipe_refuses_unknown_settings() -> None:
    with pytest.raises(ValueError, match="storage"):
        Recipe(skill="tool", lr=1e-5, steps=1, storage="fp16")
    with pytest.raises(ValueError, match="reward"):
        Recipe(skill="tool", lr=1e-5, steps=1, reward="f1")


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118


def test_training_resumes_to_the_same_agent_and_exports_bf16(
    base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(suite.SKILLS, "memory", VowelSkill())
    recipe = Recipe(skill="memory", lr=1e-2, steps=3, prompts_per_step=1, group_size=4, max_new_tokens=8)
    whole = train.train_agent(base, tmp_path / "whole", recipe, seed=0, checkpoint_every=1)
    real_step, calls = grpo_hf.grpo_step, [0]

    def dies_at_step_three(*args: Any, **kwargs: Any) -> dict[str, float]:
        calls[0] += 1
        if calls[0] == 3:
            raise KeyboardInterrupt
        return real_step(*args, **kwargs)

    monkeypatch.setattr(train, "grpo_step", dies_at_step_three)
    with pytest.raises(KeyboardInterrupt):
        train.train_agent(base, tmp_path / "resumed", recipe, seed=0, checkpoint_every=1)
    assert not train.is_trained(tmp_path / "resumed") and (tmp_path / "resumed.state" / "optim.pt").is_file()
    monkeypatch.setattr(train, "grpo_step", real_step)
    resumed = train.train_agent(base, tmp_path / "resumed", recipe, seed=0, checkpoint_every=1)
    assert [r["reward"] for r in resumed["curve"]] == [r["reward"] for r in whole["curve"]]
    a, b = _weights(tmp_path / "whole"), _weights(tmp_path / "resumed")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all(t.dtype == torch.bfloat16 for t in a.values())  # fp32 master weights exported bf16
    kept = json.loads((tmp_path / "resumed.state" / "state.json").read_text())  # the final state stays
    assert kept["seed"] == 0 and len(kept["curve"]) == 3 and kept["recipe"] == recipe.to_dict()
    assert json.loads((tmp_path / "whole" / "agent.json").read_text())["recipe"] == recipe.to_dict()
    monkeypatch.setattr(train, "grpo_step", dies_at_step_three)
    calls[0] = -100
    again = train.train_agent(base, tmp_path / "whole", recipe, seed=0)  # finished with this recipe: kept
    assert calls[0] == -100 and again["curve"] == whole["curve"]
    other = train.train_agent(base, tmp_path / "whole", replace(recipe, steps=1), seed=0)  # another recipe: retrained
    assert calls[0] == -99 and len(other["curve"]) == 1


def test_more_steps_extend_a_finished_agent_to_what_a_fresh_run_gives(
    base: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(suite.SKILLS, "memory", VowelSkill())
    recipe = Recipe(skill="memory", lr=1e-2, steps=3, prompts_per_step=1, group_size=4, max_new_tokens=8)
    fresh = train.train_agent(base, tmp_path / "fresh", recipe, seed=0)
    train.train_agent(base, tmp_path / "agent", replace(recipe, steps=2), seed=0)
    real_step, calls = grpo_hf.grpo_step, [0]

    def counted(*args: Any, **kwargs: Any) -> dict[str, float]:
        calls[0] += 1
        return real_step(*args, **kwargs)

    monkeypatch.setattr(train, "grpo_step", counted)
    extended = train.train_agent(base, tmp_path / "agent", recipe, seed=0)
    assert calls[0] == 1  # only the new step ran
    assert [r["reward"] for r in extended["curve"]] == [r["reward"] for r in fresh["curve"]]
    a, b = _weights(tmp_path / "fresh"), _weights(tmp_path / "agent")
    assert all(torch.equal(a[k], b[k]) for k in a)
    said: list[str] = []
    train.train_agent(base, tmp_path / "agent", recipe, seed=1, log=said.append)  # another seed: from the base
    assert calls[0] == 4  # all 3 steps
    assert said[0].startswith("agent: training from the base; the saved state in") and "seed 0, this run's 1" in said[0]
    train.train_agent(base, tmp_path / "agent", replace(recipe, steps=2, lr=5e-3), seed=1)  # another lr: the same
    assert calls[0] == 6


def test_only_a_prefix_of_the_same_run_continues() -> None:
    recipe = Recipe(skill="memory", lr=1e-2, steps=3, prompts_per_step=1, group_size=4)
    saved = {"recipe": replace(recipe, steps=2).to_dict(), "seed": 0, "curve": [{}, {}]}
    assert train.continues(saved, recipe, seed=0)
    assert not train.continues(saved, recipe, seed=1)
    assert not train.continues(saved, replace(recipe, steps=1), seed=0)  # fewer steps than were run
    assert not train.continues(saved, replace(recipe, lr=1e-3), seed=0)
    assert not train.continues({**saved, "seed": None}, recipe, seed=0)  # a state from before seeds were saved
    assert not train.continues(None, recipe, seed=0)
    assert train.why_not(saved, recipe, seed=1) == "seed 0, this run's 1"
    assert train.why_not(saved, replace(recipe, steps=1), seed=0) == "2 steps saved, this run has 1"
    assert train.why_not(saved, replace(recipe, lr=1e-3), seed=0) == "recipe differs: lr 0.01 -> 0.001"


@pytest.mark.parametrize("temperature", [0.0, -1.0])
def test_a_recipe_samples_at_a_positive_temperature(temperature: float) -> None:
    with pytest.raises(ValueError, match="temperature must be > 0"):
        Recipe(skill="tool", lr=1e-5, steps=1, temperature=temperature)
