"""RAM variants: grouped RAM+ scopes, the sign-electing shared rule, ram_fisher; naive references and properties."""

from __future__ import annotations

import contextlib
import importlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from agentmerge.cli import main
from agentmerge.config.schema import MergeConfig, ModelSpec, config_from_dict
from agentmerge.engine.inputs import Inputs
from agentmerge.engine.merge import merge
from agentmerge.engine.merge_dryrun import plan_merge
from agentmerge.engine.merge_plan import make_plan
from agentmerge.errors import ConfigError
from agentmerge.io.formats.roles import FISHER_MARK
from agentmerge.methods.fused.jit import available
from agentmerge.methods.groups import group_of, layer_of, module_type
from agentmerge.methods.registry import METHODS
from agentmerge.methods.spec import Chunk, TensorStats

F32 = np.float32


def shared_value(
    tau: list[list[float]], active: list[int], p: int, rule: str, fisher: list[list[float]] | None = None
) -> float:
    """Element p's value where 2+ agents (``active``) updated it, in float32 and agent order: the mean, the
    sign-elected mean (``elect``) or, with ``fisher``, the Fisher-weighted mean."""
    if fisher is not None:
        num, den = F32(0.0), F32(0.0)
        for i in active:
            num += F32(fisher[i][p]) * F32(tau[i][p])
            den += F32(fisher[i][p])
        return float(num / den)
    total = F32(0.0)
    for i in active:
        total += F32(tau[i][p])
    chosen = active if rule == "mean" else [i for i in active if np.sign(F32(tau[i][p])) == np.sign(total)]
    if not chosen or total == 0:
        return 0.0
    acc = F32(0.0)
    for i in chosen:
        acc += F32(tau[i][p])
    return float(acc / F32(len(chosen)))


def naive_shared(tau: list[list[float]], eps: float, rule: str, fisher: list[list[float]] | None = None) -> list[float]:
    """Per element, float32 arithmetic in agent order: the shared-region value (0 elsewhere)."""
    out = []
    for p in range(len(tau[0])):
        active = [i for i in range(len(tau)) if abs(F32(tau[i][p])) > F32(eps)]
        out.append(shared_value(tau, active, p, rule, fisher) if len(active) >= 2 else 0.0)
    return out


def naive_unique(tau: list[list[float]], eps: float, lam: list[float]) -> list[float]:
    out = []
    for p in range(len(tau[0])):
        active = [i for i in range(len(tau)) if abs(F32(tau[i][p])) > F32(eps)]
        out.append(float(F32(lam[active[0]]) * F32(tau[active[0]][p])) if len(active) == 1 else 0.0)
    return out


def signed_tau(n: int, e: int, seed: int) -> torch.Tensor:
    """Sparse task vectors with both signs and exact cancellations (so the elected sign can be 0)."""
    g = torch.Generator().manual_seed(seed)
    tau = torch.randn(n, e, generator=g) * 1e-3
    tau[torch.rand(n, e, generator=g) < 0.4] = 0.0
    tau[1, :20] = -tau[0, :20]  # +a and -a
    tau[2:, :20] = 0.0
    return tau


def make_chunk(method: str, tau: torch.Tensor, params: dict[str, object], **stats: object) -> Chunk:
    n, e = tau.shape
    full = {**METHODS[method].defaults(), **params}
    extras = {"fisher": stats.pop("fisher")} if "fisher" in stats else {}
    return Chunk(
        name="t", start=0, stop=e, base=torch.zeros(e), tau=tau, weights=torch.ones(n),
        params=full, stats=TensorStats(**stats), extras=extras,  # type: ignore[arg-type]
    )  # fmt: skip


# --------------------------------------------------------------------------- kernels against naive references


@pytest.mark.parametrize("rule", ["mean", "elect"])
@pytest.mark.parametrize("n", [2, 3, 5])
def test_ram_shared_rules_match_naive(rule: str, n: int) -> None:
    tau = signed_tau(n, 300, n)
    got = METHODS["ram"].kernel(make_chunk("ram", tau, {"shared": rule}))
    t = tau.tolist()
    want = [s + u for s, u in zip(naive_shared(t, 1e-5, rule), naive_unique(t, 1e-5, [1.0] * n), strict=True)]
    assert torch.equal(got, torch.tensor(want))


def test_ram_plus_elect_with_group_histogram_matches_naive() -> None:
    tau = signed_tau(3, 300, 7)
    group = torch.tensor([[10, 5, 5], [4, 8, 0], [1, 6, 2]])  # rho = 1, 2, 8
    params = {"shared": "elect", "scope": "module", "r": 0.5}
    got = METHODS["ram_plus"].kernel(make_chunk("ram_plus", tau, params, group_hist=group, model_hist=group * 0))
    lam = [1 + 0.5 * 1.0, 1 + 0.5 * 2.0, 1 + 0.5 * 2.0]  # alpha = 2 clips the third
    t = tau.tolist()
    want = [s + u for s, u in zip(naive_shared(t, 1e-5, "elect"), naive_unique(t, 1e-5, lam), strict=True)]
    assert torch.equal(got, torch.tensor(want))


def test_elect_equals_mean_without_sign_conflicts() -> None:
    tau = signed_tau(4, 500, 3).abs() * torch.where(torch.arange(500) % 2 == 0, 1.0, -1.0)  # one sign per element
    for method in ("ram", "ram_plus"):
        hist = torch.ones(4, 4, dtype=torch.int64)
        mean = METHODS[method].kernel(make_chunk(method, tau, {}, model_hist=hist, tensor_hist=hist))
        elect = METHODS[method].kernel(make_chunk(method, tau, {"shared": "elect"}, model_hist=hist, tensor_hist=hist))
        assert torch.equal(mean, elect)


def test_elect_never_averages_opposite_signs() -> None:
    tau = signed_tau(5, 2000, 11)
    got = METHODS["ram"].kernel(make_chunk("ram", tau, {"shared": "elect"}))
    mean = METHODS["ram"].kernel(make_chunk("ram", tau, {}))
    active = tau.abs() > 1e-5
    shared = active.sum(0) >= 2
    elected = torch.sign(torch.where(active, tau, 0.0).sum(0))
    for p in torch.nonzero(shared).flatten().tolist():
        agreeing = [float(tau[i, p]) for i in range(5) if active[i, p] and torch.sign(tau[i, p]) == elected[p]]
        value = float(got[p])
        if not agreeing:
            assert value == 0.0
            continue
        assert min(agreeing) <= value <= max(agreeing)  # inside the agreeing agents' range: one sign only
    conflicted = shared & (torch.where(active, tau, 0.0).abs().sum(0) > torch.where(active, tau, 0.0).sum(0).abs())
    assert bool(conflicted.any()) and not torch.equal(got[conflicted], mean[conflicted])  # the rule did something


@pytest.mark.parametrize("r", [0.0, 0.3])
def test_ram_fisher_matches_naive(r: float) -> None:
    tau = signed_tau(3, 300, 5)
    g = torch.Generator().manual_seed(1)
    fisher = torch.rand(3, 300, generator=g) * 4
    fisher[0, :50] = 0.0  # floored
    mass = torch.tensor([[2.0, 1.0], [1.0, 3.0], [0.0, 5.0]], dtype=torch.float64)  # rho 0.5, 3, inf
    c = make_chunk("ram_fisher", tau, {"r": r, "floor": 1e-3}, fisher=fisher, model_stat=mass)
    got = METHODS["ram_fisher"].kernel(c)
    lam = [1 + r * 0.5, 1 + r * 2.0, 1 + r * 2.0]
    t, f = tau.tolist(), fisher.clamp(min=1e-3).tolist()
    want = [s + u for s, u in zip(naive_shared(t, 1e-5, "mean", f), naive_unique(t, 1e-5, lam), strict=True)]
    assert torch.equal(got, torch.tensor(want))


def test_ram_fisher_with_equal_fisher_is_ram() -> None:
    tau = signed_tau(4, 400, 2)
    ram = METHODS["ram"].kernel(make_chunk("ram", tau, {}))
    ones = METHODS["ram_fisher"].kernel(make_chunk("ram_fisher", tau, {}, fisher=torch.ones(4, 400)))
    assert torch.equal(ones, ram)
    same = METHODS["ram_fisher"].kernel(make_chunk("ram_fisher", tau, {}, fisher=torch.full((4, 400), 0.37)))
    assert torch.allclose(same, ram, rtol=1e-5, atol=1e-9)


# --------------------------------------------------------------------------- groups


@pytest.mark.parametrize(
    ("name", "scope", "groups", "want"),
    [
        ("model.layers.3.self_attn.q_proj.weight", "layer", "", "layer 3"),
        ("model.embed_tokens.weight", "layer", "", "model.embed_tokens.weight"),
        ("model.norm.weight", "layer", "", "model.norm.weight"),
        ("model.layers.3.mlp.up_proj.weight", "module", "", "mlp"),
        ("model.layers.3.input_layernorm.weight", "module", "", "norm"),
        ("model.layers.3.mlp.up_proj.weight", "pattern", "*attn* re:layers\\.[0-3]\\. *", "re:layers\\.[0-3]\\."),
        ("model.layers.9.mlp.up_proj.weight", "pattern", "*attn* re:layers\\.[0-3]\\.", "rest"),
        ("lm_head.weight", "global", "", "model"),
        ("lm_head.weight", "tensor", "", "lm_head.weight"),
    ],
)
def test_group_of(name: str, scope: str, groups: str, want: str) -> None:
    assert group_of(name, {"scope": scope, "groups": groups}) == want


def test_module_scope_uses_the_probe_classifier() -> None:
    probe_module = importlib.import_module("agentmerge.engine.probe")  # the package's ``probe`` is the function

    assert probe_module.module_type is module_type and probe_module.layer_of is layer_of


def _cfg(tmp: Path, **params: object) -> dict[str, object]:
    return {"method": "ram_plus", "base": str(tmp), "models": [{"path": str(tmp)}], "params": params}


def test_config_errors_name_the_pattern(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"pattern re:'layers\.\(' is not a valid regular expression"):
        config_from_dict(_cfg(tmp_path, scope="pattern", groups="*mlp* re:layers.("))
    with pytest.raises(ConfigError, match="scope 'pattern' needs 'groups'"):
        config_from_dict(_cfg(tmp_path, scope="pattern"))
    with pytest.raises(ConfigError, match="'groups' is read only with scope 'pattern'"):
        config_from_dict(_cfg(tmp_path, groups="*mlp*"))
    with pytest.raises(ConfigError, match="must be one of mean, elect"):
        config_from_dict(_cfg(tmp_path, shared="median"))
    cfg = config_from_dict(_cfg(tmp_path, scope="pattern", groups=["*mlp*", "re:attn"]))
    assert cfg.tensor_params("x")["groups"] == "*mlp* re:attn"  # a YAML list is accepted


# --------------------------------------------------------------------------- whole merges


def write_model(folder: Path, tensors: dict[str, torch.Tensor]) -> Path:
    folder.mkdir(parents=True)
    save_file(tensors, folder / "model.safetensors")
    return folder


def load(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def family(tmp_path: Path, names: list[str], n: int = 3, e: int = 64, seed: int = 0) -> list[Path]:
    """A float32 base (zeros) and ``n`` agents with sparse signed task vectors on tensors ``names``."""
    g = torch.Generator().manual_seed(seed)
    folders = [write_model(tmp_path / "base", {t: torch.zeros(e) for t in names})]
    for i in range(n):
        tensors = {}
        for t in names:
            tau = torch.randn(e, generator=g) * 1e-2
            tau[torch.rand(e, generator=g) < torch.rand(1, generator=g)] = 0.0
            tensors[t] = tau
        folders.append(write_model(tmp_path / f"a{i}", tensors))
    return folders


def run(folders: list[Path], out: Path, method: str = "ram_plus", **params: object) -> dict[str, torch.Tensor]:
    models = [ModelSpec(path=str(f)) for f in folders[1:]]
    merge(MergeConfig(method=method, base=str(folders[0]), models=models, params=params), out, quiet=True)
    return load(out)


def test_one_layer_and_catch_all_pattern_equal_global(tmp_path: Path) -> None:
    folders = family(tmp_path, ["model.layers.0.mlp.up_proj.weight", "model.layers.0.self_attn.q_proj.weight"])
    want = run(folders, tmp_path / "global", r=0.4)
    for name, params in {"layer": {"scope": "layer"}, "pattern": {"scope": "pattern", "groups": "*"}}.items():
        got = run(folders, tmp_path / name, r=0.4, **params)
        assert all(torch.equal(got[t], want[t]) for t in want), name
    scales = json.loads((tmp_path / "pattern" / "merge.json").read_text())["scales"]
    assert [row["group"] for row in scales] == ["*"]


def test_layer_groups_by_hand(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two agents. layers.0.w: a0 updates 0,1,2, a1 updates 2,3 -> a0 rho 1/2, a1 rho 1/1.
    layers.1.w and layers.1.b: a0 updates w0; a1 updates w0..w3 and b0 (b: a0 none) -> a0 inf, a1 1/4.
    embed: a0 updates 0, a1 updates 1 -> both rho 0.
    """
    z = torch.zeros(4)
    names = ["model.layers.0.w", "model.layers.1.w", "model.layers.1.b", "model.embed.weight"]
    base = write_model(tmp_path / "base", {t: z.clone() for t in names})
    a0 = {"model.layers.0.w": [1.0, 1, 1, 0], "model.layers.1.w": [1.0, 0, 0, 0], "model.embed.weight": [1.0, 0, 0, 0]}
    a1 = {"model.layers.0.w": [0.0, 0, 3, 2], "model.layers.1.w": [3.0, 2, 2, 2], "model.embed.weight": [0.0, 2, 0, 0]}
    a1["model.layers.1.b"] = [2.0, 0, 0, 0]
    folders = [base]
    for i, agent in enumerate([a0, a1]):
        folders.append(write_model(tmp_path / f"a{i}", {t: torch.tensor(agent.get(t, [0.0] * 4)) for t in names}))
    r = 0.5
    argv = ["merge", "--base", str(base), "-o", str(tmp_path / "o"), "--model", str(folders[1])]
    argv += ["--model", str(folders[2]), "--method", "ram_plus", "--param", "scope=layer", "--param", f"r={r}"]
    assert main(argv) == 0
    out = load(tmp_path / "o")
    assert out["model.layers.0.w"].tolist() == pytest.approx([1 + r / 2, 1 + r / 2, 2.0, 2.0 * (1 + r)])
    l1 = 1 + r / 4
    assert out["model.layers.1.w"].tolist() == pytest.approx([2.0, 2 * l1, 2 * l1, 2 * l1])
    assert out["model.layers.1.b"].tolist() == pytest.approx([2 * l1, 0, 0, 0])
    assert out["model.embed.weight"].tolist() == pytest.approx([1.0, 2.0, 0, 0])
    scales = {row["group"]: row["agents"] for row in json.loads((tmp_path / "o" / "merge.json").read_text())["scales"]}
    assert set(scales) == {"layer 0", "layer 1", "model.embed.weight"}
    assert [a["rho"] for a in scales["layer 1"]] == ["inf", 0.25]
    assert scales["layer 0"][1]["lambda"] == pytest.approx(1 + r)
    err = capsys.readouterr().err
    assert "lambda per group (scope: layer):" in err and "layer 1: a0 2.0000 (rho inf), a1 1.1250 (rho 0.250)" in err


def fisher_folder(folder: Path, tensors: dict[str, torch.Tensor]) -> Path:
    folder.mkdir(parents=True)
    save_file(tensors, str(folder / "model.safetensors"), metadata=dict([FISHER_MARK]))
    return folder


def test_ram_fisher_merges(tmp_path: Path) -> None:
    names = ["model.layers.0.mlp.up_proj.weight", "model.layers.1.self_attn.q_proj.weight"]
    folders = family(tmp_path, names, e=3000)
    ones = [fisher_folder(tmp_path / f"f{i}", {t: torch.ones(3000) for t in names}) for i in range(3)]
    base, models = str(folders[0]), [str(f) for f in folders[1:]]

    def merged(out: str, fishers: list[Path], chunk: int | None = None, **params: object) -> dict[str, torch.Tensor]:
        specs = [ModelSpec(path=m, fisher=str(f)) for m, f in zip(models, fishers, strict=True)]
        cfg = MergeConfig(method="ram_fisher", base=base, models=specs, params=params, chunk_size=chunk)
        merge(cfg, tmp_path / out, quiet=True)
        return load(tmp_path / out)

    ram, with_ones = run(folders, tmp_path / "ram", method="ram"), merged("ones", ones)
    assert all(torch.equal(with_ones[t], ram[t]) for t in names)
    plus = run(folders, tmp_path / "plus", r=0.3)  # RAM+ global: lambda from counts
    rho = merged("rho", ones, r=0.3)
    assert all(torch.equal(rho[t], plus[t]) for t in names)  # equal Fisher: mass ratio = count ratio
    g = torch.Generator().manual_seed(3)
    rand = [fisher_folder(tmp_path / f"g{i}", {t: torch.rand(3000, generator=g) for t in names}) for i in range(3)]
    whole, chunked = merged("whole", rand, r=0.3), merged("chunked", rand, chunk=700, r=0.3)
    assert all(torch.equal(whole[t], chunked[t]) for t in names)
    record = json.loads((tmp_path / "whole" / "merge.json").read_text())
    assert record["scales"][0]["group"] == "model (Fisher mass)" and len(record["scales"][0]["agents"]) == 3
    specs = [ModelSpec(path=m, fisher=str(f)) for m, f in zip(models, rand, strict=True)]
    for r, passes in ((0.0, 1), (0.3, 2)):  # the Fisher-mass pass reads the inputs once more
        cfg = MergeConfig(method="ram_fisher", base=base, models=specs, params={"r": r})
        assert plan_merge(cfg, tmp_path / "dry").passes == passes


def test_defaults_stay_the_paper_and_compiled(tmp_path: Path) -> None:
    """Defaults: the paper's formula bit for bit, on the compiled path (shared: elect is compiled too)."""
    names = ["model.layers.0.mlp.up_proj.weight", "model.embed_tokens.weight"]
    folders = family(tmp_path, names, e=500, seed=4)
    taus = [[load(f)[t].tolist() for f in folders[1:]] for t in names]
    for method in ("ram", "ram_plus"):
        got = run(folders, tmp_path / method, method=method)
        hist = [[0] * 3 for _ in range(3)]
        for tau in taus:
            for p in range(500):
                active = [i for i in range(3) if abs(F32(tau[i][p])) > F32(1e-5)]
                for i in active:
                    hist[i][len(active) - 1] += 1
        rho = [sum(h[1:]) / h[0] for h in hist]
        lam = [1 + 0.1 * min(max(x, 0.0), 2.0) for x in rho] if method == "ram_plus" else [1.0] * 3
        for t, tau in zip(names, taus, strict=True):
            want = [s + u for s, u in zip(naive_shared(tau, 1e-5, "mean"), naive_unique(tau, 1e-5, lam), strict=True)]
            assert torch.equal(got[t], torch.tensor(want)), (method, t)
        cfg = MergeConfig(method=method, base=str(folders[0]), models=[ModelSpec(path=str(f)) for f in folders[1:]])
        with contextlib.closing(Inputs.for_merge(cfg)) as inputs:
            assert make_plan(cfg, inputs.reference, 3, 1).compiled == available(3)
            elect = cfg.model_copy(update={"params": {"shared": "elect"}})
            assert make_plan(elect, inputs.reference, 3, 1).compiled == available(3)


def test_methods_lists_the_variants(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    assert "ram_fisher:" in out and "shared = mean one of mean/elect" in out
    assert "scope = global one of global/tensor/layer/module/pattern" in out and "groups = " in out


def test_grouped_scope_compiled_equals_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    names = ["model.layers.0.mlp.up_proj.weight", "model.layers.1.self_attn.q_proj.weight", "model.norm.weight"]
    folders = family(tmp_path, names, e=3000, seed=9)
    fast = run(folders, tmp_path / "fast", scope="module", r=0.7)
    fast_elect = run(folders, tmp_path / "fast_elect", scope="layer", shared="elect")
    monkeypatch.setenv("AGENTMERGE_FUSED", "0")
    slow = run(folders, tmp_path / "slow", scope="module", r=0.7)
    slow_elect = run(folders, tmp_path / "slow_elect", scope="layer", shared="elect")
    assert all(torch.equal(fast[t], slow[t]) and torch.equal(fast_elect[t], slow_elect[t]) for t in names)
    whole = run(folders, tmp_path / "global", r=0.7)
    assert not all(torch.equal(fast[t], whole[t]) for t in names)


@pytest.mark.skipif(not available(5), reason="numba missing or switched off")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize("method", ["ram", "ram_plus"])
def test_compiled_elect_is_the_reference_bit_for_bit(dtype: torch.dtype, n: int, method: str) -> None:
    g = torch.Generator().manual_seed(n)
    e = 5000  # a few compiled blocks and a ragged tail
    ref = torch.randn(e, generator=g).to(dtype)
    tau = signed_tau(n, e, n) * 10
    models = (ref.float() + tau).to(dtype)
    hist = torch.randint(1, 50, (n, n))
    params = {**METHODS[method].defaults(), "shared": "elect", **({"r": 0.3} if method == "ram_plus" else {})}
    spec = Chunk(
        name="t", start=0, stop=e, base=ref.float(), tau=models.float() - ref.float(), weights=torch.ones(n),
        params=params, stats=TensorStats(hist, hist),
    )  # fmt: skip
    compiled = METHODS[method].compiled
    assert compiled is not None
    got = compiled.kernel(ref, models, spec, None)
    want = spec.base + METHODS[method].kernel(spec)
    assert got.finite and got.merged is not None
    assert torch.equal(got.merged.view(torch.int32), want.view(torch.int32))


# --------------------------------------------------------------------------- the variants under other mask rules

RULE_NAMES = [
    "model.layers.0.mlp.up_proj.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.1.mlp.up_proj.weight",
    "model.embed_tokens.weight",
]
MASK_RULES = {
    "percentile": {"epsilon_rule": "percentile", "epsilon_q": 40.0},
    "grid": {"mask_dtype": "float32", "mask_ulps": 64},
}


def rule_family(tmp_path: Path, n: int = 3, e: int = 600, seed: int = 21) -> list[Path]:
    """A float32 base with nonzero weights (and a few zeros and powers of two: the grid's edge cases) and ``n``
    agents whose task vectors span many magnitudes (around the grid's 64 ulps), with exact sign conflicts."""
    g = torch.Generator().manual_seed(seed)
    bases, agents = {}, [{} for _ in range(n)]
    for t in RULE_NAMES:
        base = torch.randn(e, generator=g) * 0.1
        base[:10], base[10:20] = 0.0, 0.125
        bases[t] = base
        tau = torch.randn(n, e, generator=g) * 10.0 ** (torch.rand(n, e, generator=g) * 4 - 8)
        tau[torch.rand(n, e, generator=g) < 0.2] = 0.0
        tau[1, 20:60] = -tau[0, 20:60]
        for i in range(n):
            agents[i][t] = base + tau[i]
    folders = [write_model(tmp_path / "base", bases)]
    return folders + [write_model(tmp_path / f"a{i}", agents[i]) for i in range(n)]


def naive_masks(tau: list[list[float]], base: list[float], rule: dict[str, object]) -> list[list[bool]]:
    """Per agent and element, by the rule's definition: the grid through numpy's float32 spacing just below |base|
    (``np.spacing`` of the next float toward zero), the percentile by sorting the tensor's magnitudes."""
    if "mask_dtype" in rule:
        k = F32(float(rule["mask_ulps"]))  # type: ignore[arg-type]
        below = [np.spacing(np.nextafter(abs(F32(b)), F32(0.0))) for b in base]
        return [[abs(F32(x)) >= k * u for x, u in zip(row, below, strict=True)] for row in tau]
    out = []
    for row in tau:
        mags = sorted(abs(F32(x)) for x in row)
        rank = -(-int(float(rule["epsilon_q"]) * len(row)) // 100)  # type: ignore[arg-type]
        t = mags[rank - 1] if rank > 0 else F32(0.0)
        out.append([abs(F32(x)) > t for x in row])
    return out


def naive_ram(
    tau: list[list[float]],
    masks: list[list[bool]],
    shared: str,
    lam: list[float],
    fisher: list[list[float]] | None = None,
) -> list[float]:
    """Per element, float32 in agent order: RAM's regions from ``masks``; the shared value by ``shared`` (mean,
    elect) or Fisher-weighted; ``lam_i * tau_i`` where unique; 0 where untouched."""
    out = []
    for p in range(len(tau[0])):
        active = [i for i in range(len(tau)) if masks[i][p]]
        if len(active) >= 2:
            out.append(shared_value(tau, active, p, shared, fisher))
        else:
            out.append(float(F32(lam[active[0]]) * F32(tau[active[0]][p])) if active else 0.0)
    return out


def read_taus(folders: list[Path]) -> tuple[dict[str, list[float]], dict[str, list[list[float]]]]:
    """Per tensor: the base's values and each agent's float32 task vector, from the files."""
    base = load(folders[0])
    agents = [load(f) for f in folders[1:]]
    taus = {t: [(a[t].float() - base[t].float()).tolist() for a in agents] for t in RULE_NAMES}
    return {t: base[t].tolist() for t in RULE_NAMES}, taus


def rule_merge(folders: list[Path], out: Path, method: str, fishers: list[Path] | None = None, **params: object) -> Any:
    models = [ModelSpec(path=str(f), fisher=str(fishers[i]) if fishers else None) for i, f in enumerate(folders[1:])]
    cfg = MergeConfig(method=method, base=str(folders[0]), models=models, params=params, chunk_size=128)
    with contextlib.closing(Inputs.for_merge(cfg)) as inputs:
        assert not make_plan(cfg, inputs.reference, len(models), 1).compiled  # other rules: reference kernels
    merge(cfg, out, quiet=True)
    return load(out)


def lambdas(hist: list[list[int]], r: float, alpha: float = 2.0) -> list[float]:
    """RAM+'s paper form from an overlap-count table ``[agent][unique, shared]``."""
    return [1 + r * min(s / u if u else math.inf, alpha) for u, s in hist]


@pytest.mark.parametrize("rule", sorted(MASK_RULES))
@pytest.mark.parametrize("method", ["ram", "ram_plus"])
def test_elect_under_another_mask_rule_matches_naive(tmp_path: Path, rule: str, method: str) -> None:
    """``shared: elect`` with a grid / percentile mask rule (RAM+ with ``scope: layer``, so the group histograms
    are counted under the rule too) equals the per-element reference, chunked over several chunks."""
    folders = rule_family(tmp_path)
    extra = {"scope": "layer", "r": 0.4} if method == "ram_plus" else {}
    got = rule_merge(folders, tmp_path / "o", method, shared="elect", **MASK_RULES[rule], **extra)
    base, taus = read_taus(folders)
    masks = {t: naive_masks(taus[t], base[t], MASK_RULES[rule]) for t in RULE_NAMES}
    counts: dict[str, list[list[int]]] = {}  # group -> [agent][unique, shared]
    for t in RULE_NAMES:
        row = counts.setdefault(group_of(t, {"scope": "layer"}), [[0, 0] for _ in range(3)])
        for p in range(600):
            active = [i for i in range(3) if masks[t][i][p]]
            for i in active:
                row[i][len(active) >= 2] += 1
    for t in RULE_NAMES:
        lam = lambdas(counts[group_of(t, {"scope": "layer"})], 0.4) if method == "ram_plus" else [1.0] * 3
        delta = naive_ram(taus[t], masks[t], "elect", lam)
        want = torch.tensor([float(F32(b) + F32(d)) for b, d in zip(base[t], delta, strict=True)])
        assert torch.equal(got[t], want), (rule, method, t)
    mean = rule_merge(folders, tmp_path / "mean", method, **MASK_RULES[rule], **extra)
    assert not all(torch.equal(mean[t], got[t]) for t in RULE_NAMES)  # the election changed something


@pytest.mark.parametrize("rule", sorted(MASK_RULES))
@pytest.mark.parametrize("r", [0.0, 0.3])
def test_ram_fisher_under_another_mask_rule_matches_naive(tmp_path: Path, rule: str, r: float) -> None:
    """ram_fisher with a grid / percentile mask rule: regions, Fisher-weighted shared mean and (r > 0) the
    Fisher-mass rho of the statistics pass all under the rule, against the per-element reference."""
    folders = rule_family(tmp_path, seed=22)
    g = torch.Generator().manual_seed(5)
    fisher = [{t: torch.randint(1, 9, (600,), generator=g) / 4 for t in RULE_NAMES} for _ in range(3)]  # dyadic
    fishers = [fisher_folder(tmp_path / f"f{i}", f) for i, f in enumerate(fisher)]
    got = rule_merge(folders, tmp_path / "o", "ram_fisher", fishers, r=r, **MASK_RULES[rule])
    base, taus = read_taus(folders)
    masks = {t: naive_masks(taus[t], base[t], MASK_RULES[rule]) for t in RULE_NAMES}
    mass = [[0.0, 0.0] for _ in range(3)]  # [agent][unique, shared], exact: dyadic values
    for t in RULE_NAMES:
        for p in range(600):
            active = [i for i in range(3) if masks[t][i][p]]
            for i in active:
                mass[i][len(active) >= 2] += float(fisher[i][t][p])
    lam = lambdas(mass, r) if r > 0 else [1.0] * 3  # type: ignore[arg-type]
    for t in RULE_NAMES:
        f = [fisher[i][t].tolist() for i in range(3)]
        delta = naive_ram(taus[t], masks[t], "mean", lam, f)
        want = torch.tensor([float(F32(b) + F32(d)) for b, d in zip(base[t], delta, strict=True)])
        assert torch.equal(got[t], want), (rule, r, t)
    if r > 0:
        record = json.loads((tmp_path / "o" / "merge.json").read_text())
        assert [a["lambda"] for a in record["scales"][0]["agents"]] == pytest.approx(lam)


# --------------------------------------------------------------------------- scale: the merged task vector's multiplier


@pytest.mark.parametrize("method", ["ram", "ram_plus"])
@pytest.mark.parametrize("scale", [0.5, 2.5])
def test_scale_multiplies_the_merged_delta(method: str, scale: float) -> None:
    tau = signed_tau(3, 200, seed=9)
    hist = torch.tensor([[40.0, 30.0, 10.0], [35.0, 30.0, 10.0], [20.0, 25.0, 10.0]])
    stats = {"model_hist": hist} if method == "ram_plus" else {}
    plain = METHODS[method].kernel(make_chunk(method, tau, {}, **stats))
    scaled = METHODS[method].kernel(make_chunk(method, tau, {"scale": scale}, **stats))
    assert torch.equal(scaled, plain * F32(scale))  # one float32 product per element, nothing else changes
    assert torch.equal(METHODS[method].kernel(make_chunk(method, tau, {"scale": 1.0}, **stats)), plain)


def test_scale_runs_on_the_reference_kernels_and_whole_merges_scale(tmp_path: Path) -> None:
    names = ["model.layers.0.mlp.up_proj.weight"]
    folders = family(tmp_path, names, e=300, seed=5)
    base = load(folders[0])[names[0]]
    one = run(folders, tmp_path / "one", method="ram")[names[0]]
    two = run(folders, tmp_path / "two", method="ram", scale=2.0)[names[0]]
    assert torch.allclose(two - base, 2 * (one - base), atol=1e-6)
    cfg = MergeConfig(method="ram", base=str(folders[0]), models=[ModelSpec(path=str(f)) for f in folders[1:]])
    with contextlib.closing(Inputs.for_merge(cfg)) as inputs:
        scaled = cfg.model_copy(update={"params": {"scale": 2.0}})
        assert not make_plan(scaled, inputs.reference, 3, 1).compiled
