"""RAM / RAM+ / unique_only / linear / task arithmetic kernels against naive per-element references."""

from __future__ import annotations

import math

import pytest
import torch

from agentmerge.methods.deltas import overlap_histogram, update_mask
from agentmerge.methods.ram.kernels import ram_lambdas
from agentmerge.methods.registry import METHODS
from agentmerge.methods.spec import Chunk, TensorStats


def naive_ram(tau: list[list[float]], eps: float, lam: list[float]) -> list[float]:
    """Per element, literally as the paper states it."""
    n, e = len(tau), len(tau[0])
    out = []
    for p in range(e):
        active = [i for i in range(n) if abs(tau[i][p]) > eps]
        if not active:
            out.append(0.0)
        elif len(active) == 1:
            out.append(lam[active[0]] * tau[active[0]][p])
        else:
            out.append(sum(tau[i][p] for i in active) / len(active))
    return out


def naive_hist(tau: list[list[float]], eps: float) -> list[list[int]]:
    n, e = len(tau), len(tau[0])
    hist = [[0] * n for _ in range(n)]
    for p in range(e):
        active = [i for i in range(n) if abs(tau[i][p]) > eps]
        for i in active:
            hist[i][len(active) - 1] += 1
    return hist


def _above(eps: float) -> float:
    """The smallest float32 above float32(eps): the comparison |tau| > eps happens in float32."""
    return float(torch.nextafter(torch.tensor(eps), torch.tensor(1.0)))


def sparse_tau(n: int, e: int, seed: int, eps: float = 1e-5) -> torch.Tensor:
    """Random task vectors with zeros, values exactly at +-eps and just above it, to test strictness."""
    g = torch.Generator().manual_seed(seed)
    tau = torch.randn(n, e, generator=g) * 1e-3
    tau[torch.rand(n, e, generator=g) < 0.5] = 0.0
    edge = torch.rand(n, e, generator=g)
    tau[edge < 0.05] = eps
    tau[(edge >= 0.05) & (edge < 0.1)] = -eps
    tau[(edge >= 0.1) & (edge < 0.12)] = _above(eps)
    return tau


def chunk(tau: torch.Tensor, params: dict[str, object], hist: torch.Tensor | None = None) -> Chunk:
    n, e = tau.shape
    method_params = {**METHODS["ram_plus"].defaults()} if "r" in params else {}
    return Chunk(
        name="t",
        start=0,
        stop=e,
        base=torch.zeros(e),
        tau=tau,
        weights=torch.ones(n),
        params={**method_params, **params},  # type: ignore[dict-item]
        stats=TensorStats(hist, hist),
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("n", [2, 3, 5])
def test_ram_matches_naive(seed: int, n: int) -> None:
    tau = sparse_tau(n, 400, seed)
    got = METHODS["ram"].kernel(chunk(tau, {"epsilon": 1e-5}))
    want = naive_ram(tau.tolist(), 1e-5, [1.0] * n)
    assert torch.allclose(got, torch.tensor(want), rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize("form", ["paper", "authors"])
@pytest.mark.parametrize("seed", [0, 1])
def test_ram_plus_matches_naive(form: str, seed: int) -> None:
    tau = sparse_tau(3, 500, seed)
    hist = overlap_histogram(update_mask(tau, 1e-5))
    params = {"epsilon": 1e-5, "form": form, "r": 0.3, "alpha": 1.5, "rescale_factor": 1.2, "scope": "global"}
    got = METHODS["ram_plus"].kernel(chunk(tau, params, hist))
    h = naive_hist(tau.tolist(), 1e-5)
    rho = [sum(row[1:]) / row[0] if row[0] else math.inf for row in h]
    if form == "paper":
        lam = [1 + 0.3 * min(max(r, 0.0), 1.5) for r in rho]
    else:
        lam = [1 + 0.2 * min(r, 1.0) for r in rho]
    want = naive_ram(tau.tolist(), 1e-5, lam)
    assert torch.allclose(got, torch.tensor(want), rtol=1e-5, atol=1e-9)


def test_histogram_matches_naive() -> None:
    tau = sparse_tau(4, 300, 7)
    got = overlap_histogram(update_mask(tau, 1e-5))
    assert got.tolist() == naive_hist(tau.tolist(), 1e-5)


def test_epsilon_is_strict() -> None:
    eps = 1e-5
    tau = torch.tensor([[eps, -eps, _above(eps), 0.0]])
    out = METHODS["ram"].kernel(chunk(tau, {"epsilon": eps}))
    assert out.tolist() == [0.0, 0.0, _above(eps), 0.0]


def test_disjoint_supports_give_the_sum() -> None:
    tau = torch.tensor([[0.1, 0.0, 0.0], [0.0, -0.2, 0.0], [0.0, 0.0, 0.3]])
    assert torch.equal(METHODS["ram"].kernel(chunk(tau, {"epsilon": 1e-5})), tau.sum(0))


def test_identical_supports_give_the_mean() -> None:
    g = torch.Generator().manual_seed(3)
    tau = torch.randn(3, 50, generator=g) * 0.01 + 0.05  # all well above epsilon
    assert torch.allclose(METHODS["ram"].kernel(chunk(tau, {"epsilon": 1e-5})), tau.mean(0), atol=1e-7)


def test_ram_plus_scales_unique_and_never_shared() -> None:
    # agent 0: 1 unique, 2 shared -> rho 2; agent 1: 1 unique, 2 shared -> rho 2; agent 2: 0 active
    tau = torch.tensor([[0.5, 0.1, 0.2, 0.0], [0.0, 0.3, 0.4, 0.7], [0.0, 0.0, 0.0, 0.0]])
    hist = overlap_histogram(update_mask(tau, 1e-5))
    params = {"epsilon": 1e-5, "form": "paper", "r": 0.1, "alpha": 2.0, "scope": "global"}
    out = METHODS["ram_plus"].kernel(chunk(tau, params, hist))
    lam = 1 + 0.1 * 2.0
    assert out.tolist() == pytest.approx([0.5 * lam, 0.2, 0.3, 0.7 * lam])


def test_agent_without_unique_elements_does_not_crash() -> None:
    tau = torch.tensor([[0.1, 0.2], [0.1, 0.2]])
    hist = overlap_histogram(update_mask(tau, 1e-5))
    lam = ram_lambdas(hist, {"form": "paper", "r": 0.1, "alpha": 2.0})
    assert lam.tolist() == pytest.approx([1.2, 1.2])  # rho = inf is clipped to alpha
    params = {"epsilon": 1e-5, "form": "authors", "rescale_factor": 1.2, "scope": "global"}
    out = METHODS["ram_plus"].kernel(chunk(tau, params, hist))
    assert torch.allclose(out, tau.mean(0))


def test_unchanged_elements_stay_at_base() -> None:
    tau = torch.zeros(3, 10)
    for name in ("ram", "linear", "task_arithmetic"):
        params = METHODS[name].defaults()
        assert torch.equal(METHODS[name].kernel(chunk(tau, params)), torch.zeros(10))


@pytest.mark.parametrize("scale", [1.0, 1 / 3])
def test_unique_only_matches_naive(scale: float) -> None:
    tau = sparse_tau(3, 300, 11)
    for agent in range(3):
        got = METHODS["unique_only"].kernel(chunk(tau, {"epsilon": 1e-5, "agent": agent, "scale": scale}))
        t = tau.tolist()
        want = []
        for p in range(300):
            active = [i for i in range(3) if abs(t[i][p]) > 1e-5]
            want.append(scale * t[agent][p] if active == [agent] else 0.0)
        assert torch.allclose(got, torch.tensor(want), rtol=1e-5, atol=1e-9)


def test_linear_and_task_arithmetic_match_naive() -> None:
    g = torch.Generator().manual_seed(5)
    tau = torch.randn(3, 40, generator=g)
    w = [0.5, 1.0, 2.0]
    c = Chunk(
        name="t", start=0, stop=40, base=torch.zeros(40), tau=tau, weights=torch.tensor(w), params={"lambda": 0.7}
    )
    t = tau.tolist()
    lin = [sum(w[i] * t[i][p] for i in range(3)) / sum(w) for p in range(40)]
    ta = [0.7 * sum(w[i] * t[i][p] for i in range(3)) for p in range(40)]
    assert torch.allclose(METHODS["linear"].kernel(c), torch.tensor(lin), atol=1e-6)
    assert torch.allclose(METHODS["task_arithmetic"].kernel(c), torch.tensor(ta), atol=1e-6)
