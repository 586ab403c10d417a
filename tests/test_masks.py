"""Mask rules (grid of ulps, percentile, valley) against naive per-element references, and their defining properties."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from agentmerge import MergeConfig, ModelSpec, merge
from agentmerge.cli import main
from agentmerge.config.param_table import resolve_record
from agentmerge.engine.counting import mask_levels, overlap_stats
from agentmerge.engine.inputs import Inputs
from agentmerge.engine.merge_plan import make_plan
from agentmerge.methods.deltas import update_mask
from agentmerge.methods.fused.jit import available
from agentmerge.methods.masks import (
    GRIDS,
    VALLEY_SAMPLE,
    Levels,
    levels_record,
    short_float32,
    tensor_levels,
    tensor_mask,
    threshold_summary,
    ulp,
    valley_threshold,
)
from agentmerge.methods.ram.kernels import ram_lambdas
from agentmerge.methods.registry import METHODS
from agentmerge.methods.spec import Chunk, MaskRule, TensorStats, mask_rule

# --------------------------------------------------------------------------- naive references


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def naive_ulp(x: float, grid: str) -> float:
    """Spacing of the grid just below |x|: 2**(E - p + 1) with 2**E < |x| <= 2**(E+1), E >= e_min."""
    p, e_min = GRIDS[grid]
    a = abs(x)
    e = e_min
    while a > 2.0 ** (e + 1):
        e += 1
    return 2.0 ** (e - p + 1)


def naive_mask(
    tau: list[list[float]], base: list[float], rule: MaskRule, levels: list[float] | None
) -> list[list[bool]]:
    out = []
    for i, row in enumerate(tau):
        line = []
        for j, t in enumerate(row):
            if rule.dtype != "none":
                line.append(abs(t) >= rule.ulps * naive_ulp(base[j], rule.dtype))
            elif rule.rule == "fixed":
                line.append(abs(t) > f32(rule.epsilon))
            else:
                assert levels is not None
                line.append(abs(t) > levels[i])
        out.append(line)
    return out


def naive_percentile(values: list[float], q: float) -> float:
    """The nearest-rank q-th percentile: the ceil(q d / 100)-th smallest (0 for rank 0)."""
    ranked = sorted(values)
    r = math.ceil(q * len(values) / 100 - 1e-12)
    return 0.0 if r == 0 else ranked[r - 1]


def naive_ram(tau: list[list[float]], mask: list[list[bool]], lam: list[float]) -> list[float]:
    out = []
    for j in range(len(tau[0])):
        on = [i for i in range(len(tau)) if mask[i][j]]
        if not on:
            out.append(0.0)
        elif len(on) == 1:
            out.append(lam[on[0]] * tau[on[0]][j])
        else:
            out.append(sum(tau[i][j] for i in on) / len(on))
    return out


def naive_hist(mask: list[list[bool]]) -> list[list[int]]:
    n = len(mask)
    h = [[0] * n for _ in range(n)]
    for j in range(len(mask[0])):
        c = sum(m[j] for m in mask)
        for i in range(n):
            if mask[i][j]:
                h[i][c - 1] += 1
    return h


def specials(dtype: torch.dtype) -> torch.Tensor:
    """Base values at the edges of a grid: zero, subnormals, powers of two, the smallest normal, negatives."""
    tiny = torch.finfo(dtype).tiny
    vals = [0.0, -0.0, tiny, -tiny, tiny / 4, 1.0, -1.0, 2.0, 0.5, 3.0, 1e-3, 0.75, -7.5, 1024.0]
    return torch.tensor(vals, dtype=dtype)


def rule_of(**params: object) -> MaskRule:
    return mask_rule(resolve_record(METHODS["ram"], params, 3))


RULES = [
    {},
    {"epsilon": 1e-3},
    {"mask_dtype": "bfloat16"},
    {"mask_dtype": "float16", "mask_ulps": 3},
    {"mask_dtype": "float32", "mask_ulps": 2},
    {"epsilon_rule": "percentile", "epsilon_q": 30.0},
    {"epsilon_rule": "valley"},
]


def random_case(seed: int, n: int = 3, e: int = 400) -> tuple[torch.Tensor, torch.Tensor]:
    """A float32 base and task vectors of mixed magnitudes (some exactly zero, some near a bf16 ulp)."""
    g = torch.Generator().manual_seed(seed)
    base = (torch.randn(e, generator=g) * 0.05).to(torch.bfloat16).float()
    base[:8] = torch.tensor([0.0, 1.0, -0.5, 2.0**-126, 0.25, 1e-38, -1.0, 0.125])
    scale = 10.0 ** torch.empty(n, e).uniform_(-7, -2, generator=g)
    tau = torch.randn(n, e, generator=g) * scale
    tau[torch.rand(n, e, generator=g) < 0.2] = 0.0
    return base, tau


# --------------------------------------------------------------------------- ulp and the grid rule


@pytest.mark.parametrize("grid", sorted(GRIDS))
def test_ulp_matches_naive(grid: str) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.cat([specials(torch.float32), torch.randn(300, generator=g) * 10.0 ** torch.randint(-30, 4, (300,))])
    got = ulp(x, grid).tolist()
    assert got == [naive_ulp(float(v), grid) for v in x]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_ulp_is_the_gap_to_the_neighbour_toward_zero(dtype: torch.dtype) -> None:
    """On the grid itself, ulp(x) is exactly |x| minus the next representable value toward zero."""
    bits = torch.arange(1, 0x7C00 if dtype == torch.float16 else 0x7F80, 37, dtype=torch.int16)
    x = bits.view(dtype)
    below = (bits - 1).view(dtype)
    grid = "float16" if dtype == torch.float16 else "bfloat16"
    assert torch.equal(ulp(x.float(), grid), x.float() - below.float())


@pytest.mark.parametrize("params", RULES, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()) or "default")
def test_tensor_mask_matches_naive(params: dict[str, object]) -> None:
    base, tau = random_case(2)
    rule = rule_of(**params)
    levels = tensor_levels(rule, "w", base.numel(), lambda: iter([(0, tau)])) if rule.adaptive else None
    want = naive_mask(tau.tolist(), base.tolist(), rule, levels.values.tolist() if levels else None)
    assert tensor_mask(tau, base, rule, levels).tolist() == want


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_grid_of_the_storage_dtype_counts_every_change(dtype: torch.dtype) -> None:
    """Base and agents in one dtype, mask_dtype base, k = 1: active exactly where the agent changed the value."""
    g = torch.Generator().manual_seed(3)
    base = torch.cat([specials(dtype), (torch.randn(500, generator=g) * 0.02).to(dtype)])
    bits = base.view(torch.int16 if dtype != torch.float32 else torch.int32)
    steps = torch.randint(-3, 4, (3, base.numel()), generator=g).to(bits.dtype)  # a few grid steps either way
    agents = (bits[None, :] + steps).view(dtype)
    agents[:, :2] = torch.tensor([-0.0, 0.0], dtype=dtype)  # zero <-> minus zero is no change
    rule = mask_rule({"mask_dtype": {torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(dtype, "float32")})
    tau = agents.float() - base.float()
    changed = agents.float() != base.float()[None, :]
    assert bool(changed.any()) and not bool(changed.all())
    assert torch.equal(tensor_mask(tau, base.float(), rule), changed)
    # k = 2: a single step toward zero is never an update (that gap is exactly one ulp)
    two = MaskRule(dtype=rule.dtype, ulps=2)
    sign = torch.tensor(-(1 << (8 * base.element_size() - 1)), dtype=bits.dtype)  # the sign bit
    toward_zero = ((bits & sign) | ((bits & ~sign) - 1)).view(dtype)  # magnitude one step smaller
    one_step = toward_zero.float() - base.float()
    assert not bool(tensor_mask(one_step[None, :], base.float(), two)[0, base.float() != 0].any())


def test_float32_agents_on_a_bfloat16_grid() -> None:
    """An fp32 agent's move below one bf16 ulp of the base is no update; a move of one ulp or more is."""
    base = torch.tensor([1.5, 0.3, -2.5, 1e-3], dtype=torch.bfloat16).float()
    u = ulp(base, "bfloat16")
    tau = torch.stack([u * 0.99, u, -u * 1.01, u * 0.5])
    rule = MaskRule(dtype="bfloat16")
    assert tensor_mask(tau, base, rule).tolist() == [[False] * 4, [True] * 4, [True] * 4, [False] * 4]


# --------------------------------------------------------------------------- adaptive thresholds


@pytest.mark.parametrize("q", [0.0, 10.0, 30.0, 50.0, 97.5, 100.0])
def test_percentile_gives_the_stated_fraction(q: float) -> None:
    g = torch.Generator().manual_seed(4)
    d = 1000
    tau = torch.randn(3, d, generator=g)  # distinct magnitudes
    rule = MaskRule(rule="percentile", q=q)
    levels = tensor_levels(rule, "w", d, lambda: iter([(0, tau)]))
    active = tensor_mask(tau, torch.zeros(d), rule, levels).sum(1).tolist()
    assert active == [d - math.ceil(q * d / 100)] * 3
    assert levels.values.tolist() == [naive_percentile(row, q) for row in tau.abs().tolist()]


def chunked(tau: torch.Tensor, size: int) -> list[tuple[int, torch.Tensor]]:
    return [(s, tau[:, s : s + size]) for s in range(0, tau.shape[1], size)]


@pytest.mark.parametrize("rule", [MaskRule(rule="percentile", q=70.0), MaskRule(rule="valley", seed=5)])
def test_levels_do_not_depend_on_chunking(rule: MaskRule) -> None:
    g = torch.Generator().manual_seed(6)
    d = VALLEY_SAMPLE * 3 + 123  # large enough that the valley rule subsamples
    tau = bimodal(2, d, g)
    whole = tensor_levels(rule, "w", d, lambda: iter([(0, tau)]))
    for size in (1 << 16, 99_999, 1 << 20):
        parts = chunked(tau, size)
        assert torch.equal(tensor_levels(rule, "w", d, lambda p=parts: iter(p)).values, whole.values)  # type: ignore[misc]


def bimodal(n: int, d: int, g: torch.Generator, low: float = -6.0, high: float = -3.0) -> torch.Tensor:
    """Task vectors whose log10 magnitudes have modes at ``low`` and ``high`` (half each), random signs."""
    mode = torch.where(torch.rand(n, d, generator=g) < 0.5, low, high)
    mags = 10.0 ** (mode + 0.25 * torch.randn(n, d, generator=g))
    return mags * torch.where(torch.rand(n, d, generator=g) < 0.5, -1.0, 1.0)


def test_valley_finds_a_threshold_between_the_modes() -> None:
    g = torch.Generator().manual_seed(7)
    tau = bimodal(3, 20_000, g)
    tau[0, :5000] = 0.0  # zeros are left out of the fit
    levels = tensor_levels(MaskRule(rule="valley"), "w", tau.shape[1], lambda: iter([(0, tau)]))
    assert levels.fallback == (False, False, False)
    for t in levels.values.tolist():
        assert 10**-5.3 < t < 10**-3.7  # the valley of two equal modes lies halfway, at 10**-4.5


def test_valley_falls_back_to_epsilon_with_a_note() -> None:
    g = torch.Generator().manual_seed(8)
    one_mode = 10.0 ** (-4 + 0.5 * torch.randn(1, 5000, generator=g))
    rows = torch.cat([one_mode, torch.zeros(1, 5000)])  # one mode; no nonzero value at all
    levels = tensor_levels(MaskRule(rule="valley", epsilon=2e-5), "w", 5000, lambda: iter([(0, rows)]))
    assert levels.fallback == (True, True)
    assert levels.values.tolist() == [f32(2e-5)] * 2
    assert valley_threshold(torch.zeros(0, dtype=torch.float64)) is None


# --------------------------------------------------------------------------- kernels and statistics


def chunk_of(
    base: torch.Tensor, tau: torch.Tensor, params: dict[str, object], method: str, hist: torch.Tensor
) -> Chunk:
    resolved = resolve_record(METHODS[method], params, tau.shape[0])
    e = base.numel()
    stats = TensorStats(hist, hist)
    return Chunk(
        name="w", start=0, stop=e, params=resolved, weights=torch.ones(tau.shape[0]), stats=stats, base=base, tau=tau
    )


@pytest.mark.parametrize("params", RULES[2:], ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_ram_family_kernels_match_naive(params: dict[str, object]) -> None:
    base, tau = random_case(9)
    rule = rule_of(**params)
    levels = tensor_levels(rule, "w", base.numel(), lambda: iter([(0, tau)])).values.tolist() if rule.adaptive else None
    mask = naive_mask(tau.tolist(), base.tolist(), rule, levels)
    hist = torch.tensor(naive_hist(mask))
    lam = ram_lambdas(hist, resolve_record(METHODS["ram_plus"], {}, 3)).tolist()
    got_ram = METHODS["ram"].kernel(chunk_of(base, tau, params, "ram", hist))
    got_plus = METHODS["ram_plus"].kernel(chunk_of(base, tau, params, "ram_plus", hist))
    assert got_ram.tolist() == pytest.approx(naive_ram(tau.tolist(), mask, [1.0] * 3), abs=0, rel=1e-6)
    assert got_plus.tolist() == pytest.approx(naive_ram(tau.tolist(), mask, lam), abs=0, rel=1e-6)
    only = METHODS["unique_only"].kernel(chunk_of(base, tau, {**params, "agent": 1}, "unique_only", hist)).tolist()
    assert only == [tau[1, j].item() if mask[1][j] and sum(m[j] for m in mask) == 1 else 0.0 for j in range(400)]
    ties = METHODS["ram_ties"].kernel(chunk_of(base, tau, params, "ram_ties", hist)).tolist()
    for j in range(400):
        on = [i for i in range(3) if mask[i][j]]
        if len(on) < 2:  # RAM-TIES keeps unique updates whole and leaves untouched elements at zero
            assert ties[j] == (tau[on[0], j].item() if on else 0.0)


def write(folder: Path, tensors: dict[str, torch.Tensor]) -> str:
    folder.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return str(folder)


@pytest.fixture
def files(tmp_path: Path) -> tuple[str, list[str], dict[str, torch.Tensor], list[dict[str, torch.Tensor]]]:
    """A bf16 base of two tensors and three agents (two bf16, one fp32), with bimodal task vectors."""
    g = torch.Generator().manual_seed(10)
    base = {"a.weight": torch.randn(40, 60, generator=g) * 0.05, "b.weight": torch.randn(1500, generator=g) * 0.05}
    base = {k: v.to(torch.bfloat16) for k, v in base.items()}
    agents = []
    for i in range(3):
        dtype = torch.float32 if i == 2 else torch.bfloat16
        agents.append(
            {k: (v.float() + bimodal(1, v.numel(), g).reshape(v.shape) * 30).to(dtype) for k, v in base.items()}
        )
    paths = [write(tmp_path / f"agent{i}", a) for i, a in enumerate(agents)]
    return write(tmp_path / "base", base), paths, base, agents


def naive_merge_tensor(
    base: torch.Tensor, agents: list[torch.Tensor], rule: MaskRule, lam: list[float]
) -> torch.Tensor:
    b = base.float().reshape(-1)
    tau = torch.stack([a.float().reshape(-1) for a in agents]) - b
    levels = tensor_levels(rule, "x", b.numel(), lambda: iter([(0, tau)])).values.tolist() if rule.adaptive else None
    merged = naive_ram(tau.tolist(), naive_mask(tau.tolist(), b.tolist(), rule, levels), lam)
    return (b + torch.tensor(merged)).to(base.dtype).reshape(base.shape)


@pytest.mark.parametrize(
    "params", [{"mask_dtype": "base"}, {"epsilon_rule": "percentile", "epsilon_q": 60.0}, {"epsilon_rule": "valley"}]
)
def test_streamed_merge_matches_naive(files: tuple, tmp_path: Path, params: dict[str, object]) -> None:  # type: ignore[type-arg]
    """Statistics pass and write pass, chunked and threaded: histograms exact, output as the whole-tensor kernel's."""
    base, paths, base_t, agents_t = files
    models = [ModelSpec(path=p) for p in paths]
    cfg = MergeConfig(method="ram_plus", base=base, models=models, params=params, chunk_size=333, threads=2)  # type: ignore[arg-type]
    with Opened(cfg) as inputs:
        plan = make_plan(cfg, inputs.reference, 3, 2)
        assert not plan.compiled  # other rules than |tau| > epsilon run on the reference kernels
        levels = mask_levels(inputs, plan.rules(), 2, 333)
        hists = overlap_stats(inputs, plan.rules(), 2, 333, levels=levels)
    rules = plan.rules()
    taus = {
        n: torch.stack([a[n].float().reshape(-1) for a in agents_t]) - b.float().reshape(-1) for n, b in base_t.items()
    }
    for name, b in base_t.items():
        lv = levels[name].values.tolist() if name in levels else None
        assert hists[name].tolist() == naive_hist(
            naive_mask(taus[name].tolist(), b.float().reshape(-1).tolist(), rules[name], lv)
        )
    total = hists["a.weight"] + hists["b.weight"]
    lam = ram_lambdas(total, cfg.tensor_params("")).tolist()
    merge(cfg, tmp_path / "out", quiet=True)
    out = load_file(tmp_path / "out" / "model.safetensors")
    for name, b in base_t.items():
        flat = b.float().reshape(-1)
        params_t = plan.jobs[[j.name for j in plan.jobs].index(name)].params
        c = Chunk(name=name, start=0, stop=flat.numel(), params=params_t, weights=torch.ones(3),
                  stats=TensorStats(hists[name], total), base=flat, tau=taus[name])  # fmt: skip
        whole = (flat + METHODS["ram_plus"].kernel(c)).to(b.dtype).reshape(b.shape)
        assert torch.equal(out[name], whole), name  # thresholds from the whole tensor = the streamed ones
        lv = levels[name].values.tolist() if name in levels else None
        naive = naive_ram(taus[name].tolist(), naive_mask(taus[name].tolist(), flat.tolist(), rules[name], lv), lam)
        assert torch.allclose(
            out[name].float().reshape(-1), (flat + torch.tensor(naive)).to(b.dtype).float(), rtol=1e-2
        )


class Opened:
    """``Inputs.for_merge`` as a context manager."""

    def __init__(self, cfg: MergeConfig) -> None:
        self.inputs = Inputs.for_merge(cfg)

    def __enter__(self) -> Inputs:
        return self.inputs

    def __exit__(self, *exc: object) -> None:
        self.inputs.close()


def test_default_rule_is_todays(files: tuple, tmp_path: Path) -> None:  # type: ignore[type-arg]
    """mask_dtype none + epsilon_rule fixed: the compiled kernels still run, the cache key is the bare epsilon,
    and the merge is bit for bit the merge without the new parameters."""
    base, paths, _, _ = files
    models = [ModelSpec(path=p) for p in paths]
    plain = MergeConfig(method="ram_plus", base=base, models=models)  # type: ignore[arg-type]
    spelled = MergeConfig(
        method="ram_plus",
        base=base,
        models=models,
        params={"mask_dtype": "none", "epsilon_rule": "fixed", "epsilon_q": 90.0},
    )  # type: ignore[arg-type]
    with Opened(plain) as inputs:
        assert make_plan(plain, inputs.reference, 3, 1).compiled == available(3)
        assert make_plan(spelled, inputs.reference, 3, 1).rules() == make_plan(plain, inputs.reference, 3, 1).rules()
    assert MaskRule(epsilon=1e-5).key == repr(1e-5)
    merge(plain, tmp_path / "a", quiet=True)
    merge(spelled, tmp_path / "b", quiet=True)
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    a = torch.randn(3, 50)
    assert torch.equal(tensor_mask(a, torch.zeros(50), MaskRule()), update_mask(a, 1e-5))


def test_cache_keeps_rules_apart(files: tuple, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:  # type: ignore[type-arg]
    monkeypatch.setenv("AGENTMERGE_CACHE", str(tmp_path / "cache"))
    base, paths, _, _ = files
    rules = [MaskRule(), MaskRule(dtype="bfloat16"), MaskRule(rule="percentile", q=80.0)]
    with Opened(MergeConfig(method="ram", base=base, models=[ModelSpec(path=p) for p in paths])) as inputs:  # type: ignore[arg-type]
        first, again = [], []
        for out in (first, again):
            for rule in rules:
                levels = mask_levels(inputs, {"b.weight": rule}, 1, 500)
                out.append(overlap_stats(inputs, {"b.weight": rule}, 1, 500, levels=levels)["b.weight"].tolist())
    assert first == again  # the second round came from the cache
    assert len({json.dumps(h) for h in first}) == 3  # and no rule was served another's histogram
    active = [sum(row) for row in first[2]]  # percentile 80 of 1500 magnitudes: at most 300 active (ties: fewer)
    assert max(active) <= 300 and active[2] == 300  # the fp32 agent's magnitudes are distinct


# --------------------------------------------------------------------------- configuration and probe


@pytest.mark.parametrize(
    "params,message",
    [
        ({"epsilon_rule": "median"}, "must be one of fixed, percentile, valley"),
        ({"epsilon_q": 101}, "out of range [0.0, 100.0]"),
        ({"epsilon_q": -1}, "out of range"),
        ({"mask_dtype": "float8"}, "must be one of none, base"),
        ({"mask_ulps": 0}, "out of range [1"),
        ({"mask_ulps": 1.5}, "whole number"),
        ({"mask_dtype": "bfloat16", "epsilon_rule": "valley"}, "two mask rules"),
    ],
)
def test_config_errors(params: dict[str, object], message: str) -> None:
    for method in ("ram", "ram_plus", "unique_only", "ram_ties"):
        with pytest.raises(ValueError, match=None) as err:
            resolve_record(METHODS[method], params, 3)
        assert message in str(err.value)


def test_methods_lists_the_mask_parameters(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    for name in ("mask_dtype", "mask_ulps", "epsilon_rule", "epsilon_q"):
        assert name in out


def test_probe_reports_rule_dtypes_and_thresholds(
    files: tuple, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[type-arg]
    base, paths, _, agents_t = files
    report = tmp_path / "probe.json"
    argv = [
        "probe",
        *paths,
        "--base",
        base,
        "--epsilon-rule",
        "percentile",
        "--epsilon-q",
        "80",
        "--json",
        str(report),
        "--quiet",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "update rule: |tau| > the 80th percentile" in out and "threshold min" in out
    data = json.loads(report.read_text())
    assert data["storage_dtypes"] == {
        "base": "bfloat16",
        "agent0": "bfloat16",
        "agent1": "bfloat16",
        "agent2": "float32",
    }
    per_tensor = data["thresholds"]["per_tensor"]
    assert set(per_tensor) == {"a.weight", "b.weight"}
    b = load_file(Path(base) / "model.safetensors")["b.weight"].float()
    want = [naive_percentile((a["b.weight"].float() - b).abs().tolist(), 80.0) for a in agents_t]
    assert per_tensor["b.weight"]["values"] == want
    summary = data["thresholds"]["summary"][0]
    assert summary["min"] <= summary["median"] <= summary["max"]
    assert data["agents"][0]["density"] == pytest.approx(0.2, abs=1e-3)
    assert main(["probe", *paths, "--base", base, "--mask-dtype", "base", "--quiet"]) == 0
    assert "|tau| >= 1 ulp of theta_0 in bfloat16" in capsys.readouterr().out


@pytest.mark.parametrize(
    "flags,message",
    [(["--epsilon-q", "200"], "--epsilon-q"), (["--epsilon-rule", "mode"], "--epsilon-rule"),
     (["--mask-dtype", "float16", "--epsilon-rule", "valley"], "two mask rules")],
)  # fmt: skip
def test_probe_flag_errors(files: tuple, flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[type-arg]
    base, paths, _, _ = files
    assert main(["probe", *paths, "--base", base, *flags]) == 2
    assert message in capsys.readouterr().err


# --------------------------------------------------------------------------- thresholds in merge.json


def test_short_float32_reads_back_exactly() -> None:
    g = torch.Generator().manual_seed(5)
    bits = torch.randint(0, 0x7F800000, (5000,), generator=g, dtype=torch.int32)  # every finite positive float32
    values = [*bits.view(torch.float32).tolist(), 1e-45, 1e-5, 0.0, 3.4028234663852886e38]
    for x in values:
        short = short_float32(x)
        assert struct.pack("<f", short) == struct.pack("<f", x), x
        assert len(repr(short)) <= len(repr(x))
    assert short_float32(f32(1e-5)) == 1e-05 and repr(short_float32(f32(0.1))) == "0.1"


def test_levels_record_matches_naive() -> None:
    g = torch.Generator().manual_seed(6)
    labels = ["a", "b", "c"]
    levels = {f"t{k}": Levels(torch.rand(3, generator=g) * 1e-3, (k % 2 == 0, False, k == 3)) for k in range(6)}
    rules = {name: MaskRule(rule="valley") for name in levels}
    record = levels_record(levels, rules, labels)
    assert record is not None
    assert record["rule"] == MaskRule(rule="valley").describe() and record["agents"] == labels
    for name, lv in levels.items():
        assert [f32(v) for v in record["tensors"][name]] == lv.values.tolist()  # each value exactly
    assert record["fallback"] == {"t0": [0], "t2": [0], "t3": [2], "t4": [0]}
    for i, row in enumerate(record["summary"]):
        column = sorted(lv.values[i].item() for lv in levels.values())
        assert row["agent"] == labels[i]
        assert (f32(row["min"]), f32(row["max"])) == (column[0], column[-1])
        assert row["median"] == pytest.approx((column[2] + column[3]) / 2, rel=1e-6)  # an even count: the mean
        assert row["fallbacks"] == sum(lv.fallback[i] for lv in levels.values())
    odd = threshold_summary({"x": [3.0], "y": [1.0], "z": [2.0]}, {}, ["a"])
    assert odd == [{"agent": "a", "min": 1.0, "median": 2.0, "max": 3.0, "fallbacks": 0}]
    assert levels_record({}, rules, labels) is None  # no adaptive tensor: no record


def test_merge_json_records_the_thresholds_used(files: tuple, tmp_path: Path) -> None:  # type: ignore[type-arg]
    """merge.json holds the very thresholds the merge masked with, one line per tensor; the text is valid JSON."""
    base, paths, _, _ = files
    models = [ModelSpec(path=p) for p in paths]
    params = {"epsilon_rule": "percentile", "epsilon_q": 60.0}
    cfg = MergeConfig(method="ram", base=base, models=models, params=params, chunk_size=333, overrides=[
        {"pattern": "b.*", "params": {"epsilon_rule": "valley"}}])  # fmt: skip  # type: ignore[list-item]
    result = merge(cfg, tmp_path / "out", quiet=True)
    text = (tmp_path / "out" / "merge.json").read_text()
    record = json.loads(text)["thresholds"]
    assert record == result.thresholds == result.to_dict()["thresholds"]
    with Opened(cfg) as inputs:
        plan = make_plan(cfg, inputs.reference, 3, 1)
        levels = mask_levels(inputs, plan.rules(), 1, 1000)
    assert list(record["tensors"]) == ["a.weight", "b.weight"]
    for name, lv in levels.items():
        assert [f32(v) for v in record["tensors"][name]] == lv.values.tolist()
        assert f'"{name}": {json.dumps(record["tensors"][name])}' in text  # one line
    assert record["rule"] == "; ".join(sorted(plan.rules()[n].describe() for n in ("a.weight", "b.weight")))
    assert [r["agent"] for r in record["summary"]] == ["agent0", "agent1", "agent2"]
