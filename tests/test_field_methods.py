"""MagMax, Consensus TA and SCE: against per-tensor references on real layouts, chunking, properties, CLI."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from agentmerge import MergeConfig, ModelSpec, merge
from agentmerge.cli import main
from agentmerge.methods.field.kernels import sce_variance
from agentmerge.methods.registry import METHODS
from agentmerge.methods.spec import Chunk, TensorStats
from fieldrefs import (
    assert_within_bf16_step,
    cast_like,
    consensus_ref,
    llama_family,
    magmax_ref,
    qwen2_family,
    sce_ref,
    tensors,
)

Family = tuple[Path, list[Path]]
ELEMENTWISE = ("magmax", "consensus", "sce")


@pytest.fixture(scope="module", params=["qwen2-tied-bf16", "qwen2-untied-fp32", "llama-fp32", "llama-bf16"])
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Family:
    root = tmp_path_factory.mktemp(request.param)
    dtype = torch.bfloat16 if request.param.endswith("bf16") else torch.float32
    if request.param.startswith("qwen2"):
        return qwen2_family(root, dtype, tied="untied" not in request.param, delta_std=0.02)
    return llama_family(root, dtype)


def run(family: Family, out: Path, method: str, params: dict[str, Any] | None = None, **kw: Any) -> dict:
    base, agents = family
    models = kw.pop("models", None) or [ModelSpec(path=str(a)) for a in agents]
    cfg = MergeConfig(method=method, base=str(base), models=models, params=params or {}, **kw)
    merge(cfg, out, quiet=True, hashing="none")
    return tensors(out)


def inputs(family: Family) -> tuple[dict, list[dict]]:
    base, agents = family
    return tensors(base), [tensors(a) for a in agents]


# --------------------------------------------------------------------------- against the references


@pytest.mark.parametrize("lam", [0.5, 1.3])
def test_magmax_is_the_per_element_reference(family: Family, tmp_path: Path, lam: float) -> None:
    out = run(family, tmp_path / "o", "magmax", {"lambda": lam})
    base, models = inputs(family)
    for name, b in base.items():
        want = cast_like(magmax_ref(b, [m[name] for m in models], lam), b)
        assert torch.equal(out[name], want), name


@pytest.mark.parametrize(
    ("params", "per_model"),
    [({}, None), ({"k": 1, "tall_lambda": 0.3, "lambda": 1.0}, None), ({"k": 2}, [0.2, 0.6, 0.4])],
)
def test_consensus_is_the_per_element_reference(
    family: Family, tmp_path: Path, params: dict[str, Any], per_model: list[float] | None
) -> None:
    models = None
    if per_model is not None:
        models = [ModelSpec(path=str(a), params={"tall_lambda": t}) for a, t in zip(family[1], per_model, strict=True)]
    out = run(family, tmp_path / "o", "consensus", params, models=models)
    full = METHODS["consensus"].canonical({**METHODS["consensus"].defaults(), **params})
    tall = per_model or [float(full["tall_lambda"])] * 3
    base, agents = inputs(family)
    for name, b in base.items():
        ref = consensus_ref(b, [m[name] for m in agents], int(full["k"]), tall, float(full["scale"]))
        assert torch.equal(out[name], cast_like(ref, b)), name


@pytest.mark.parametrize("topk", [1.0, 0.5, 0.05])
def test_sce_matches_mergekits_steps(family: Family, tmp_path: Path, topk: float) -> None:
    out = run(family, tmp_path / "o", "sce", {"select_topk": topk}, chunk_size=1000)
    base, agents = inputs(family)
    for name, b in base.items():
        assert_within_bf16_step(name, out[name], sce_ref(b, [m[name] for m in agents], topk))


# --------------------------------------------------------------------------- chunks, threads and shards


@pytest.mark.parametrize("method", ELEMENTWISE)
def test_any_chunking_gives_the_same_bytes(method: str, family: Family, tmp_path: Path) -> None:
    params = {"select_topk": 0.3} if method == "sce" else {}
    whole = run(family, tmp_path / "whole", method, params, threads=1)
    layouts = [{"chunk_size": 997, "threads": 2}, {"chunk_size": 1777, "max_shard_size": "20KB"}, {"chunk_size": 300}]
    for i, layout in enumerate(layouts):
        other = run(family, tmp_path / f"o{i}", method, params, **layout)
        assert all(torch.equal(whole[k].view(torch.uint8), other[k].view(torch.uint8)) for k in whole)


# --------------------------------------------------------------------------- defining properties


def chunk(tau: torch.Tensor, method: str, params: dict[str, Any] | None = None, **kw: Any) -> Chunk:
    n, e = tau.shape
    return Chunk(
        name="model.layers.0.mlp.up_proj.weight",
        start=0,
        stop=e,
        params={**METHODS[method].defaults(), **(params or {})},
        weights=torch.ones(n),
        stats=TensorStats(),
        shape=(e,),
        base=torch.zeros(e),
        tau=tau,
        **kw,
    )


def test_magmax_picks_the_largest_magnitude_and_the_later_agent_on_ties() -> None:
    tau = torch.tensor([[1.0, -3.0, 2.0, 0.0], [-2.0, 1.0, -2.0, 0.0], [0.5, 2.5, 1.0, -0.0]])
    got = METHODS["magmax"].kernel(chunk(tau, "magmax", {"lambda": 1.0}))
    assert got.tolist() == [-2.0, -3.0, -2.0, 0.0]  # |2| = |-2| at position 2: the later agent wins
    g = torch.Generator().manual_seed(0)
    tau = torch.randn(4, 500, generator=g)
    got = METHODS["magmax"].kernel(chunk(tau, "magmax"))
    assert torch.equal(got.abs(), 0.5 * tau.abs().max(0).values)


def test_consensus_k0_is_task_arithmetic_and_k_above_n_keeps_the_base() -> None:
    tau = torch.randn(3, 400, generator=torch.Generator().manual_seed(1))
    ta = METHODS["task_arithmetic"].kernel(chunk(tau, "task_arithmetic", {"lambda": 0.3}))
    assert torch.equal(METHODS["consensus"].kernel(chunk(tau, "consensus", {"k": 0})), ta)
    assert not bool(METHODS["consensus"].kernel(chunk(tau, "consensus", {"k": 4})).any())


def test_consensus_drops_selfish_weights() -> None:
    """An element only one agent moved (its TALL mask alone holds) is dropped at k = 2, kept at k = 1."""
    tau = torch.tensor([[0.5, 0.5], [0.0, 0.4], [0.0, 0.0]])
    got = METHODS["consensus"].kernel(chunk(tau, "consensus", {"lambda": 1.0}))
    torch.testing.assert_close(got, torch.tensor([0.0, 0.9]))
    assert METHODS["consensus"].kernel(chunk(tau, "consensus", {"k": 1, "lambda": 1.0}))[0] == 0.5


def test_sce_of_one_model_or_identical_models_is_that_model() -> None:
    tau = torch.randn(1, 300, generator=torch.Generator().manual_seed(2))
    tau[0, :20] = 0.0
    assert torch.equal(METHODS["sce"].kernel(chunk(tau, "sce")), tau[0])
    same = tau.expand(3, -1).clone()
    torch.testing.assert_close(METHODS["sce"].kernel(chunk(same, "sce")), tau[0], rtol=1e-6, atol=0)


@pytest.mark.parametrize("topk", [0.9, 0.5, 0.01])
def test_sce_selection_without_variance_keeps_the_consensus(topk: float) -> None:
    """Issue 42: one agent, or identical agents, have no variance to select by; mergekit's k = int(0 * topk) kept
    nothing and returned the base silently. The select step is skipped: the agents' consensus, as at topk 1."""
    tau = torch.randn(1, 300, generator=torch.Generator().manual_seed(4))
    assert torch.equal(METHODS["sce"].kernel(chunk(tau, "sce", {"select_topk": topk})), tau[0])
    same = tau.expand(3, -1).clone()
    got = METHODS["sce"].kernel(chunk(same, "sce", {"select_topk": topk}))
    torch.testing.assert_close(got, tau[0], rtol=1e-6, atol=0)
    varied = torch.cat([same, tau + 0.1])  # with variance the selection runs as before
    assert bool((METHODS["sce"].kernel(chunk(varied, "sce", {"select_topk": topk})) == 0).any())


def test_sce_streamed_selection_without_variance_keeps_the_consensus() -> None:
    """The multi-chunk statistics pass (``sce_prepare``) decides the same: no threshold without variance."""
    from agentmerge.methods.field.kernels import sce_prepare
    from agentmerge.methods.spec import TensorSource

    tau = torch.randn(1, 8192, generator=torch.Generator().manual_seed(5)).expand(2, -1).clone()
    params = {**METHODS["sce"].defaults(), "select_topk": 0.5}

    def source(t: torch.Tensor) -> TensorSource:
        def read():  # type: ignore[no-untyped-def]
            for start in (0, 4096):
                part = t[:, start : start + 4096]
                yield replace(chunk(part, "sce", {"select_topk": 0.5}), start=start, stop=start + 4096, shape=(8192,))

        return TensorSource("model.layers.0.mlp.up_proj.weight", (8192,), 2, params, ({}, {}), read)

    assert sce_prepare(source(tau)).threshold is None
    varied = tau.clone()
    varied[1, ::3] += 0.5
    assert sce_prepare(source(varied)).threshold == pytest.approx(0.0625)


def test_sce_erases_the_minority_sign_and_selects_by_variance() -> None:
    tau = torch.tensor([[1.0, 1.0, 0.0], [2.0, -3.0, 0.0], [-1.0, 1.0, 0.0]])
    got = METHODS["sce"].kernel(chunk(tau, "sce"))
    w = (tau**2).mean(1)
    w = w / w.sum()
    want0 = (w[0] * 1 + w[1] * 2) / (w[0] + w[1])  # sum 2 >= 0: agent 2's -1 is erased
    torch.testing.assert_close(got[0], want0.float())
    assert got[2] == 0.0  # exact zeros are always erased
    var = sce_variance(tau)
    top = METHODS["sce"].kernel(chunk(tau, "sce", {"select_topk": 0.5}))  # 2 nonzero variances -> keep 1
    assert top[int(var.argmin())] == 0.0 and top[int(var.argmax())] != 0.0


# --------------------------------------------------------------------------- the CLI, YAML and the mergekit YAML


@pytest.mark.parametrize(
    ("method", "param"), [("magmax", "lambda=0.7"), ("consensus", "k=1"), ("sce", "select_topk=0.4")]
)
def test_cli_flags_yaml_and_api_agree(method: str, param: str, tmp_path: Path, family: Family) -> None:
    base, agents = family
    flags = ["merge", "--method", method, "--base", str(base), "--quiet", "--param", param]
    flags += [x for a in agents for x in ("--model", str(a))]
    assert main([*flags, "-o", str(tmp_path / "flags")]) == 0
    key, value = param.split("=")
    api = run(family, tmp_path / "api", method, {key: float(value)})
    assert all(torch.equal(api[k], v) for k, v in tensors(tmp_path / "flags").items())
    if method == "sce":
        doc = {"merge_method": "sce", "base_model": str(base), "models": [{"model": str(a)} for a in agents]}
        doc["parameters"] = {"select_topk": float(value)}
        (tmp_path / "mk.yaml").write_text(yaml.safe_dump(doc))
        assert main(["merge", str(tmp_path / "mk.yaml"), str(tmp_path / "mk"), "--quiet"]) == 0
        assert all(torch.equal(api[k], v) for k, v in tensors(tmp_path / "mk").items())
