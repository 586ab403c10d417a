"""Baseline kernels (baselines.py): naive per-element references, identities, chunking and determinism."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from agentmerge import MergeConfig, ModelSpec, merge
from agentmerge.cli import main
from agentmerge.config.schema import config_from_dict
from agentmerge.errors import ConfigError
from agentmerge.methods.deltas import seeded_uniform
from agentmerge.methods.registry import METHODS
from agentmerge.methods.spec import Chunk, TensorSource, TensorStats
from agentmerge.methods.stats import STAT_BLOCK, kth_direct, kth_streamed, kth_value
from agentmerge.methods.ties.kernels import row_length
from agentmerge.synthetic import write_family

NAME = "model.layers.0.mlp.up_proj.weight"
BASELINE_NAMES = ["ties", "dare_linear", "dare_ties", "breadcrumbs", "della", "model_stock", "slerp", "ram_ties"]


# --------------------------------------------------------------------------- helpers


def make_chunk(
    tau: torch.Tensor,
    params: Mapping[str, Any] | None = None,
    *,
    method: str,
    base: torch.Tensor | None = None,
    weights: Sequence[float] | None = None,
    shape: tuple[int, ...] | None = None,
    model_params: Sequence[Mapping[str, Any]] = (),
    seed: int = 0,
    start: int = 0,
    prepared: Any = None,
) -> Chunk:
    """A chunk holding a whole tensor (unless ``start``/``shape`` say otherwise), defaults filled in."""
    n, e = tau.shape
    full = {**METHODS[method].defaults(), **(params or {})}
    mps = tuple({**full, **mp} for mp in model_params)
    return Chunk(
        name=NAME,
        start=start,
        stop=start + e,
        base=torch.zeros(e) if base is None else base,
        tau=tau,
        weights=torch.tensor(weights if weights is not None else [1.0] * n),
        params=full,
        stats=TensorStats(prepared=prepared),
        seed=seed,
        shape=shape if shape is not None else (e,),
        model_params=mps,
    )


def run_chunked(method: str, c: Chunk, size: int) -> torch.Tensor:
    """Run ``method`` over the whole-tensor chunk ``c`` cut into pieces of ``size``, as the driver does."""
    spec = METHODS[method]
    e = c.tau.shape[1]
    if spec.chunk_multiple is not None:
        unit = spec.chunk_multiple(c.shape)
        size = -(-size // unit) * unit
    ranges = [(s, min(s + size, e)) for s in range(0, e, size)]

    def piece(s: int, t: int, prepared: Any = None) -> Chunk:
        return Chunk(
            name=c.name, start=s, stop=t, base=c.base[s:t], tau=c.tau[:, s:t], weights=c.weights, params=c.params,
            stats=TensorStats(prepared=prepared), seed=c.seed, shape=c.shape, model_params=c.model_params,
        )  # fmt: skip

    def read() -> Iterator[Chunk]:
        return (piece(s, t) for s, t in ranges)

    prepared = None
    if spec.prepare is not None and len(ranges) > 1:  # as the driver: one-chunk tensors need no prepare pass
        prepared = spec.prepare(TensorSource(c.name, c.shape, len(ranges), c.params, c.model_params, read))
    return torch.cat([spec.kernel(piece(s, t, prepared)) for s, t in ranges])


def sparse_tau(n: int, e: int, seed: int, density: float = 0.6) -> torch.Tensor:
    """``[N, E]`` random task vectors with exact zeros, repeated magnitudes and mixed signs."""
    g = torch.Generator().manual_seed(seed)
    values = torch.randint(-6, 7, (n, e), generator=g).float() * 0.25
    noise = torch.randn(n, e, generator=g) * 0.01
    keep = torch.rand(n, e, generator=g) < density
    return torch.where(keep, values + torch.where(torch.rand(n, e, generator=g) < 0.5, noise, 0.0), 0.0)


def kth_largest(values: list[float], k: int) -> float:
    return sorted(values, reverse=True)[k - 1] if k > 0 else math.inf


def sign(x: float) -> float:
    return (x > 0) - (x < 0)


def naive_disjoint(vals: list[float], weights: list[float]) -> float:
    """TIES election + disjoint weighted mean for one element."""
    elected = sign(sum(w * v for w, v in zip(weights, vals, strict=True)))
    num = den = 0.0
    for w, v in zip(weights, vals, strict=True):
        if v != 0 and sign(w * v) == elected:
            num += w * v
            den += w
    return num / den if den else 0.0


def naive_ties(tau: list[list[float]], density: list[float], weights: list[float], lam: float) -> list[float]:
    n, e = len(tau), len(tau[0])
    trimmed = []
    for i in range(n):
        t = kth_largest([abs(x) for x in tau[i]], int(density[i] * e))
        trimmed.append([x if abs(x) >= t else 0.0 for x in tau[i]])
    return [lam * naive_disjoint([trimmed[i][p] for i in range(n)], weights) for p in range(e)]


def naive_dare(tau: list[list[float]], u: list[list[float]], p: list[float]) -> list[list[float]]:
    return [
        [x / (1 - p[i]) if u[i][j] >= p[i] else 0.0 for j, x in enumerate(row)] for i, row in enumerate(tau)
    ]  # fmt: skip


def close(a: torch.Tensor, b: Sequence[float], tol: float = 1e-5) -> None:
    torch.testing.assert_close(a, torch.tensor(b, dtype=torch.float32), rtol=tol, atol=tol)


# --------------------------------------------------------------------------- exact selection


@pytest.mark.parametrize("seed", range(2))
def test_radix_select_matches_sorting(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    n, e = 3, 2000
    values = (torch.randint(0, 50, (n, e), generator=g).float() * 0.125) * (torch.rand(n, e, generator=g) < 0.7)
    values[1] = torch.rand(e, generator=g) * 1e-30  # tiny and subnormal magnitudes
    values[2, :7] = math.inf
    ranks = torch.tensor([[1, e // 2, e], [3, 17, e - 1], [0, e + 1, e]])
    pieces = [values[:, s : s + 333] for s in range(0, e, 333)]
    got = kth_streamed(lambda: iter(pieces), lambda d, k: ranks)
    want = kth_direct(values, ranks)
    for i in range(n):
        ordered = sorted(values[i].tolist())
        for j, r in enumerate(ranks[i].tolist()):
            expect = 0.0 if r <= 0 else math.inf if r > e else ordered[r - 1]
            assert got[i, j].item() == want[i, j].item() == pytest.approx(expect, rel=1e-6, abs=0)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from([0.0, 1e-45, 1e-38, 0.5, 0.5000001, 1.0, 3.0, 1e30]), min_size=1, max_size=60),
    st.integers(1, 7),
    st.data(),
)
def test_radix_select_property(values: list[float], piece: int, data: st.DataObject) -> None:
    x = torch.tensor([values], dtype=torch.float32)
    d = x.shape[1]
    rank = data.draw(st.integers(0, d + 1))
    got = kth_streamed(lambda: (x[:, s : s + piece] for s in range(0, d, piece)), lambda n, k: torch.tensor([[rank]]))
    ordered = sorted(x[0].tolist())
    want = 0.0 if rank == 0 else math.inf if rank > d else ordered[rank - 1]
    assert got.item() == want == kth_direct(x, torch.tensor([[rank]])).item()


def test_kth_value_bracket_matches_kthvalue() -> None:
    g = torch.Generator().manual_seed(0)
    cases = [
        torch.rand(300_000, generator=g),
        torch.randint(0, 5, (300_000,), generator=g).float(),  # few distinct values: big ties
        torch.arange(300_000).float().flip(0),  # ordered: a strided sample is maximally regular
        torch.cat([torch.zeros(200_000), torch.rand(100_000, generator=g) * 1e-3]),
    ]
    for x in cases:
        for r in (1, 2, 1000, 150_000, 299_999, 300_000):
            assert kth_value(x, r).item() == torch.kthvalue(x, r).values.item()


# --------------------------------------------------------------------------- kernels against naive loops


@pytest.mark.parametrize("seed", range(3))
def test_ties_naive(seed: int) -> None:
    tau = sparse_tau(3, 257, seed)
    w = [1.0, 0.5, 2.0]
    got = METHODS["ties"].kernel(make_chunk(tau, {"density": 0.3, "lambda": 1.5}, method="ties", weights=w))
    close(got, naive_ties(tau.tolist(), [0.3] * 3, w, 1.5))


def test_ties_per_model_density() -> None:
    tau = sparse_tau(3, 200, 7)
    dens = [1.0, 0.1, 0.5]
    c = make_chunk(tau, method="ties", model_params=[{"density": d} for d in dens])
    close(METHODS["ties"].kernel(c), naive_ties(tau.tolist(), dens, [1.0] * 3, 1.0))


@pytest.mark.parametrize("method", ["dare_linear", "dare_ties"])
def test_dare_naive(method: str) -> None:
    tau = sparse_tau(3, 300, 3)
    p = [0.3, 0.5, 0.7]
    c = make_chunk(tau, {"lambda": 0.8}, method=method, weights=[1.0, 2.0, 0.5], seed=11, start=5000,
                   model_params=[{"p": x} for x in p])  # fmt: skip
    u = seeded_uniform(11, NAME, 5000, 5300, 3).tolist()
    dropped = naive_dare(tau.tolist(), u, p)
    if method == "dare_linear":
        want = [0.8 * sum(w * dropped[i][j] for i, w in enumerate([1.0, 2.0, 0.5])) for j in range(300)]
    else:
        want = naive_ties(dropped, [1.0] * 3, [1.0, 2.0, 0.5], 0.8)
    close(METHODS[method].kernel(c), want)


@pytest.mark.parametrize("seed", range(3))
def test_breadcrumbs_naive(seed: int) -> None:
    tau = sparse_tau(2, 311, seed, density=0.9)
    dens, gam = 0.5, 0.1
    got = METHODS["breadcrumbs"].kernel(
        make_chunk(tau, {"density": dens, "gamma": gam, "lambda": 2.0}, method="breadcrumbs", weights=[1.0, 3.0])
    )
    e = 311
    masks = []
    for row in tau.tolist():
        asc = sorted(abs(x) for x in row)
        k, g = int(dens * e), int(gam * e)
        lo, hi = asc[e - g - k], asc[e - g - 1]  # kept band: ascending positions e-g-k .. e-g-1 (0-based)
        masks.append([x if lo <= abs(x) <= hi else 0.0 for x in row])
    close(got, [2.0 * (masks[0][j] + 3.0 * masks[1][j]) for j in range(e)])


def test_della_naive() -> None:
    rows, length = 5, 40
    tau = sparse_tau(3, rows * length, 5, density=0.9)
    p, eps = [0.4, 0.5, 0.6], [0.2, 0.1, 0.3]
    mps = [{"p": a, "eps": b} for a, b in zip(p, eps, strict=True)]
    c = make_chunk(tau, {"lambda": 1.2}, method="della", shape=(rows, length), seed=3, model_params=mps)
    u = seeded_uniform(3, NAME, 0, rows * length, 3).tolist()
    t = tau.tolist()
    kept = [[0.0] * (rows * length) for _ in range(3)]
    for i in range(3):
        for r in range(rows):
            idx = list(range(r * length, (r + 1) * length))
            order = sorted(idx, key=lambda j, i=i: (abs(t[i][j]), j))
            for rank, j in enumerate(order):
                q = p[i] + eps[i] / 2 - eps[i] * rank / (length - 1)
                kept[i][j] = t[i][j] / (1 - q) if u[i][j] >= q else 0.0
    want = [1.2 * naive_disjoint([kept[i][j] for i in range(3)], [1.0] * 3) for j in range(rows * length)]
    close(METHODS["della"].kernel(c), want)


def test_model_stock_naive() -> None:
    tau = torch.randn(3, 500, generator=torch.Generator().manual_seed(2)) + 0.5
    base = torch.randn(500)
    t = tau.tolist()
    cos = []
    for i in range(3):
        for j in range(i + 1, 3):
            dot = sum(a * b for a, b in zip(t[i], t[j], strict=True))
            cos.append(dot / math.sqrt(sum(a * a for a in t[i]) * sum(b * b for b in t[j])))
    m = sum(cos) / 3
    ratio = 3 * m / (1 + 2 * m)
    got = METHODS["model_stock"].kernel(make_chunk(tau, method="model_stock", base=base))
    close(got, [ratio * sum(t[i][p] for i in range(3)) / 3 for p in range(500)])


@pytest.mark.parametrize("t", [0.25, 0.5, 0.9])
def test_slerp_naive(t: float) -> None:
    g = torch.Generator().manual_seed(4)
    base = torch.randn(300, generator=g)
    tau = torch.randn(2, 300, generator=g)
    a = (base + tau[0]).tolist()
    b = (base + tau[1]).tolist()
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(x * x for x in b))
    omega = math.acos(sum(x * y for x, y in zip(a, b, strict=True)) / (na * nb))
    s0, s1 = math.sin((1 - t) * omega) / math.sin(omega), math.sin(t * omega) / math.sin(omega)
    want = [s0 * x + s1 * y - z for x, y, z in zip(a, b, base.tolist(), strict=True)]
    close(METHODS["slerp"].kernel(make_chunk(tau, {"t": t}, method="slerp", base=base)), want, tol=1e-4)


def test_ram_ties_naive() -> None:
    tau = sparse_tau(3, 400, 9, density=0.5)
    keep, eps = 0.3, 1e-5
    t = tau.tolist()
    active = [[x if abs(x) > eps else 0.0 for x in row] for row in t]
    count = [sum(abs(t[i][p]) > eps for i in range(3)) for p in range(400)]
    shared = [p for p in range(400) if count[p] >= 2]
    thresholds = []
    for i in range(3):
        asc = sorted(abs(active[i][p]) for p in shared)
        r = int(len(shared) * (1 - keep))
        thresholds.append(asc[r - 1] if r > 0 else 0.0)
    want = []
    for p in range(400):
        if count[p] >= 2:
            vals = [active[i][p] if abs(active[i][p]) >= thresholds[i] else 0.0 for i in range(3)]
            want.append(naive_disjoint(vals, [1.0] * 3))
        else:
            want.append(sum(active[i][p] for i in range(3)))
    close(METHODS["ram_ties"].kernel(make_chunk(tau, {"keep": keep}, method="ram_ties")), want)


def test_fisher_naive() -> None:
    g = torch.Generator().manual_seed(1)
    tau = torch.randn(3, 50, generator=g)
    f = torch.rand(3, 50, generator=g) * (torch.rand(3, 50, generator=g) < 0.7)
    f[:, :5] = 0.0  # all-zero Fisher: the floor gives the weighted average
    w = [1.0, 2.0, 0.5]
    c = make_chunk(tau, {"floor": 1e-6}, method="fisher", weights=w)
    c = Chunk(**{**c.__dict__, "extras": {"fisher": f}})
    want = []
    for p in range(50):
        fw = [w[i] * max(f[i, p].item(), 1e-6) for i in range(3)]
        want.append(sum(fw[i] * tau[i, p].item() for i in range(3)) / sum(fw))
    close(METHODS["fisher"].kernel(c), want)


# --------------------------------------------------------------------------- identities


def test_ties_full_density_agreeing_signs_is_disjoint_mean() -> None:
    tau = sparse_tau(3, 300, 1).abs()  # every sign agrees (+ or 0)
    got = METHODS["ties"].kernel(make_chunk(tau, {"density": 1.0}, method="ties"))
    nonzero = (tau != 0).sum(0)
    torch.testing.assert_close(got, torch.where(nonzero > 0, tau.sum(0) / nonzero.clamp(min=1), 0.0))


@pytest.mark.parametrize(
    ("dare", "plain", "extra"), [("dare_linear", "task_arithmetic", {}), ("dare_ties", "ties", {})]
)
def test_dare_p0_is_underlying(dare: str, plain: str, extra: dict[str, Any]) -> None:
    tau = sparse_tau(3, 200, 2)
    params = {"lambda": 0.7, **({"density": 1.0} if plain == "ties" else {})}
    a = METHODS[dare].kernel(make_chunk(tau, {**params, "p": 0.0}, method=dare, weights=[1, 2, 3]))
    b = METHODS[plain].kernel(make_chunk(tau, params, method=plain, weights=[1, 2, 3]))
    assert torch.equal(a, b)


def test_slerp_endpoints_and_identical_models() -> None:
    g = torch.Generator().manual_seed(0)
    base, tau = torch.randn(100, generator=g), torch.randn(2, 100, generator=g)
    for t, i in ((0.0, 0), (1.0, 1)):
        got = METHODS["slerp"].kernel(make_chunk(tau, {"t": t}, method="slerp", base=base))
        assert torch.equal(base + got, base + tau[i])
    same = torch.stack([tau[0], tau[0]])
    got = METHODS["slerp"].kernel(make_chunk(same, {"t": 0.5}, method="slerp", base=base))
    assert torch.equal(base + got, base + tau[0])


def test_model_stock_one_model_returns_it() -> None:
    tau = torch.randn(1, 64)
    assert torch.equal(METHODS["model_stock"].kernel(make_chunk(tau, method="model_stock")), tau[0])


def test_fisher_equal_is_linear() -> None:
    tau = torch.randn(3, 80)
    c = make_chunk(tau, method="fisher", weights=[1.0, 2.0, 3.0])
    f = Chunk(**{**c.__dict__, "extras": {"fisher": torch.full((3, 80), 0.37)}})
    lin = make_chunk(tau, method="linear", weights=[1.0, 2.0, 3.0])
    torch.testing.assert_close(METHODS["fisher"].kernel(f), METHODS["linear"].kernel(lin))


# --------------------------------------------------------------------------- chunking: prepare pass == one chunk


@pytest.mark.parametrize("method", BASELINE_NAMES)
@pytest.mark.parametrize(("size", "agents"), [(1000, 3), (1536, 3), (1001, 6)])
def test_chunked_equals_whole(method: str, size: int, agents: int) -> None:
    n = 2 if method == "slerp" else agents
    rows, length = 12, 333  # 3996 elements: several chunks, rows cut unevenly by the raw sizes
    tau = sparse_tau(n, rows * length, 8)
    base = torch.randn(rows * length, generator=torch.Generator().manual_seed(1))
    params = {"density": 0.3} if method in ("ties", "dare_ties", "breadcrumbs") else {}
    mps = [{"density": 0.2 + 0.1 * i} for i in range(n)] if method == "ties" else ()
    c = make_chunk(tau, params, method=method, base=base, shape=(rows, length), seed=5, model_params=mps)
    whole = METHODS[method].kernel(c)
    assert torch.equal(run_chunked(method, c, size), whole)


def test_chunk_multiples() -> None:
    assert row_length((7, 33)) == 33 and row_length((12,)) == 12
    assert METHODS["model_stock"].chunk_multiple is not None
    assert METHODS["model_stock"].chunk_multiple((5,)) == STAT_BLOCK


# --------------------------------------------------------------------------- full merges: determinism


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    return write_family(tmp_path_factory.mktemp("bl"), "tiny", [0.1, 0.4, 0.5])


def tensors_of(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def same_bytes(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].view(torch.uint8).equal(b[k].view(torch.uint8)) for k in a
    )


def config(method: str, family: tuple[Path, list[Path]], **kw: Any) -> MergeConfig:
    base, agents = family
    models = [ModelSpec(path=str(a)) for a in agents[: 2 if method == "slerp" else 3]]
    return MergeConfig(method=method, base=str(base), models=models, **kw)


@pytest.mark.parametrize("method", BASELINE_NAMES)
def test_merge_deterministic_across_layouts(method: str, family: tuple[Path, list[Path]], tmp_path: Path) -> None:
    params = {"density": 0.5} if method in ("ties", "dare_ties") else {}
    layouts = [
        {"threads": 1},
        {"threads": 2, "chunk_size": 1000, "max_shard_size": "20KB"},
        {"threads": 2, "chunk_size": 1777},
    ]
    results = []
    for i, layout in enumerate(layouts):
        cfg = config(method, family, params=params, seed=3, **layout)
        merge(cfg, tmp_path / f"out{i}", quiet=True)
        results.append(tensors_of(tmp_path / f"out{i}"))
    assert len(list((tmp_path / "out1").glob("*.safetensors"))) > 1  # the shard layout really differs
    assert same_bytes(results[0], results[1]) and same_bytes(results[0], results[2])
    base = tensors_of(family[0])
    assert any(not torch.equal(results[0][k], base[k]) for k in base)  # it did merge something


def test_seed_changes_random_methods(family: tuple[Path, list[Path]], tmp_path: Path) -> None:
    for method in ("dare_linear", "della"):
        merge(config(method, family, seed=0), tmp_path / f"{method}0", quiet=True)
        merge(config(method, family, seed=1), tmp_path / f"{method}1", quiet=True)
        assert not same_bytes(tensors_of(tmp_path / f"{method}0"), tensors_of(tmp_path / f"{method}1"))


def test_override_and_per_model_params(family: tuple[Path, list[Path]], tmp_path: Path) -> None:
    base, agents = family
    over = [{"pattern": "*mlp*", "params": {"density": 1.0}}]
    cfg = config_from_dict(
        {"method": "ties", "base": str(base), "models": [{"path": str(a)} for a in agents],
         "params": {"density": 0.2}, "overrides": over}
    )  # fmt: skip
    merge(cfg, tmp_path / "over", quiet=True)
    merge(config("ties", family, params={"density": 1.0}), tmp_path / "dense", quiet=True)
    merge(config("ties", family, params={"density": 0.2}), tmp_path / "sparse", quiet=True)
    o, d, s = (tensors_of(tmp_path / x) for x in ("over", "dense", "sparse"))
    for k in o:
        assert torch.equal(o[k], d[k] if "mlp" in k else s[k])
    # per-model density 1.0 for every model == global density 1.0
    per = config_from_dict(
        {"method": "ties", "base": str(base), "params": {"density": 0.2},
         "models": [{"path": str(a), "params": {"density": 1.0}} for a in agents]}
    )  # fmt: skip
    merge(per, tmp_path / "per", quiet=True)
    assert same_bytes(tensors_of(tmp_path / "per"), d)


def test_config_checks(family: tuple[Path, list[Path]]) -> None:
    base, agents = family
    models = [{"path": str(a)} for a in agents]
    with pytest.raises(ConfigError, match="per model"):
        config_from_dict({"method": "ties", "base": str(base), "models": [{**models[0], "params": {"lambda": 2}}]})
    with pytest.raises(ConfigError, match="p \\+- eps/2"):
        config_from_dict({"method": "della", "base": str(base), "models": models, "params": {"p": 0.95, "eps": 0.2}})
    with pytest.raises(ConfigError, match="below 1"):
        config_from_dict({"method": "dare_linear", "base": str(base), "models": models, "params": {"p": 1.0}})
    with pytest.raises(ConfigError, match="at most 2"):
        config_from_dict({"method": "slerp", "models": models})
    with pytest.raises(ConfigError, match="Fisher"):
        config_from_dict({"method": "fisher", "models": models})


# --------------------------------------------------------------------------- every method from YAML and flags

CLI_PARAMS: dict[str, list[str]] = {
    "ties": ["density=0.4", "lambda=1.1"],
    "dare_linear": ["p=0.3"],
    "dare_ties": ["p=0.3", "density=0.8"],
    "breadcrumbs": ["density=0.8", "gamma=0.05"],
    "della": ["p=0.4", "eps=0.2"],
    "model_stock": [],
    "slerp": ["t=0.3"],
    "ram_ties": ["keep=0.2"],
}


@pytest.mark.parametrize("method", BASELINE_NAMES)
def test_cli_flags_and_yaml_agree(method: str, family: tuple[Path, list[Path]], tmp_path: Path) -> None:
    base, agents = family
    used = agents[: 2 if method == "slerp" else 3]
    flags = ["merge", "--method", method, "--base", str(base), "--quiet", "--seed", "2"]
    flags += [x for a in used for x in ("--model", str(a))]
    flags += [x for p in CLI_PARAMS[method] for x in ("--param", p)]
    assert main([*flags, "-o", str(tmp_path / "flags")]) == 0
    params = {k: float(v) for k, v in (p.split("=") for p in CLI_PARAMS[method])}
    doc = {"method": method, "base": str(base), "models": [str(a) for a in used], "params": params, "seed": 2}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(doc))
    assert main(["merge", str(tmp_path / "c.yaml"), str(tmp_path / "yaml"), "--quiet"]) == 0
    assert same_bytes(tensors_of(tmp_path / "flags"), tensors_of(tmp_path / "yaml"))


def test_methods_listed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    for name in [*BASELINE_NAMES, "fisher"]:
        assert f"{name}:" in out


@pytest.mark.parametrize("method", ["dare_linear", "della"])
def test_slicing_does_not_change_results(method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    tau = sparse_tau(3, 24 * 50, 6)
    c = make_chunk(tau, method=method, shape=(24, 50), seed=4)
    whole = METHODS[method].kernel(c)
    monkeypatch.setattr("agentmerge.methods.ties.kernels.SLICE", 120)
    assert torch.equal(METHODS[method].kernel(c), whole)
