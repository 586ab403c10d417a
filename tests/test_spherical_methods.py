"""Karcher, Multi-SLERP and NuSLERP: against mergekit's steps on real layouts, chunking, properties, CLI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from agentmerge import MergeConfig, ModelSpec, merge
from agentmerge.cli import main
from agentmerge.errors import MergeError
from agentmerge.methods.registry import METHODS
from agentmerge.methods.spec import Chunk, TensorStats
from fieldrefs import (
    assert_within_bf16_step,
    karcher_ref,
    llama_family,
    multislerp_ref,
    nuslerp_ref,
    qwen2_family,
    tensors,
)

Family = tuple[Path, list[Path]]
SPHERICAL = ("karcher", "multislerp", "nuslerp")
WEIGHTS = [0.5, 1.5, 1.0]
NUSLERP_MODES = [{}, {"nuslerp_flatten": False}, {"nuslerp_flatten": False, "nuslerp_row_wise": True}]


@pytest.fixture(scope="module", params=["qwen2-tied-bf16", "qwen2-untied-fp32", "llama-fp32", "llama-bf16"])
def family(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Family:
    root = tmp_path_factory.mktemp(request.param)
    dtype = torch.bfloat16 if request.param.endswith("bf16") else torch.float32
    if request.param.startswith("qwen2"):
        return qwen2_family(root, dtype, tied="untied" not in request.param, delta_std=0.02)
    return llama_family(root, dtype)


def run(
    family: Family, out: Path, method: str, params: dict[str, Any] | None = None, *, n: int = 3, **kw: Any
) -> dict[str, torch.Tensor]:
    base, agents = family
    weights = kw.pop("weights", [1.0] * n)
    models = [ModelSpec(path=str(a), weight=w) for a, w in zip(agents[:n], weights, strict=True)]
    with_base = kw.pop("with_base", True)
    cfg = MergeConfig(method=method, base=str(base) if with_base else None, models=models, params=params or {}, **kw)
    merge(cfg, out, quiet=True, hashing="none")
    return tensors(out)


def inputs(family: Family) -> tuple[dict[str, torch.Tensor], list[dict[str, torch.Tensor]]]:
    base, agents = family
    return tensors(base), [tensors(a) for a in agents]


# --------------------------------------------------------------------------- against mergekit's steps


@pytest.mark.parametrize("with_base", [True, False])
def test_karcher_is_mergekits_on_the_raw_weights(family: Family, tmp_path: Path, with_base: bool) -> None:
    out = run(family, tmp_path / "o", "karcher", with_base=with_base, chunk_size=1024)
    _, models = inputs(family)
    for name in out:
        assert_within_bf16_step(name, out[name], karcher_ref([m[name] for m in models]))


@pytest.mark.parametrize(("with_base", "normalize"), [(True, True), (False, True), (True, False)])
def test_multislerp_is_mergekits(family: Family, tmp_path: Path, with_base: bool, normalize: bool) -> None:
    params = {"normalize_weights": normalize}
    out = run(family, tmp_path / "o", "multislerp", params, weights=WEIGHTS, with_base=with_base, chunk_size=1024)
    base, models = inputs(family)
    for name in out:
        ref = multislerp_ref([m[name] for m in models], WEIGHTS, base[name] if with_base else None, normalize)
        assert_within_bf16_step(name, out[name], ref)


@pytest.mark.parametrize("mode", range(len(NUSLERP_MODES)))
@pytest.mark.parametrize("with_base", [True, False])
def test_nuslerp_is_mergekits(family: Family, tmp_path: Path, mode: int, with_base: bool) -> None:
    params = NUSLERP_MODES[mode]
    out = run(family, tmp_path / "o", "nuslerp", params, n=2, weights=[0.3, 1.0], with_base=with_base)
    base, models = inputs(family)
    flatten, row_wise = params.get("nuslerp_flatten", True), params.get("nuslerp_row_wise", False)
    t = 1.0 / 1.3
    for name in out:
        v0, v1 = (m[name].double() for m in models[:2])
        if with_base:
            b = base[name].double()
            ref = b + nuslerp_ref(t, v0 - b, v1 - b, flatten, row_wise)
        else:
            ref = nuslerp_ref(t, v0, v1, flatten, row_wise)
        assert_within_bf16_step(name, out[name], ref)


# --------------------------------------------------------------------------- chunks, threads and shards


@pytest.mark.parametrize(
    ("method", "params"),
    [("karcher", {}), ("multislerp", {}), *[("nuslerp", p) for p in NUSLERP_MODES]],
)
def test_any_chunking_gives_the_same_bytes(method: str, params: dict[str, Any], family: Family, tmp_path: Path) -> None:
    n = 2 if method == "nuslerp" else 3
    weights = [0.7, 1.1, 0.4][:n] if METHODS[method].uses_weights else [1.0] * n
    whole = run(family, tmp_path / "whole", method, params, n=n, weights=weights, threads=1)
    layouts = [{"chunk_size": 997, "threads": 2}, {"chunk_size": 300, "max_shard_size": "20KB"}, {"chunk_size": 64}]
    for i, layout in enumerate(layouts):
        other = run(family, tmp_path / f"o{i}", method, params, n=n, weights=weights, **layout)
        assert all(torch.equal(whole[k].view(torch.uint8), other[k].view(torch.uint8)) for k in whole)


# --------------------------------------------------------------------------- defining properties


def test_karcher_of_one_model_is_that_model(family: Family, tmp_path: Path) -> None:
    _, agents = family
    want = tensors(agents[0])
    alone = run(family, tmp_path / "alone", "karcher", n=1, with_base=False)
    assert all(torch.equal(alone[k], want[k]) for k in want)
    based = run(family, tmp_path / "based", "karcher", n=1)  # the base is only the reference: theta_0 + tau_1
    for k in want:
        assert_within_bf16_step(k, based[k], want[k].double())


@pytest.mark.parametrize("method", ["karcher", "multislerp"])
def test_identical_models_merge_to_that_model(method: str, family: Family, tmp_path: Path) -> None:
    base, agents = family
    models = [ModelSpec(path=str(agents[1]), weight=w) for w in ([1.0] * 3 if method == "karcher" else WEIGHTS)]
    for with_base in (True, False):
        cfg = MergeConfig(method=method, base=str(base) if with_base else None, models=models, chunk_size=997)
        merge(cfg, tmp_path / "o", quiet=True, force=True, hashing="none")
        got, want = tensors(tmp_path / "o"), tensors(agents[1])
        for k in want:
            assert_within_bf16_step(k, got[k], want[k].double())
            if want[k].dtype == torch.bfloat16:
                assert torch.equal(got[k], want[k]), k


def test_nuslerp_endpoints_and_slerp(family: Family, tmp_path: Path) -> None:
    _, agents = family
    for weights, end in (([1.0, 0.0], 0), ([0.0, 2.0], 1)):
        out = run(family, tmp_path / f"e{end}", "nuslerp", n=2, weights=weights, with_base=False)
        want = tensors(agents[end])
        for k in want:  # the first model is the reference without a base: exact; the other is theta_0 + tau_1
            assert_within_bf16_step(k, out[k], want[k].double())
            assert torch.equal(out[k], want[k]) or (end == 1 and want[k].dtype == torch.float32), k
    nu = run(family, tmp_path / "nu", "nuslerp", n=2, weights=[0.6, 0.4], with_base=False)
    sl = run(family, tmp_path / "sl", "slerp", {"t": 0.4, "colinear": 0.99999999}, n=2, with_base=False)
    for k in nu:
        assert_within_bf16_step(k, nu[k], sl[k].double())


def test_nuslerp_refuses_three_models_in_one_line(family: Family, tmp_path: Path, capsys: Any) -> None:
    base, agents = family
    argv = ["merge", "--method", "nuslerp", "--base", str(base), "-o", str(tmp_path / "o")]
    assert main([*argv, *[x for a in agents for x in ("--model", str(a))]]) == 2
    err = capsys.readouterr().err.strip()
    assert "nuslerp" in err and "at most 2" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_multislerp_refuses_a_zero_mean_direction() -> None:
    x = torch.randn(50, generator=torch.Generator().manual_seed(4))
    tau = torch.stack([x, -x, torch.randn(50)])
    c = Chunk(
        name="model.norm.weight", start=0, stop=50, base=torch.zeros(50), tau=tau,
        weights=torch.tensor([1.0, 1.0, 0.0]), params=METHODS["multislerp"].defaults(), stats=TensorStats(),
        shape=(50,),
    )  # fmt: skip
    with pytest.raises(MergeError, match=r"model\.norm\.weight"):
        METHODS["multislerp"].kernel(c)
    two = Chunk(**{**c.__dict__, "tau": tau[:2], "weights": torch.tensor([1.0, 1.0])})
    assert not bool(METHODS["multislerp"].kernel(two).any())  # two opposite models: mergekit's linear fallback


def test_multislerp_keeps_a_tensor_no_agent_changed_at_the_base() -> None:
    """Sparse agents (bf16 RL) often leave a tensor untouched: its zero task vectors give zero length, so the base,
    where mergekit raises with three models; one changed agent among them is not refused either."""
    tau = torch.zeros(3, 50)
    c = Chunk(
        name="model.layers.0.input_layernorm.weight", start=0, stop=50, base=torch.ones(50), tau=tau,
        weights=torch.ones(3), params=METHODS["multislerp"].defaults(), stats=TensorStats(), shape=(50,),
    )  # fmt: skip
    assert not bool(METHODS["multislerp"].kernel(c).any())
    x = torch.randn(50, generator=torch.Generator().manual_seed(5))
    one = Chunk(**{**c.__dict__, "tau": torch.stack([torch.zeros(50), x, torch.zeros(50)])})
    torch.testing.assert_close(METHODS["multislerp"].kernel(one), x / 3, rtol=1e-5, atol=1e-7)
    zero_weight = Chunk(**{**c.__dict__, "tau": torch.stack([x, torch.zeros(50), torch.zeros(50)]),
                           "weights": torch.tensor([0.0, 1.0, 1.0])})  # fmt: skip
    assert not bool(METHODS["multislerp"].kernel(zero_weight).any())


# --------------------------------------------------------------------------- the CLI and mergekit YAML


@pytest.mark.parametrize("method", SPHERICAL)
def test_cli_and_mergekit_yaml_agree_with_the_api(method: str, family: Family, tmp_path: Path) -> None:
    base, agents = family
    n = 2 if method == "nuslerp" else 3
    based = method != "karcher"  # karcher works on the raw weights: its mergekit config has no base
    weights = [0.3, 1.0, 0.8][:n] if based else [1.0] * n
    api = run(family, tmp_path / "api", method, n=n, weights=weights, with_base=based)
    flags = ["merge", "--method", method, "--quiet", "-o", str(tmp_path / "flags")]
    flags += [x for a in agents[:n] for x in ("--model", str(a))]
    flags += ["--base", str(base), "--weights", ",".join(map(str, weights))] if based else []
    assert main(flags) == 0
    assert all(torch.equal(api[k], v) for k, v in tensors(tmp_path / "flags").items())
    models = [{"model": str(a), "parameters": {"weight": w}} for a, w in zip(agents[:n], weights, strict=True)]
    doc: dict[str, Any] = {"merge_method": method, "models": models}
    if based:
        doc["base_model"] = str(base)
    else:
        doc["models"] = [{"model": str(a)} for a in agents[:n]]
    (tmp_path / "mk.yaml").write_text(yaml.safe_dump(doc))
    assert main(["merge", str(tmp_path / "mk.yaml"), str(tmp_path / "mk"), "--quiet"]) == 0
    mk = tensors(tmp_path / "mk")
    assert all(torch.equal(api[k], v) for k, v in mk.items())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_far_apart_models_follow_mergekits_iterations(seed: int) -> None:
    """Random, nearly orthogonal models (Karcher iterates, SLERP angles are large), kernels against the references."""
    g = torch.Generator().manual_seed(seed)
    models = [torch.randn(6, 40, generator=g) * s for s in (1.0, 2.0, 0.5)]
    base = torch.randn(6, 40, generator=g) * 0.1
    tau = torch.stack([(m - base).reshape(-1) for m in models])
    w = torch.tensor(WEIGHTS)

    def kernel(method: str, t: torch.Tensor, weights: torch.Tensor, has_base: bool, **params: Any) -> torch.Tensor:
        c = Chunk(
            name="model.layers.0.mlp.up_proj.weight", start=0, stop=240, base=base.reshape(-1), tau=t,
            weights=weights, params={**METHODS[method].defaults(), **params}, stats=TensorStats(), shape=(6, 40),
            has_base=has_base,
        )  # fmt: skip
        return (base.reshape(-1) + METHODS[method].kernel(c)).reshape(6, 40)

    torch.testing.assert_close(kernel("karcher", tau, torch.ones(3), False), karcher_ref(models).float())
    got = kernel("multislerp", tau, w, True)
    torch.testing.assert_close(got, multislerp_ref(models, WEIGHTS, base).float())
    for params in NUSLERP_MODES:
        got = kernel("nuslerp", tau[:2], w[:2], False, **params)
        flatten, rows = params.get("nuslerp_flatten", True), params.get("nuslerp_row_wise", False)
        torch.testing.assert_close(got, nuslerp_ref(0.75, models[0], models[1], flatten, rows).float())
