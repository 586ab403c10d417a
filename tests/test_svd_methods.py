"""The SVD methods (tsv, iso_c, iso_cts, cart, resmerge) and SVC calibration against slow literal references.

``svd_reference`` follows the reference code line by line in float64; here every kernel is checked against it
on random matrices, and every merge (Python API and CLI) on tiny real layouts (Qwen2 with tied embeddings,
Llama untied and tied; bf16 and fp32) to one bf16 rounding step; then the defining properties, the whole-tensor
plan (one chunk, bytes independent of the chunk size), the dry run's figures and the refusals.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

import svd_reference as ref
from agentmerge import MergeConfig, ModelSpec, merge
from agentmerge.cli import main
from agentmerge.errors import ConfigError, MergeError
from agentmerge.methods.registry import METHODS
from agentmerge.methods.spec import Chunk
from agentmerge.synthetic import write_family
from fieldrefs import tensors as load

SVD_METHODS = ["tsv", "iso_c", "iso_cts", "cart", "resmerge"]
RES = {"rank_topk": 1, "beta_min": 0.7, "beta_max": 1.0, "head_ratio_budget": 0.2}
T = torch.Tensor


# --------------------------------------------------------------------------- helpers


@pytest.fixture(autouse=True)
def _one_thread() -> Any:
    """The float64 references on one torch thread: small LAPACK calls on several threads of a shared, loaded
    machine are many times slower (the merges set their own threads)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def chunk(name: str, taus: T, method: str, params: Mapping[str, Any] | None = None, **extra: Any) -> Chunk:
    """A whole-tensor chunk of ``taus [N, m, n]`` (float32) with the method's defaults."""
    n = taus.shape[0]
    shape = tuple(taus.shape[1:])
    return Chunk(
        name=name,
        start=0,
        stop=math.prod(shape),
        base=torch.zeros(math.prod(shape)),
        tau=taus.reshape(n, -1).float(),
        weights=torch.ones(n),
        params={**METHODS[method].defaults(), **(params or {})},
        shape=shape,
        **extra,
    )


def kernel(method: str, name: str, taus: T, params: Mapping[str, Any] | None = None) -> T:
    c = chunk(name, taus, method, params)
    return METHODS[method].kernel(c).view(c.shape).double()


def random_taus(n: int, shape: tuple[int, ...], seed: int) -> T:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, *shape, generator=g, dtype=torch.float64) * 1e-2


def bf16_step(x: T) -> T:
    """The spacing of bfloat16 numbers at |x| (8 significant bits)."""
    return torch.pow(2.0, torch.floor(torch.log2(x.abs().clamp_min(2.0**-126))) - 7)


def assert_within_bf16_step(got: Mapping[str, T], want: Mapping[str, T], base: Mapping[str, T]) -> None:
    """Each output element within one bf16 rounding step of the reference, the step taken at the size of the
    weights involved (the reference value or the base weight, whichever is larger), plus the float32 noise of
    an SVD, 1e-5 of the tensor's largest merged delta (it matters only where a merge cancels a weight to ~0)."""
    assert got.keys() == want.keys()
    for name, w in want.items():
        b = base[name].double()
        diff = (got[name].double() - w).abs()
        bad = diff > bf16_step(torch.maximum(w.abs(), b.abs())) + 1e-5 * (w - b).abs().max()
        assert not bad.any(), f"{name}: {int(bad.sum())} of {w.numel()} off by more than one bf16 step"


def merge_api(method: str, base: Path, agents: list[Path], out: Path, **cfg: Any) -> dict[str, T]:
    config = MergeConfig(method=method, base=str(base), models=[ModelSpec(path=str(a)) for a in agents], **cfg)
    merge(config, out, quiet=True, hashing="none")
    return load(out)


# --------------------------------------------------------------------------- tiny real layouts


def llama_family(root: Path, dtype: torch.dtype, tied: bool, n: int = 3) -> tuple[Path, list[Path]]:
    """A one-layer Llama base (untied or tied embeddings) and ``n`` agents with dense random task vectors."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=40,
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=tied,
    )
    torch.manual_seed(0)
    base = LlamaForCausalLM(config).to(dtype)
    base.save_pretrained(root / "base")
    agents = []
    for i in range(n):
        agent = LlamaForCausalLM(config).to(dtype)
        agent.load_state_dict(base.state_dict())
        g = torch.Generator().manual_seed(10 + i)
        with torch.no_grad():
            for p in agent.parameters():
                p.add_((torch.randn(p.shape, generator=g) * 2e-2).to(dtype))
        agent.save_pretrained(root / f"a{i}")
        agents.append(root / f"a{i}")
    return root / "base", agents


LAYOUTS = ["qwen2-tied", "llama", "llama-tied"]


Family = tuple[Path, list[Path]]


def write_layout(root: Path, layout: str, dtype: torch.dtype, n: int = 3) -> Family:
    if layout == "qwen2-tied":
        return write_family(root, "tiny", [0.3, 0.45, 0.6, 0.5][:n], seed=5, dtype=dtype, delta_std=2e-2)
    return llama_family(root, dtype, tied=layout == "llama-tied", n=n)


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``families(layout, dtype, n=3)``: a base and agents in that layout, written once per module (read-only)."""
    made: dict[tuple[str, torch.dtype, int], Family] = {}

    def get(layout: str, dtype: torch.dtype, n: int = 3) -> Family:
        key = (layout, dtype, n)
        if key not in made:
            made[key] = write_layout(tmp_path_factory.mktemp(layout), layout, dtype, n)
        return made[key]

    return get


# --------------------------------------------------------------------------- kernels against the references

NAMES = {
    "attn": "model.layers.0.self_attn.q_proj.weight",
    "mlp": "model.layers.0.mlp.down_proj.weight",
    "other": "model.layers.0.visual.proj.weight",
}


def reference_delta(method: str, name: str, taus: T, params: Mapping[str, Any]) -> T:
    full = METHODS[method].canonical({**METHODS[method].defaults(), **params})
    base = torch.zeros(taus.shape[1:], dtype=torch.float64)
    return ref.merged_delta(method, name, base, list(taus), full)


@pytest.mark.parametrize("method", SVD_METHODS)
@pytest.mark.parametrize("shape", [(24, 24), (40, 16), (12, 36)])
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_kernel_matches_reference(method: str, shape: tuple[int, int], n: int) -> None:
    taus = random_taus(n, shape, seed=n * 100 + shape[0])
    for key, name in NAMES.items():
        want = reference_delta(method, name, taus, {})
        got = kernel(method, name, taus)
        assert (got - want).abs().max() <= 1e-4 * want.abs().max() + 1e-12, (key, float((got - want).abs().max()))


@pytest.mark.parametrize(
    ("method", "params"),
    [
        ("tsv", {"alpha": 0.7}),
        ("iso_c", {"alpha": 1.5}),
        ("iso_cts", {"common_space_fraction": 0.5, "alpha": 0.9}),
        ("iso_cts", {"common_space_fraction": 1.0}),
        ("iso_cts", {"common_space_fraction": 0.1}),
        ("cart", {"prior": 1.5, "rank_ratio": 0.3}),
        ("cart", {"rank_ratio": 0.0}),
        ("resmerge", {"rank_topk": 3, "beta_min": 0.2, "head_ratio_budget": 0.5}),
        ("resmerge", {"rank_topk": 0}),
    ],
)
def test_kernel_parameters_match_reference(method: str, params: dict[str, Any]) -> None:
    taus = random_taus(3, (30, 20), seed=7)
    for name in NAMES.values():
        want = reference_delta(method, name, taus, params)
        got = kernel(method, name, taus, params)
        assert (got - want).abs().max() <= 1e-4 * want.abs().max() + 1e-12


@pytest.mark.parametrize("case", ["coherent", "opposite", "one zero", "all zero"])
def test_resmerge_branches_match_reference(case: str) -> None:
    """Agreeing residuals (the c^beta |R| q branch), cancelling ones (|q_sum| ~ 0: the mean), zero task vectors."""
    g = torch.Generator().manual_seed(3)
    shared = torch.randn(20, 20, generator=g, dtype=torch.float64)
    noise = [0.3 * torch.randn(20, 20, generator=g, dtype=torch.float64) for _ in range(3)]
    taus = {
        "coherent": torch.stack([shared + e for e in noise]),
        "opposite": torch.stack([shared, -shared]),
        "one zero": torch.stack([shared, torch.zeros(20, 20), shared + noise[0]]),
        "all zero": torch.zeros(2, 20, 20, dtype=torch.float64),
    }[case]
    for name in NAMES.values():
        want = reference_delta("resmerge", name, taus, {})
        got = kernel("resmerge", name, taus)
        assert (got - want).abs().max() <= 1e-4 * want.abs().max() + 1e-7


def test_svc_kernel_matches_reference() -> None:
    from agentmerge.methods.svc import svc

    taus = random_taus(3, (30, 20), seed=9)
    for alpha in (0.1, 0.5, 1.0):
        for delta in (taus.sum(0) * 0.3, ref.tsv(list(taus), 1.0), ref.resmerge(NAMES["mlp"], list(taus), RES)):
            c = chunk(NAMES["attn"], taus, "task_arithmetic", {"svc_alpha": alpha})
            got = svc(c, delta.float().reshape(-1)).view(30, 20).double()
            want = ref.svc(list(taus), delta, alpha)
            assert (got - want).abs().max() <= 1e-4 * want.abs().max()


def test_kernels_leave_the_task_vectors_alone() -> None:
    taus = random_taus(3, (16, 12), seed=1)
    for method in SVD_METHODS:
        c = chunk(NAMES["mlp"], taus, method)
        before = c.tau.clone()
        METHODS[method].kernel(c)
        assert torch.equal(c.tau, before), method


def test_a_kernel_given_part_of_a_matrix_refuses() -> None:
    taus = random_taus(2, (8, 8), seed=0).reshape(2, -1).float()
    part = Chunk(
        name=NAMES["attn"], start=0, stop=32, base=torch.zeros(32), tau=taus[:, :32], weights=torch.ones(2),
        params=METHODS["tsv"].defaults(), shape=(8, 8),
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="one chunk"):
        METHODS["tsv"].kernel(part)


# --------------------------------------------------------------------------- merges on real layouts

MERGE_CASES = [
    ("tsv", {}),
    ("iso_c", {"alpha": 1.2}),
    ("iso_cts", {}),
    ("cart", {"rank_ratio": 0.3}),
    ("resmerge", {}),
    ("tsv", {"calibrate": "svc"}),
    ("task_arithmetic", {"lambda": 0.5, "calibrate": "svc", "svc_alpha": 0.3}),
    ("iso_c", {"svd_embeddings": False}),
]


def expected(method: str, base: Path, agents: list[Path], params: Mapping[str, Any]) -> dict[str, T]:
    full = METHODS[method].canonical({**METHODS[method].defaults(), **params})
    return ref.merge_model(method, load(base), [load(a) for a in agents], full)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_merges_match_reference(families: Any, tmp_path: Path, layout: str, dtype: torch.dtype) -> None:
    base, agents = families(layout, dtype)
    for i, (method, params) in enumerate(MERGE_CASES):
        got = merge_api(method, base, agents, tmp_path / f"out{i}", params=params)
        want = expected(method, base, agents, params)
        assert_within_bf16_step(got, want, load(base))
        assert all(t.dtype == dtype for t in got.values())


def test_cli_merge_equals_the_api(families: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base, agents = families("llama", torch.bfloat16)
    api = merge_api("iso_cts", base, agents, tmp_path / "api", params={"common_space_fraction": 0.6})
    argv = ["merge", "--method", "iso_cts", "--base", str(base), "-o", str(tmp_path / "cli")]
    argv += [x for a in agents for x in ("--model", str(a))] + ["--param", "common_space_fraction=0.6", "--quiet"]
    assert main(argv) == 0
    cli = load(tmp_path / "cli")
    assert all(torch.equal(api[k], cli[k]) for k in api)


def test_methods_are_listed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    for name in SVD_METHODS:
        assert f"\n{name}: " in f"\n{out}"
    assert "calibrate" in out and "svc_floor" in out


@pytest.mark.parametrize(
    ("method", "params", "why"),
    [(m, {}, "mergekit has no counterpart") for m in SVD_METHODS]
    + [("task_arithmetic", {"calibrate": "svc"}, "calibrate = 'svc' cannot be written for mergekit")],
)
def test_mergekit_export_refuses_svd_methods_and_svc(method: str, params: dict[str, Any], why: str) -> None:
    from agentmerge.config.mergekit_export import to_mergekit

    models = [ModelSpec(path="a"), ModelSpec(path="b")]
    with pytest.raises(ConfigError, match=why):
        to_mergekit(MergeConfig(method=method, base="base", models=models, params=params))
    to_mergekit(MergeConfig(method="task_arithmetic", base="base", models=models))  # the same, without SVC


# --------------------------------------------------------------------------- defining properties


def deltas_of(out: Mapping[str, T], base: Mapping[str, T]) -> dict[str, T]:
    return {k: out[k].double() - base[k].double() for k in out if out[k].dim() == 2}


@pytest.mark.parametrize("method", ["iso_c", "iso_cts"])
def test_iso_flattens_every_singular_value(families: Any, tmp_path: Path, method: str) -> None:
    base, agents = families("llama", torch.float32)
    out = merge_api(method, base, agents, tmp_path / "o")
    for name, delta in deltas_of(out, load(base)).items():
        s = torch.linalg.svdvals(delta)
        assert float(s.max() - s.min()) <= 1e-4 * float(s.max()), name


def test_iso_cts_of_one_model_is_iso_c() -> None:
    taus = random_taus(1, (24, 16), seed=4)
    assert torch.allclose(kernel("iso_cts", NAMES["mlp"], taus), kernel("iso_c", NAMES["mlp"], taus), atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_tsv_of_one_model_is_that_model(families: Any, tmp_path: Path, dtype: torch.dtype) -> None:
    base, agents = families("qwen2-tied", dtype, n=1)
    out, agent = merge_api("tsv", base, agents, tmp_path / "o"), load(agents[0])
    assert_within_bf16_step(out, {k: v.double() for k, v in agent.items()}, load(base))
    if dtype == torch.bfloat16:  # float32 noise of the SVDs rounds away: nearly every weight is the agent's
        same = sum(int((out[k] == agent[k]).sum()) for k in out) / sum(v.numel() for v in out.values())
        assert same > 0.99


def test_tsv_of_orthogonal_rank_r_task_vectors_is_their_sum() -> None:
    g = torch.Generator().manual_seed(2)
    u = torch.linalg.qr(torch.randn(24, 24, generator=g, dtype=torch.float64))[0]
    v = torch.linalg.qr(torch.randn(18, 18, generator=g, dtype=torch.float64))[0]
    r = 6  # k = 18, N = 3
    taus = torch.stack(
        [(u[:, i * r : (i + 1) * r] * torch.rand(r, generator=g, dtype=torch.float64)) @ v[:, i * r : (i + 1) * r].T for i in range(3)]
    )  # fmt: skip
    assert torch.allclose(kernel("tsv", NAMES["attn"], taus), taus.sum(0), atol=1e-6)


def test_tsv_ignores_the_signs_of_singular_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    import agentmerge.methods.svd.kernels as spectral

    taus = random_taus(3, (20, 14), seed=6)
    plain = kernel("tsv", NAMES["attn"], taus)
    real = spectral.svd

    def flipped(a: T) -> tuple[T, T, T]:
        u, s, vh = real(a)
        sign = torch.where(torch.arange(s.numel()) % 2 == 0, -1.0, 1.0)
        return u * sign, s, vh * sign[:, None]

    monkeypatch.setattr(spectral, "svd", flipped)
    assert torch.allclose(kernel("tsv", NAMES["attn"], taus), plain, atol=1e-6)


def test_cart_is_the_average_at_full_rank_and_for_two_models(families: Any, tmp_path: Path) -> None:
    base, agents = families("llama", torch.float32)
    average = {k: v.double() for k, v in merge_api("linear", base, agents, tmp_path / "avg").items()}
    full = merge_api("cart", base, agents, tmp_path / "full", params={"rank_ratio": 1.0, "prior": 3.0})
    assert_within_bf16_step(full, average, load(base))
    taus = random_taus(2, (20, 12), seed=8)  # c_2 = -c_1: their low-rank parts cancel at any rank
    assert torch.allclose(kernel("cart", NAMES["mlp"], taus, {"prior": 2.0}), taus.mean(0), atol=1e-6)


def test_resmerge_of_one_model_adds_a_head_correction() -> None:
    taus = random_taus(1, (20, 16), seed=3)
    u, s, vh = torch.linalg.svd(taus[0], full_matrices=False)
    head = s[0] * torch.outer(u[:, 0], vh[0])
    residual = taus[0] - head
    want = residual + 0.2 * residual.norm() * head / head.norm()
    got = kernel("resmerge", NAMES["mlp"], taus)
    assert torch.allclose(got, want, atol=1e-7)
    assert not torch.allclose(got, taus[0], atol=1e-4)


def test_svc_leaves_one_model_and_undoes_identical_ones() -> None:
    from agentmerge.methods.svc import svc

    tau = random_taus(1, (20, 12), seed=5)
    one = chunk(NAMES["attn"], tau, "task_arithmetic", {"svc_alpha": 0.5})
    assert torch.allclose(svc(one, one.tau[0].clone()).double(), tau.reshape(-1), atol=1e-7)
    same = tau.expand(3, 20, 12)
    three = chunk(NAMES["attn"], same, "task_arithmetic", {"svc_alpha": 0.1})
    assert torch.allclose(svc(three, 3 * three.tau[0]).double(), tau.reshape(-1), atol=1e-7)


# --------------------------------------------------------------------------- plan: whole tensors, threads, bytes


def plan_of(base: Path, agents: list[Path], method: str, **cfg: Any) -> Any:
    from agentmerge.engine.inputs import Inputs
    from agentmerge.engine.merge_plan import make_plan

    config = MergeConfig(method=method, base=str(base), models=[ModelSpec(path=str(a)) for a in agents], **cfg)
    inputs = Inputs.for_merge(config)
    try:
        return make_plan(config, inputs.reference, len(agents), config.threads or 2, inputs.vocab)
    finally:
        inputs.close()


def test_matrices_are_one_chunk_and_bytes_do_not_depend_on_chunking(families: Any, tmp_path: Path) -> None:
    base, agents = families("qwen2-tied", torch.bfloat16)
    plan = plan_of(base, agents, "tsv", chunk_size=7)
    assert all(len(j.chunks) == 1 for j in plan.jobs if j.whole)
    assert {j.name for j in plan.jobs if j.whole} == {j.name for j in plan.jobs if len(j.shape) == 2}
    assert any(len(j.chunks) > 1 for j in plan.jobs if not j.whole)
    one = merge_api("tsv", base, agents, tmp_path / "a", params={"calibrate": "svc"}, chunk_size=7)
    two = merge_api("tsv", base, agents, tmp_path / "b", params={"calibrate": "svc"})
    again = merge_api("tsv", base, agents, tmp_path / "c", params={"calibrate": "svc"})
    assert all(torch.equal(one[k], two[k]) and torch.equal(two[k], again[k]) for k in one)


def test_large_matrices_run_alone_after_the_pool(families: Any, tmp_path: Path) -> None:
    base, agents = families("qwen2-tied", torch.bfloat16)
    plan = plan_of(base, agents, "iso_c", max_memory="40KB", threads=2)
    alone = [j.name for j in plan.jobs if plan.alone(j)]
    assert "model.embed_tokens.weight" in alone and len(alone) < len(plan.whole_jobs)
    small = merge_api("iso_c", base, agents, tmp_path / "a", max_memory="40KB", threads=1)
    pooled = merge_api("iso_c", base, agents, tmp_path / "b", threads=1)
    assert all(torch.equal(small[k], pooled[k]) for k in small)


def test_svd_embeddings_false_leaves_the_embeddings_to_the_mean(families: Any, tmp_path: Path) -> None:
    base, agents = families("llama", torch.bfloat16)
    plan = plan_of(base, agents, "tsv", params={"svd_embeddings": False, "calibrate": "svc"})
    whole = {j.name for j in plan.jobs if j.whole}
    assert "model.embed_tokens.weight" not in whole and "lm_head.weight" not in whole
    assert "model.layers.0.mlp.up_proj.weight" in whole
    assert next(j for j in plan.jobs if j.name == "lm_head.weight").steps == ()


def test_lines_scales_the_calibrated_delta(families: Any, tmp_path: Path) -> None:
    """Post-steps run in order: SVC on the method's delta, then LiNeS on SVC's (its alpha from a pass that sees
    SVC's delta, not task arithmetic's closed form)."""
    import json

    from agentmerge.methods.lines import depth_scale, layer_count

    base, agents = families("qwen2-tied", torch.float32)
    b = load(base)
    svc = {"lambda": 0.5, "calibrate": "svc"}
    calibrated = merge_api("task_arithmetic", base, agents, tmp_path / "svc", params=svc)
    fixed = merge_api(
        "task_arithmetic", base, agents, tmp_path / "f", params={**svc, "lines_beta": 0.5, "lines_alpha": 0.3}
    )
    layers = layer_count(b)
    assert layers >= 2
    for k in b:
        assert torch.equal(fixed[k], (calibrated[k] - b[k]).mul_(depth_scale(k, layers, 0.3, 0.5)).add_(b[k])), k
    merge_api("task_arithmetic", base, agents, tmp_path / "auto", params={**svc, "lines_beta": 0.5})
    alpha = json.loads((tmp_path / "auto" / "merge.json").read_text())["lines"]["reference_alpha"]
    models = [load(a) for a in agents]
    summed = sum(float(sum(m[k].double() - b[k].double() for m in models).abs().sum()) for k in b)
    merged = sum(float((calibrated[k].double() - b[k].double()).abs().sum()) for k in b)
    assert alpha == pytest.approx(summed / (len(agents) * merged), rel=1e-5)
    assert alpha != pytest.approx(1.0 / (len(agents) * 0.5), rel=1e-3)  # not the closed form of plain TA


# --------------------------------------------------------------------------- bad input, warnings


def raw_family(root: Path, shapes: Mapping[str, tuple[int, ...]], update: Any, n: int = 3) -> tuple[Path, list[Path]]:
    """A base of the given tensors and ``n`` agents ``base + update(name, tensor, i)``, float32, with config.json."""
    g = torch.Generator().manual_seed(0)
    base = {k: torch.randn(s, generator=g) for k, s in shapes.items()}
    folders = []
    for i, weights in enumerate([base, *({k: v + update(k, v, i) for k, v in base.items()} for i in range(n))]):
        folder = root / ("base" if i == 0 else f"a{i}")
        folder.mkdir(parents=True)
        save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
        (folder / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}')
        folders.append(folder)
    return folders[0], folders[1:]


def noise(name: str, value: T, i: int) -> T:
    return torch.randn(value.shape, generator=torch.Generator().manual_seed(i)) * 1e-2


EXPERTS = {"model.layers.0.mlp.experts.weight": (2, 8, 8), "model.layers.0.mlp.up_proj.weight": (8, 8)}


@pytest.mark.parametrize("method", ["resmerge", "cart"])
def test_three_dimensional_tensors_are_refused_before_writing(tmp_path: Path, method: str) -> None:
    base, agents = raw_family(tmp_path, EXPERTS, noise)
    with pytest.raises(MergeError, match=r"model\.layers\.0\.mlp\.experts\.weight.*\[2, 8, 8\]"):
        merge_api(method, base, agents, tmp_path / "o")
    assert not (tmp_path / "o").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".o.")]
    merge_api("tsv", base, agents, tmp_path / "tsv")  # TSV-M takes the mean of a 3-D tensor


def test_iso_cts_refuses_a_negative_common_space(tmp_path: Path) -> None:
    base, agents = raw_family(tmp_path, {"model.layers.0.mlp.up_proj.weight": (32, 32)}, noise)
    with pytest.raises(MergeError, match="negative common space"):
        merge_api("iso_cts", base, agents, tmp_path / "o", params={"common_space_fraction": 0.0})
    assert not (tmp_path / "o").exists()


def test_calibration_needs_a_base() -> None:
    with pytest.raises((ConfigError, ValueError), match="needs a base"):
        MergeConfig(method="linear", models=[ModelSpec(path="a"), ModelSpec(path="b")], params={"calibrate": "svc"})


def rank_one(name: str, value: T, i: int) -> T:
    if value.dim() != 2:
        return torch.zeros_like(value)
    g = torch.Generator().manual_seed(i)
    return torch.outer(torch.randn(value.shape[0], generator=g), torch.randn(value.shape[1], generator=g)) * 1e-2


def test_iso_c_warns_about_a_low_rank_sum(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shapes = {"model.layers.0.self_attn.q_proj.weight": (8, 8), "model.layers.0.mlp.up_proj.weight": (12, 8)}
    base, agents = raw_family(tmp_path, shapes, rank_one)
    config = MergeConfig(method="iso_c", base=str(base), models=[ModelSpec(path=str(a)) for a in agents])
    result = merge(config, tmp_path / "o", quiet=True, hashing="none")
    assert len(result.warnings) == 1 and "iso_c" in result.warnings[0] and "2 tensors" in result.warnings[0]
    assert "iso_c" in (tmp_path / "o" / "merge.json").read_text()
    argv = ["merge", "--method", "iso_c", "--base", str(base), "-o", str(tmp_path / "cli")]
    assert main([*argv, *(x for a in agents for x in ("--model", str(a)))]) == 0
    assert "warning: iso_c: the sum of the task vectors is of rank below" in capsys.readouterr().err
    dense, more = raw_family(tmp_path / "dense", shapes, noise)
    quiet = merge(MergeConfig(method="iso_c", base=str(dense), models=[ModelSpec(path=str(a)) for a in more]),
                  tmp_path / "d", quiet=True, hashing="none")  # fmt: skip
    assert quiet.warnings == []


def test_svc_after_iso_c_warns_that_it_is_not_unique(tmp_path: Path) -> None:
    base, agents = raw_family(tmp_path, {"model.layers.0.mlp.up_proj.weight": (12, 8)}, noise)
    config = MergeConfig(
        method="iso_c", base=str(base), models=[ModelSpec(path=str(a)) for a in agents], params={"calibrate": "svc"}
    )
    result = merge(config, tmp_path / "o", quiet=True, hashing="none")
    assert any(w.startswith("svc: the merged delta's singular values are all equal") for w in result.warnings)


# --------------------------------------------------------------------------- the dry run


def test_dry_run_states_memory_and_svd_time(families: Any, tmp_path: Path) -> None:
    from agentmerge.engine.merge_dryrun import plan_merge

    base, agents = families("llama", torch.bfloat16)
    models = [ModelSpec(path=str(a)) for a in agents]
    full = plan_merge(MergeConfig(method="tsv", base=str(base), models=models), tmp_path / "o")
    skip = plan_merge(
        MergeConfig(method="tsv", base=str(base), models=models, params={"svd_embeddings": False}), tmp_path / "o"
    )
    assert "whole tensors (SVD): 9, one chunk each" in full.text()
    assert "svd_embeddings: false skips them" in full.text() and "svd_embeddings" not in skip.text()
    assert full.svd_seconds is not None and skip.svd_seconds is not None and full.svd_vocab_seconds is not None
    assert skip.svd_seconds == pytest.approx(full.svd_seconds - full.svd_vocab_seconds)
    assert full.whole is not None and full.whole["largest_bytes"] >= 40 * 16 * 4 * (3 + 1)
    assert not (tmp_path / "o").exists()


def test_dry_run_counts_the_svds_of_lines_alpha_pass(families: Any, tmp_path: Path) -> None:
    """LiNeS's reference alpha runs the kernels (and their SVDs) over the model once before the write pass."""
    from agentmerge.engine.merge_dryrun import plan_merge

    base, agents = families("qwen2-tied", torch.bfloat16)
    models = [ModelSpec(path=str(a)) for a in agents]
    once = plan_merge(MergeConfig(method="iso_c", base=str(base), models=models), tmp_path / "o", probe=False)
    lines = MergeConfig(method="iso_c", base=str(base), models=models, params={"lines_beta": 0.5})
    twice = plan_merge(lines, tmp_path / "o")
    assert once.whole is not None and twice.whole is not None and twice.passes == once.passes + 1
    assert twice.whole["flops"] == 2 * once.whole["flops"] and "each twice" in twice.text()


def test_tsv_warns_when_a_matrix_has_fewer_directions_than_models() -> None:
    said: list[str] = []
    c = chunk(NAMES["attn"], random_taus(3, (2, 8), seed=1), "tsv", warn=said.append)
    assert torch.equal(METHODS["tsv"].kernel(c), torch.zeros(16))
    assert len(said) == 1 and said[0].startswith("tsv: min(m, n) is below the number of models")


def test_an_svd_that_fails_to_converge_is_retried_in_float64(monkeypatch: pytest.MonkeyPatch) -> None:
    """LAPACK's float32 divide and conquer sometimes gives up on clustered singular values: float64 takes over."""
    import agentmerge.methods.linalg as spectral

    real = torch.linalg.svd

    def flaky(a: T, full_matrices: bool = True) -> Any:
        if a.dtype == torch.float32:
            raise spectral.LINALG_ERROR("linalg.svd: The algorithm failed to converge")
        return real(a, full_matrices=full_matrices)

    a = random_taus(1, (20, 12), seed=2)[0].float()
    monkeypatch.setattr(torch.linalg, "svd", flaky)
    for m in (a, a.T):
        u, s, vh = spectral.svd(m)
        assert u.dtype == s.dtype == vh.dtype == torch.float32
        assert torch.allclose((u * s) @ vh, m, atol=1e-6)


@pytest.mark.parametrize("size", [3e19, 1e20, 1e30])
def test_svc_of_huge_task_vectors_matches_the_float64_reference(size: float) -> None:
    """Issue 42: u^T tau was squared in float32, so task vectors above ~1e19 overflowed every response's square
    (s_r^i -> 0, gamma -> 1 / alpha): the calibration must stay the float64 reference's, scale for scale."""
    from agentmerge.methods.svc import svc

    taus = random_taus(3, (30, 20), seed=11)
    taus = taus * (size / float(taus.abs().max()))
    for alpha in (0.1, 0.5):
        delta = taus.sum(0) * 0.3
        c = chunk(NAMES["attn"], taus, "task_arithmetic", {"svc_alpha": alpha})
        got = svc(c, delta.float().reshape(-1)).view(30, 20).double()
        want = ref.svc(list(taus), delta, alpha)
        assert torch.isfinite(got).all()
        assert (got - want).abs().max() <= 1e-4 * want.abs().max()
