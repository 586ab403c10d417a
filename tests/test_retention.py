"""How much of each agent's update a merge kept (``engine.retention``): the per-chunk sums against a naive loop,
the whole pass against whole-tensor arithmetic, and the defining values (RAM keeps unique updates whole, a plain
average keeps about 1/N, a merge equal to one agent keeps that agent whole)."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agentmerge import MergeConfig, ModelSpec, merge
from agentmerge.engine.probe import probe
from agentmerge.engine.retention import region_sums, retention
from agentmerge.methods.deltas import kept_by_count
from agentmerge.synthetic import write_family


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    """A float32 family (so a merge's delta is not rounded to bf16) whose agents overlap."""
    return write_family(tmp_path_factory.mktemp("fp32"), "tiny", [0.2, 0.5, 0.6], seed=3, dtype=torch.float32)


def _merged(family: tuple[Path, list[Path]], method: str, out: Path) -> Path:
    base, agents = family
    cfg = MergeConfig(method=method, base=str(base), models=[ModelSpec(path=str(a)) for a in agents])
    merge(cfg, out, quiet=True)
    return out


def test_region_sums_match_a_per_element_loop() -> None:
    gen = torch.Generator().manual_seed(0)
    tau = torch.randn(3, 200, generator=gen)
    mask = torch.rand(3, 200, generator=gen) < 0.5
    tau = torch.where(mask, tau, 0.0)
    delta = torch.randn(200, generator=gen)
    got = region_sums(tau, delta, mask)
    want = torch.zeros(3, 4, 2, dtype=torch.float64)
    for e in range(200):
        active = [i for i in range(3) if mask[i, e]]
        for i in active:
            want[i, len(active) - 1, 0] += float(tau[i, e]) * float(delta[e])
            want[i, len(active) - 1, 1] += float(tau[i, e]) ** 2
        want[:, 3, 0] += float(delta[e]) ** 2
        if not active:
            want[:, 3, 1] += float(delta[e]) ** 2
    assert torch.allclose(got, want, rtol=1e-6, atol=1e-9)


def test_pass_equals_whole_tensor_arithmetic(family: tuple[Path, list[Path]], tmp_path: Path) -> None:
    base, agents = family
    out = _merged(family, "ties", tmp_path / "ties")
    (got,) = retention(str(base), [str(a) for a in agents], [str(out)], chunk_size=53, threads=2, quiet=True)
    b, m = load_file(base / "model.safetensors"), load_file(out / "model.safetensors")
    models = [load_file(a / "model.safetensors") for a in agents]
    taus = {n: torch.stack([x[n].double() - t.double() for x in models]).reshape(3, -1) for n, t in b.items()}
    deltas = {n: (m[n].double() - t.double()).reshape(-1) for n, t in b.items()}
    delta_sq = sum(float(d.square().sum()) for d in deltas.values())
    for i, agent in enumerate(got.agents):
        masks = {n: t.abs() > 1e-5 for n, t in taus.items()}
        mine = {n: mk[i] for n, mk in masks.items()}
        dot = sum(float((taus[n][i] * deltas[n])[mine[n]].sum()) for n in b)
        sq = sum(float(taus[n][i][mine[n]].square().sum()) for n in b)
        assert agent.kept == pytest.approx(dot / sq, rel=1e-5)
        assert agent.cos == pytest.approx(dot / math.sqrt(sq * delta_sq), rel=1e-5)
        k0 = {n: mine[n] & (masks[n].sum(0) == 1) for n in b}
        dot0 = sum(float((taus[n][i] * deltas[n])[k0[n]].sum()) for n in b)
        sq0 = sum(float(taus[n][i][k0[n]].square().sum()) for n in b)
        assert agent.by_region[0] == pytest.approx(dot0 / sq0, rel=1e-5)
    outside = sum(float(deltas[n][~(masks[n].any(0))].square().sum()) for n in b)
    assert got.outside == pytest.approx(outside / delta_sq, abs=1e-9)


def test_ram_keeps_unique_updates_whole_and_averages_the_overlap(
    family: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    base, agents = family
    paths = [str(a) for a in agents]
    merged = [str(_merged(family, m, tmp_path / m)) for m in ("ram", "linear")]
    ram, linear = retention(str(base), paths, merged, quiet=True)
    (alone,) = retention(str(base), paths, merged[:1], quiet=True, chunk_size=1000)
    for a, b in zip(alone.agents, ram.agents, strict=True):  # one pass over many merges: each its own numbers
        assert a.kept == pytest.approx(b.kept, rel=1e-9) and a.by_region == pytest.approx(b.by_region, rel=1e-9)
    for a in ram.agents:
        assert a.by_region[0] == pytest.approx(1.0, abs=1e-5)  # unique: kept whole
        # shared with k others: the mean of k + 1 unrelated updates keeps about 1 / (k + 1) of each
        assert a.by_region[1] == pytest.approx(1 / 2, abs=0.05)
        assert a.by_region[2] == pytest.approx(1 / 3, abs=0.05)
    for a in linear.agents:
        assert a.kept == pytest.approx(1 / 3, abs=0.03) and a.by_region[0] == pytest.approx(1 / 3, abs=1e-5)
    assert ram.outside == pytest.approx(0.0, abs=1e-12)


def test_a_merge_equal_to_one_agent_keeps_that_agent_whole(family: tuple[Path, list[Path]], tmp_path: Path) -> None:
    base, agents = family
    copy = shutil.copytree(agents[1], tmp_path / "copy")
    (got,) = retention(str(base), [str(a) for a in agents], [str(copy)], labels=["a", "b", "c"], quiet=True)
    assert got.agents[1].name == "b"
    assert got.agents[1].kept == pytest.approx(1.0) and got.agents[1].cos == pytest.approx(1.0)
    assert all(x == pytest.approx(1.0) for x in got.agents[1].by_region)
    assert abs(got.agents[0].kept) < 0.05  # an unrelated agent: nothing of it
    (same,) = retention(str(base), [str(a) for a in agents], [str(base)], quiet=True)
    assert all(a.kept == 0.0 and math.isnan(a.cos) for a in same.agents)
    assert same.to_dict()["agents"][0]["cos"] is None  # JSON has no NaN


def test_probe_merged_prints_writes_and_refuses_a_report_inside_a_merge(
    family: tuple[Path, list[Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from agentmerge.cli import main

    base, agents = family
    ram = _merged(family, "ram", tmp_path / "ram")
    argv = ["probe", "--base", str(base), *map(str, agents), "--merged", str(ram), "--merged", str(agents[0])]
    assert main([*argv, "--json", str(tmp_path / "p.json"), "--markdown", str(tmp_path / "p.md"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "What each merge kept" in out and f"| {ram} | agent0 | " in out
    data = json.loads((tmp_path / "p.json").read_text())
    assert [r["merged"] for r in data["retention"]] == [str(ram), str(agents[0])]
    assert data["retention"][1]["agents"][0]["kept"] == pytest.approx(1.0)
    assert "## What each merge kept of each agent" in (tmp_path / "p.md").read_text()
    assert main([*argv, "--json", str(ram / "p.json"), "--quiet"]) == 2  # never a report inside an input
    assert not (ram / "p.json").exists()


def test_kept_by_count_estimates_what_ram_kept(family: tuple[Path, list[Path]], tmp_path: Path) -> None:
    base, agents = family
    paths = [str(a) for a in agents]
    (ram,) = retention(str(base), paths, [str(_merged(family, "ram", tmp_path / "ram"))], quiet=True)
    stats = probe(str(base), paths, quiet=True).agents
    for measured, counted in zip(ram.agents, stats, strict=True):
        # the family's updates have one magnitude distribution in every region: count and projection agree
        assert kept_by_count(counted.overlap) == pytest.approx(measured.kept, abs=0.03)
    assert kept_by_count([1.0, 0.0, 0.0]) == 1.0 and kept_by_count([0.0, 0.0, 1.0]) == pytest.approx(1 / 3)
    assert kept_by_count([0.5, 0.3, 0.2]) == pytest.approx(0.5 + 0.3 / 2 + 0.2 / 3)
