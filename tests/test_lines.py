"""LiNeS depth scaling as a post-step of any method: the layer rule, alpha (closed form and exact pre-pass),
against per-tensor references on real layouts, chunking, refusals, the CLI, dry run and mergekit export."""

from __future__ import annotations

import random
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import torch

from agentmerge import MergeConfig, ModelSpec, merge
from agentmerge.cli import main
from agentmerge.config.mergekit_export import to_mergekit
from agentmerge.config.schema import config_from_dict
from agentmerge.engine.inputs import Scratch
from agentmerge.engine.lines_pass import exact_value, l1_parts
from agentmerge.engine.merge_dryrun import plan_merge
from agentmerge.errors import ConfigError, MergeError
from agentmerge.methods.lines import depth_scale, layer_count, layer_of
from agentmerge.synthetic import Architecture, write_family
from fieldrefs import assert_within_bf16_step, llama_family, qwen2_family, tensors

Family = tuple[Path, list[Path]]


@pytest.fixture(scope="module", params=["qwen2-tied-bf16", "llama-fp32"])
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Family:
    root = tmp_path_factory.mktemp(request.param)
    if request.param.startswith("qwen2"):
        return qwen2_family(root, torch.bfloat16, delta_std=0.02)
    return llama_family(root, torch.float32)


def run(family: Family, out: Path, method: str, params: dict[str, Any], **kw: Any) -> dict[str, torch.Tensor]:
    base, agents = family
    weights = kw.pop("weights", [1.0] * len(agents))
    models = [ModelSpec(path=str(a), weight=w) for a, w in zip(agents, weights, strict=True)]
    merge(MergeConfig(method=method, base=str(base), models=models, params=params, **kw), out, quiet=True)
    return tensors(out)


def scale_of(name: str, layers: int, alpha: float, beta: float) -> float:
    """lambda(l) = alpha + beta l / (L - 1), l from '.layers.N.' (alpha outside the layers), written out plainly."""
    parts = name.split(".")
    if "layers" in parts:
        layer = int(parts[parts.index("layers") + 1])
        return alpha + beta * layer / (layers - 1)
    return alpha


# --------------------------------------------------------------------------- the pieces


def test_layer_rule_and_scale() -> None:
    assert layer_of("model.layers.12.mlp.up_proj.weight") == 12
    assert layer_of("model.embed_tokens.weight") is None and layer_of("lm_head.weight") is None
    assert layer_of("model.layers.3.mlp.experts.7.w1.weight") == 3  # not the expert index
    assert layer_count(["model.layers.0.a", "model.layers.27.b", "model.norm.weight"]) == 28
    assert depth_scale("model.layers.27.b", 28, 0.25, 0.5) == 0.75
    assert depth_scale("model.norm.weight", 28, 0.25, 0.5) == 0.25


def test_exact_l1_sums_are_order_free() -> None:
    rng = random.Random(0)
    values = [rng.choice([0.0, 1e-40, -3e-39, 7.5, -1e30, 2.0**-126]) * rng.random() for _ in range(3000)]
    x = torch.tensor(values, dtype=torch.float32)
    want = sum((Fraction(float(v)) for v in x.abs().tolist()), Fraction(0))
    assert exact_value(l1_parts(x)) == want
    assert exact_value(l1_parts(x[:1234]) + l1_parts(x[1234:])) == want
    assert torch.equal(l1_parts(x, slice_size=7), l1_parts(x))  # taken in slices: the same buckets
    scratch = Scratch()  # the alpha pass's reused buffers: larger from an earlier chunk, the same buckets
    assert exact_value(l1_parts(torch.full((5000,), -9.0), scratch=scratch)) == 45000
    assert exact_value(l1_parts(x, scratch=scratch)) == want


# --------------------------------------------------------------------------- against per-tensor references


@pytest.mark.parametrize("beta", [0.5, 1.0])
def test_task_arithmetic_uses_alpha_one_over_n_lambda(family: Family, tmp_path: Path, beta: float) -> None:
    out = run(family, tmp_path / "o", "task_arithmetic", {"lambda": 0.8, "lines_beta": beta}, chunk_size=700)
    base, agents = family
    b, models = tensors(base), [tensors(a) for a in agents]
    layers = layer_count(b)
    for name in b:
        summed = sum((m[name].double() - b[name].double() for m in models), torch.zeros(b[name].shape))
        alpha = 1.0 / (3 * 0.8)
        assert_within_bf16_step(name, out[name], b[name].double() + scale_of(name, layers, alpha, beta) * 0.8 * summed)


def magmax_delta(b: torch.Tensor, models: list[torch.Tensor]) -> torch.Tensor:
    taus = torch.stack([m.double() - b.double() for m in models])
    pick = (taus.abs() == taus.abs().max(0).values).double()
    last = pick.shape[0] - 1 - pick.flip(0).argmax(0)  # the later agent on a tie
    return 0.5 * taus.gather(0, last[None]).squeeze(0)


def test_any_method_gets_the_references_alpha_from_a_pre_pass(family: Family, tmp_path: Path) -> None:
    out = run(family, tmp_path / "o", "magmax", {"lines_beta": 0.7}, chunk_size=600, threads=2)
    base, agents = family
    b, models = tensors(base), [tensors(a) for a in agents]
    deltas = {k: magmax_delta(b[k], [m[k] for m in models]) for k in b}
    summed = sum(float(sum(m[k].double() - b[k].double() for m in models).abs().sum()) for k in b)
    alpha = summed / (3 * sum(float(d.abs().sum()) for d in deltas.values()))
    layers = layer_count(b)
    for name in b:
        assert_within_bf16_step(name, out[name], b[name].double() + scale_of(name, layers, alpha, 0.7) * deltas[name])


@pytest.mark.parametrize(("method", "params"), [("magmax", {}), ("sce", {"select_topk": 0.5}), ("ties", {})])
def test_any_chunking_gives_the_same_bytes(method: str, params: dict[str, Any], family: Family, tmp_path: Path) -> None:
    params = {**params, "lines_beta": 0.4}
    whole = run(family, tmp_path / "whole", method, params, threads=1)
    for i, layout in enumerate([{"chunk_size": 997, "threads": 2}, {"chunk_size": 300, "max_shard_size": "20KB"}]):
        other = run(family, tmp_path / f"o{i}", method, params, **layout)
        assert all(torch.equal(whole[k].view(torch.uint8), other[k].view(torch.uint8)) for k in whole)


def test_fixed_alpha_and_off(family: Family, tmp_path: Path) -> None:
    plain = run(family, tmp_path / "plain", "magmax", {})
    assert all(
        torch.equal(plain[k], v) for k, v in run(family, tmp_path / "off", "magmax", {"lines_beta": 0.0}).items()
    )
    fixed = run(family, tmp_path / "fixed", "magmax", {"lines_alpha": 0.2, "lines_beta": 0.3})
    base, agents = family
    b, models = tensors(base), [tensors(a) for a in agents]
    layers = layer_count(b)
    for k in b:
        delta = magmax_delta(b[k], [m[k] for m in models])
        assert_within_bf16_step(k, fixed[k], b[k].double() + scale_of(k, layers, 0.2, 0.3) * delta)


# --------------------------------------------------------------------------- refusals, CLI, dry run, mergekit


def test_refusals(family: Family, tmp_path: Path) -> None:
    models = [{"path": str(a)} for a in family[1]]
    with pytest.raises(ConfigError, match="against a base model"):
        config_from_dict({"method": "karcher", "models": models, "params": {"lines_beta": 0.5}})
    arch = Architecture(vocab=32, hidden=16, intermediate=32, layers=1, heads=2, kv_heads=1)
    one_base, one_agents = write_family(tmp_path / "one", arch, [0.3, 0.5])
    cfg = MergeConfig(
        method="magmax", base=str(one_base), models=[ModelSpec(path=str(a)) for a in one_agents],
        params={"lines_beta": 0.5},
    )  # fmt: skip
    with pytest.raises(MergeError, match="1 layer"):
        merge(cfg, tmp_path / "o", quiet=True)
    assert not (tmp_path / "o").exists()


def test_cli_dry_run_and_mergekit_export(family: Family, tmp_path: Path) -> None:
    base, agents = family
    argv = ["merge", "--method", "sce", "--base", str(base), "--quiet", "--param", "lines_beta=0.6"]
    argv += [x for a in agents for x in ("--model", str(a))]
    assert main([*argv, "-o", str(tmp_path / "cli")]) == 0
    api = run(family, tmp_path / "api", "sce", {"lines_beta": 0.6})
    assert all(torch.equal(api[k], v) for k, v in tensors(tmp_path / "cli").items())
    models = [ModelSpec(path=str(a)) for a in agents]
    for method, passes in (("task_arithmetic", 1), ("magmax", 2), ("karcher", 3)):
        cfg = MergeConfig(method=method, base=str(base), models=models, params={"lines_beta": 0.5})
        assert plan_merge(cfg, tmp_path / "dry", probe=False).passes == passes, method
    doc = {"method": "sce", "base": "org/b", "models": [{"path": "org/a"}], "params": {"lines_beta": 0.5}}
    with pytest.raises(ConfigError, match=r"lines_beta = 0\.5 cannot be written for mergekit"):
        to_mergekit(config_from_dict(doc))
    assert "lines" not in str(to_mergekit(config_from_dict({**doc, "params": {}})).config)


@pytest.mark.parametrize("method", ["magmax", "task_arithmetic", "consensus"])
def test_compiled_and_reference_kernels_give_the_same_bytes(
    method: str, family: Family, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """LiNeS scales the merged chunk minus the base, which both kernel paths compute bit for bit."""
    params = {"lines_beta": 0.8, "lambda": 0.7}
    monkeypatch.setenv("AGENTMERGE_FUSED", "1")
    fused = run(family, tmp_path / "fused", method, params, chunk_size=997)
    monkeypatch.setenv("AGENTMERGE_FUSED", "0")
    reference = run(family, tmp_path / "reference", method, params)
    assert all(torch.equal(fused[k].view(torch.uint8), reference[k].view(torch.uint8)) for k in fused)


def test_merge_json_records_alpha(family: Family, tmp_path: Path) -> None:
    import json

    run(family, tmp_path / "o", "task_arithmetic", {"lambda": 0.5, "lines_beta": 0.5})
    record = json.loads((tmp_path / "o" / "merge.json").read_text())["lines"]
    assert record["reference_alpha"] == pytest.approx(1 / 1.5) and record["layers"] >= 2
    run(family, tmp_path / "p", "task_arithmetic", {})
    assert "lines" not in json.loads((tmp_path / "p" / "merge.json").read_text())
