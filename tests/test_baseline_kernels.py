"""The fast TIES/DARE primitives of ``baselines.py`` against the plain torch expressions they replace, bit for bit."""

from __future__ import annotations

import math

import pytest
import torch

from agentmerge.methods import stats
from agentmerge.methods.deltas import sum_agents
from agentmerge.methods.ties import kernels as B

SPECIALS = [0.0, -0.0, math.inf, -math.inf, math.nan, 3e38, -3e38, 1e-45, -1e-45, 1.17e-38]


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32)


def tau_with_specials(n: int, e: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scale = 10.0 ** torch.randint(-30, 30, (n, 1), generator=g).float()
    tau = torch.randn(n, e, generator=g) * scale
    tau[:, : len(SPECIALS)] = torch.tensor(SPECIALS)
    tau[:, len(SPECIALS) : len(SPECIALS) + 50] = 0.0
    return tau


@pytest.mark.parametrize("p", [[0.5, 0.75, 0.0], [0.1, 0.3, 1 - 2**-20], [0.9, 0.5, 1 / 3], [0.2, 0.2, 0.2]])
def test_dare_rescale_and_drop_match_float64_formula(p: list[float]) -> None:
    tau = tau_with_specials(3, 5000, 1)
    u = torch.rand(3, 5000, generator=torch.Generator().manual_seed(2))
    for i, pi in enumerate(p):  # draws exactly at and next to p
        u[i, :3] = torch.tensor([pi, math.nextafter(pi, 0.0), math.nextafter(pi, 1.0)], dtype=torch.float32)
    p64 = torch.tensor(p, dtype=torch.float64)[:, None]
    expected = torch.where(u.double() >= p64, tau.double() / (1.0 - p64), 0.0).float()
    out = torch.empty_like(tau)
    for i, pi in enumerate(p):
        B._rescale(tau[i], 1.0 - pi, out[i])
        B._zero_unless(out[i], u[i] >= B.f32_at_least(pi))
    assert torch.equal(bits(out), bits(expected))


def test_zero_unless_is_where() -> None:
    x = tau_with_specials(2, 3000, 3)
    keep = torch.rand(2, 3000, generator=torch.Generator().manual_seed(4)) < 0.5
    assert torch.equal(bits(B._zero_unless(x.clone(), keep)), bits(torch.where(keep, x, 0.0)))


@pytest.mark.parametrize("weights", [[1.0, 1.0, 1.0], [0.5, -2.0, 3.3], [0.0, 1e-30, 7.0]])
def test_disjoint_merge_matches_reference(weights: list[float]) -> None:
    tau = tau_with_specials(3, 4000, 5)
    tau[:, 200:] = tau[:, 200:].clamp(-1e30, 1e30)  # finite beyond the specials
    w = torch.tensor(weights)
    wt = tau * w[:, None]
    elected = torch.sign(sum_agents(wt))
    wt.mul_(elected)
    agree = wt > 0
    num = sum_agents(wt.clamp_(min=0.0)).mul_(elected)
    den = sum_agents(agree * w[:, None])
    expected = torch.where(den != 0, num / torch.where(den != 0, den, 1.0), 0.0)
    assert torch.equal(bits(B.disjoint_merge(tau, w)), bits(expected))


def test_trim_matches_where() -> None:
    tau = tau_with_specials(3, 4000, 6)
    t = torch.tensor([[0.0], [1e-3], [math.inf]])
    assert torch.equal(bits(B._trim(tau, t)), bits(torch.where(tau.abs() >= t, tau, 0.0)))


def test_upper_histogram_matches_shift() -> None:
    v = tau_with_specials(3, 6000, 7).abs()
    hi = v.view(torch.int32) >> 16
    expected = torch.stack([torch.bincount(row, minlength=1 << 16) for row in hi])
    assert torch.equal(stats._upper_histogram(v), expected)
    assert torch.equal(stats._upper_bits(v.view(torch.int32)).to(torch.int32), hi)
