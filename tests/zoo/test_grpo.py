"""The RL loop's pieces: group-normalised advantages, the policy-gradient direction, bf16 storage."""

from __future__ import annotations

import torch

from agentmerge_zoo.batching import completion_mask
from agentmerge_zoo.grpo import _policy_loss, group_advantages
from agentmerge_zoo.modeling import ModelShape, new_model, round_to_bf16_
from agentmerge_zoo.vocab import BOS_ID, EOS_ID, PAD_ID


def test_group_advantages_normalise_within_groups() -> None:
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]), 4)
    assert torch.allclose(adv[:4].mean(), torch.tensor(0.0), atol=1e-6)
    assert adv[0] > 0 > adv[1]
    assert torch.all(adv[4:] == 0), "a group with equal rewards carries no signal"


def test_completion_mask_stops_after_first_eos() -> None:
    ids = torch.tensor([[5, EOS_ID, 7, EOS_ID], [5, 6, 7, 8]])
    assert completion_mask(ids, EOS_ID).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]


def test_policy_step_raises_logprob_of_positive_advantage_sample() -> None:
    torch.manual_seed(0)
    model = new_model(ModelShape(hidden=32, layers=1, heads=2, intermediate=64), seed=0)
    batch = {
        "input_ids": torch.tensor([[PAD_ID, BOS_ID, 10], [PAD_ID, BOS_ID, 10]]),
        "attention_mask": torch.tensor([[0, 1, 1], [0, 1, 1]]),
    }
    completion = torch.tensor([[20, EOS_ID], [21, EOS_ID]])
    adv = torch.tensor([1.0, -1.0])
    opt = torch.optim.SGD(model.parameters(), lr=0.5)

    def logprob_gap() -> float:
        with torch.no_grad():
            logits = model(**batch).logits[:, -1]
        logp = torch.log_softmax(logits, dim=-1)
        return float(logp[0, 20] - logp[1, 21])

    before = logprob_gap()
    loss = _policy_loss(model, batch, completion, adv, EOS_ID)
    loss.backward()
    opt.step()
    assert logprob_gap() > before


def test_round_to_bf16_makes_weights_bf16_representable() -> None:
    model = new_model(ModelShape(hidden=16, layers=1, heads=2, intermediate=32), seed=1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1e-4)
    round_to_bf16_(model)
    for p in model.parameters():
        assert torch.equal(p, p.to(torch.bfloat16).float())
