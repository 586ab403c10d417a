"""Probe statistics against a naive count over whole tensors; grouping; independent-mask expectation."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agentmerge.engine.probe import layer_of, module_type, poisson_binomial, probe


def test_probe_matches_naive_counts(tiny_family: tuple[Path, list[Path]]) -> None:
    base, agents = tiny_family
    result = probe(str(base), [str(a) for a in agents], chunk_size=37, quiet=True)
    b = load_file(base / "model.safetensors")
    models = [load_file(a / "model.safetensors") for a in agents]
    masks = {
        n: torch.stack([(m[n].float() - t.float()).abs() > 1e-5 for m in models]).reshape(3, -1) for n, t in b.items()
    }
    numel = sum(t.numel() for t in b.values())
    for i, a in enumerate(result.agents):
        updated = sum(int(m[i].sum()) for m in masks.values())
        with_k = [sum(int((m[i] & (m.sum(0) == k + 1)).sum()) for m in masks.values()) for k in range(3)]
        assert a.updated == updated and a.density == pytest.approx(updated / numel)
        assert a.overlap == pytest.approx([c / updated for c in with_k])
        assert a.rho == pytest.approx(sum(with_k[1:]) / with_k[0])
        assert a.lam == pytest.approx(1 + 0.1 * min(a.rho, 2.0))
    # densities of the synthetic family are 3 %, 46 %, 54 % before bf16 rounding: ordering survives
    assert result.agents[0].density < result.agents[1].density < result.agents[2].density


def test_groups_partition_the_model(tiny_family: tuple[Path, list[Path]]) -> None:
    base, agents = tiny_family
    result = probe(str(base), [str(a) for a in agents], quiet=True)
    for groups in (result.per_layer, result.per_module, result.per_tensor):
        assert sum(g[0].updated for g in groups.values()) == result.agents[0].updated
        assert sum(g[0].numel for g in groups.values()) == result.agents[0].numel
    assert list(result.per_layer) == ["0", "1", "-"]
    assert set(result.per_module) == {"embedding", "norm", "attention", "mlp"}
    json.dumps(result.to_dict())  # serialisable, inf written as a string


@pytest.mark.parametrize(
    "name,kind,layer",
    [
        ("model.layers.3.self_attn.q_proj.weight", "attention", "3"),
        ("model.layers.12.mlp.down_proj.weight", "mlp", "12"),
        ("model.layers.0.input_layernorm.weight", "norm", "0"),
        ("model.embed_tokens.weight", "embedding", "-"),
        ("lm_head.weight", "embedding", "-"),
        ("transformer.h.2.attn.c_attn.weight", "attention", "2"),
        ("transformer.h.2.mlp.c_fc.weight", "mlp", "2"),
        ("model.norm.weight", "norm", "-"),
        ("score.weight", "other", "-"),
    ],
)
def test_module_and_layer_names(name: str, kind: str, layer: str) -> None:
    assert module_type(name) == kind and layer_of(name) == layer


def test_poisson_binomial() -> None:
    assert poisson_binomial([]) == [1.0]
    assert poisson_binomial([0.5, 0.5]) == pytest.approx([0.25, 0.5, 0.25])
    d = poisson_binomial([0.1, 0.7, 0.3])
    assert sum(d) == pytest.approx(1.0) and d[3] == pytest.approx(0.1 * 0.7 * 0.3)
    assert d[0] == pytest.approx(math.prod(1 - p for p in (0.1, 0.7, 0.3)))


def test_independent_masks_match_the_independent_expectation(tiny_family: tuple[Path, list[Path]]) -> None:
    """The synthetic agents draw their masks independently, so measured w.0 must be close to the expectation."""
    base, agents = tiny_family
    result = probe(str(base), [str(a) for a in agents], quiet=True)
    for a, expected in zip(result.agents, result.independent, strict=True):
        assert a.overlap[0] == pytest.approx(expected[0], abs=0.03)


def test_plot_is_written(tiny_family: tuple[Path, list[Path]], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from agentmerge.engine.render import plot_probe, probe_markdown

    base, agents = tiny_family
    result = probe(str(base), [str(a) for a in agents], quiet=True)
    plot_probe(result, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = probe_markdown(result)
    assert "| agent0 |" in md and "Density % per layer" in md
