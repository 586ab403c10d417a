"""Crowding statistics of a set of agents' masks, checked against naive per-element loops."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from agentmerge_zoo.crowding import crowding, independent_shared, tensor_counts


def _naive(tau: torch.Tensor, eps: float) -> dict[str, int]:
    out = {"untouched": 0, "unique": 0, "shared": 0, "conflict": 0}
    for e in range(tau.shape[1]):
        active = [float(tau[i, e]) for i in range(tau.shape[0]) if abs(float(tau[i, e])) > eps]
        key = "untouched" if not active else "unique" if len(active) == 1 else "shared"
        out[key] += 1
        if len(active) >= 2 and min(active) < 0 < max(active):
            out["conflict"] += 1
    for i in range(tau.shape[0]):
        out[f"active{i}"] = sum(abs(float(v)) > eps for v in tau[i])
    return out


@pytest.mark.parametrize("agents", [2, 3, 6])
def test_tensor_counts_match_a_per_element_loop(agents: int) -> None:
    gen = torch.Generator().manual_seed(agents)
    tau = torch.randn(agents, 400, generator=gen) * 1e-5  # about half the elements within eps of zero
    tau[0, :5] = 1e-5  # exactly eps is no update
    assert tensor_counts(tau, 1e-5) == _naive(tau, 1e-5)


def test_independent_shared_matches_enumeration() -> None:
    densities = [0.1, 0.5, 0.8, 0.3]
    brute = 0.0
    for pattern in itertools.product((0, 1), repeat=len(densities)):
        p = 1.0
        for bit, d in zip(pattern, densities, strict=True):
            p *= d if bit else 1.0 - d
        brute += p if sum(pattern) >= 2 else 0.0
    assert independent_shared(densities) == pytest.approx(brute)
    assert independent_shared([1.0, 1.0]) == pytest.approx(1.0)
    assert independent_shared([0.3]) == pytest.approx(0.0)


def test_crowding_of_checkpoint_folders(tmp_path: Path) -> None:
    base = {"w": torch.zeros(2, 3, dtype=torch.bfloat16), "steps": torch.zeros(2, dtype=torch.int64)}
    a = {"w": torch.tensor([[1.0, -1.0, 0.0], [0.0, 0.0, 0.0]]), "steps": torch.ones(2, dtype=torch.int64)}
    b = {"w": torch.tensor([[1.0, 1.0, 0.0], [2.0, 0.0, 0.0]]), "steps": torch.ones(2, dtype=torch.int64)}
    for name, tensors in (("base", base), ("a", a), ("b", b)):
        (tmp_path / name).mkdir()
        save_file(tensors, str(tmp_path / name / "model.safetensors"))
    stats = crowding(tmp_path / "base", [tmp_path / "a", tmp_path / "b"])
    # 6 floating elements (the int tensor is not counted): shared 2 (one with a sign conflict), unique 1
    assert stats["shared"] == pytest.approx(2 / 6) and stats["unique"] == pytest.approx(1 / 6)
    assert stats["untouched"] == pytest.approx(3 / 6) and stats["conflict"] == pytest.approx(0.5)
    assert stats["densities"] == pytest.approx([2 / 6, 3 / 6])
    assert stats["shared_independent"] == pytest.approx(independent_shared([2 / 6, 3 / 6]))
