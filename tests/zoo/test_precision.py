"""Precision as a recipe axis: recipes, exports, agent folders, task-vector statistics, mixed-dtype inputs."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from agentmerge_zoo.build import agent_dir, recipe_tag, zoo_root
from agentmerge_zoo.config import REGIMES, full_config, regime_recipes, six_config
from agentmerge_zoo.grpo import Recipe
from agentmerge_zoo.precision import magnitude_overlap, task_vector_stats
from agentmerge_zoo.results import regime_point
from agentmerge_zoo.tasks import SIX_DOMAINS


def test_recipe_rejects_unknown_precision() -> None:
    with pytest.raises(ValueError, match="storage"):
        Recipe(domain="code", team="t", lr=1e-4, steps=1, prompts_per_step=1, group_size=2, storage="fp16")
    with pytest.raises(ValueError, match="export"):
        Recipe(domain="code", team="t", lr=1e-4, steps=1, prompts_per_step=1, group_size=2, export="int8")


def test_regimes_set_storage_and_export() -> None:
    assert {(r.storage, r.export) for r in regime_recipes("bf16")} == {("bf16", "bf16")}
    assert {(r.storage, r.export) for r in regime_recipes("fp32_bf16")} == {("fp32_master", "bf16")}
    assert {(r.storage, r.export) for r in regime_recipes("fp32_fp32")} == {("fp32_master", "fp32")}
    code, tool, memory = regime_recipes("paper_like")
    assert (code.storage, tool.storage, memory.storage) == ("bf16", "fp32_master", "fp32_master")
    assert (tool.export, memory.export) == ("bf16", "bf16")
    assert code.lr < regime_recipes("bf16")[0].lr  # the sparse agent: bf16 storage at a lower lr
    assert set(REGIMES) == {"bf16", "fp32_bf16", "fp32_fp32", "paper_like"}
    with pytest.raises(ValueError, match="unknown regime"):
        regime_recipes("fp8")


def test_agent_folders_shared_by_regimes_that_share_a_training(tmp_path: Path) -> None:
    bf16 = full_config("bf16").recipe("code")
    assert agent_dir(tmp_path, 0, "code", bf16) == tmp_path / "seed0" / "agent_code"
    f_b = full_config("fp32_bf16").recipe("tool")
    f_f = full_config("fp32_fp32").recipe("tool")
    assert agent_dir(tmp_path, 0, "tool", f_b) != agent_dir(tmp_path, 0, "tool", f_f)
    # the paper-like tool and memory agents are the fp32-master agents exported in bf16
    paper = full_config("paper_like")
    assert agent_dir(tmp_path, 0, "tool", paper.recipe("tool")) == agent_dir(tmp_path, 0, "tool", f_b)
    assert agent_dir(tmp_path, 0, "memory", paper.recipe("memory")) == agent_dir(
        tmp_path, 0, "memory", full_config("fp32_bf16").recipe("memory")
    )
    assert recipe_tag(f_f).endswith("-fp32") and recipe_tag(f_b).endswith("-bf16")
    # fingerprints differ by export, so a cached bf16 export is never taken for the fp32 one
    assert full_config().agent_fingerprint(f_b) != full_config().agent_fingerprint(f_f)
    assert f_b.training_dict() == f_f.training_dict()


def test_six_domain_zoo_is_its_own_and_leaves_the_core_fingerprints_alone(tmp_path: Path) -> None:
    # the committed core zoo's stage fingerprints (in .zoo-cache/seed*/*/zoo_stage.json of the committed runs)
    core = full_config("fp32_bf16")
    assert core.fingerprint("base") == "32a54c299c0c0c73"
    assert core.agent_fingerprint(core.recipe("code")) == "441b166abcbe214e"
    six = six_config("fp32_bf16")
    assert six.suite == "six" and core.suite == "core"
    assert six.fingerprint("base") != core.fingerprint("base")
    assert six.agent_fingerprint(core.recipe("code")) != core.agent_fingerprint(core.recipe("code"))
    assert [r.domain for r in six.recipes] == list(SIX_DOMAINS)
    assert len({r.team for r in six.recipes}) == 6
    assert set(six.pretrain.mixture) == {*SIX_DOMAINS, "heldout"}
    assert zoo_root(six, tmp_path) == tmp_path / "six" and zoo_root(core, tmp_path) == tmp_path
    paper = regime_recipes("paper_like", SIX_DOMAINS)
    assert [r.storage for r in paper] == ["bf16"] + ["fp32_master"] * 5


def _write(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    return path


def test_task_vector_stats_density_and_drift(tmp_path: Path) -> None:
    w0 = torch.tensor([1.0, 2.0, 3.0, 4.0])
    base = _write(tmp_path / "base", {"w": w0.to(torch.bfloat16)})
    agent = _write(tmp_path / "a", {"w": w0 + torch.tensor([0.0, 1e-6, 0.5, -0.25])})  # fp32 agent, bf16 base
    stats = task_vector_stats(base, agent)
    assert stats["density"] == pytest.approx(0.5)  # 1e-6 is below epsilon
    assert stats["drift"] == pytest.approx((1e-6 + 0.5 + 0.25) / 4, rel=1e-4)


def test_magnitude_overlap_against_independent(tmp_path: Path) -> None:
    w0 = torch.arange(1.0, 9.0)  # quartiles by |w0|: {0,1} {2,3} {4,5} {6,7}
    base = _write(tmp_path / "base", {"w": w0})
    tau_a = torch.zeros(8)
    tau_a[[0, 2]] = 0.1
    tau_b = torch.zeros(8)
    tau_b[[0, 3]] = 0.1
    a = _write(tmp_path / "a", {"w": w0 + tau_a})
    b = _write(tmp_path / "b", {"w": w0 + tau_b})
    out = magnitude_overlap(base, [a, b], ["a", "b"])
    q1, q2, q3, _ = out["quartiles"]
    assert q1["agents"][0] == {"agent": "a", "density": 0.5, "w0": 0.0, "w0_independent": 0.5}
    assert q2["agents"][0]["w0"] == 1.0 and q2["agents"][0]["w0_independent"] == 0.5
    assert q3["agents"][0]["density"] == 0.0 and math.isnan(q3["agents"][0]["w0"])
    assert q1["mean_abs_w0"] == pytest.approx(1.5)


def _metrics(code: float, tool: float, memory: float) -> dict[str, float]:
    from agentmerge_zoo.tasks import metric_columns

    values = {"code": code, "tool": tool, "memory": memory, "reverse": 0.5}
    return {m: values[m.split(".")[0]] for m in metric_columns()}


def test_regime_point_paired_differences_and_overlap_excess() -> None:
    records = []
    for seed, bump in ((0, 0.0), (1, 0.02)):
        agent = {"density": 0.5, "overlap": [0.1, 0.5, 0.4], "rho": 9.0, "lam": 1.2}
        records.append(
            {
                "seed": seed,
                "rows": {
                    "base": _metrics(0.1, 0.1, 0.1),
                    "agent_code": _metrics(0.5, 0.1, 0.1),
                    "agent_tool": _metrics(0.1, 0.5, 0.1),
                    "agent_memory": _metrics(0.1, 0.1, 0.5),
                    "linear": _metrics(0.3, 0.3, 0.3),
                    "task_arithmetic": _metrics(0.4, 0.4, 0.4 + bump),
                    "ram": _metrics(0.35, 0.35, 0.6),
                    "ram_plus": _metrics(0.35, 0.35, 0.62),
                    "ram_plus_r0.5_a2": _metrics(0.9, 0.9, 0.9),  # ablation rows never count as "best"
                },
                "probe": {"agents": [agent] * 3, "independent_overlap": [[0.2, 0.5, 0.3]] * 3},
            }
        )
    labels = list(records[0]["rows"])
    point = regime_point(records, labels)
    assert point["best_baseline"] == "task_arithmetic"
    # ram agentic = (0.35*2 + 0.35*2 + 0.6*2)/6 = 0.4333; ta = 0.4 (+0.02/3 in seed 1)
    assert point["ram_minus_best_baseline"]["values"] == pytest.approx([1.3 / 3 - 0.4, 1.3 / 3 - 1.22 / 3])
    assert point["ram_plus_minus_ram"]["mean"] == pytest.approx(0.02 / 3)
    assert point["best_merge"] == "ram_plus"
    memory = point["merge_minus_specialist"]["memory"]
    assert memory["best_on_domain"] == "ram_plus"
    assert memory["best_on_domain_minus_specialist"]["mean"] == pytest.approx(0.12)
    assert point["overlap_excess"]["agent_code"]["mean"] == pytest.approx(0.5)


def test_probe_and_merge_accept_bf16_base_with_fp32_agents(
    tmp_path: Path, tiny_family: tuple[Path, list[Path]]
) -> None:
    from agentmerge.config.schema import MergeConfig, ModelSpec
    from agentmerge.engine.merge import merge
    from agentmerge.engine.probe import probe

    base, agents = tiny_family
    fp32 = []
    for agent in agents:
        out = tmp_path / f"{agent.name}-fp32"
        out.mkdir()
        for f in agent.iterdir():
            if f.name != "model.safetensors" and f.is_file():
                (out / f.name).write_bytes(f.read_bytes())
        tensors = load_file(str(agent / "model.safetensors"))
        save_file(
            {k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}, str(out / "model.safetensors")
        )
        fp32.append(out)
    same = probe(str(base), [str(p) for p in agents], quiet=True)
    mixed = probe(str(base), [str(p) for p in fp32], quiet=True)
    assert [a.density for a in mixed.agents] == [a.density for a in same.agents]
    assert [a.overlap for a in mixed.agents] == [a.overlap for a in same.agents]
    specs = [ModelSpec(path=str(p), name=p.name) for p in fp32]
    cfg = MergeConfig(method="ram", base=str(base), models=specs)
    merge(cfg, tmp_path / "merged", force=True, quiet=True)
    header_len = int.from_bytes((tmp_path / "merged" / "model.safetensors").read_bytes()[:8], "little")
    header = json.loads((tmp_path / "merged" / "model.safetensors").read_bytes()[8 : 8 + header_len])
    base_header_len = int.from_bytes((base / "model.safetensors").read_bytes()[:8], "little")
    base_header = json.loads((base / "model.safetensors").read_bytes()[8 : 8 + base_header_len])
    for name, info in header.items():
        if name != "__metadata__":
            assert info["dtype"] == base_header[name]["dtype"], name


def test_fp32_export_keeps_master_weights(tmp_path: Path) -> None:
    from agentmerge_zoo.modeling import ModelShape, new_model, save_checkpoint

    model = new_model(ModelShape(hidden=16, layers=1, heads=2, intermediate=32, max_positions=32), seed=0)
    with torch.no_grad():
        next(model.parameters()).add_(1e-6)  # below a bf16 ulp of most weights: survives only in fp32
    save_checkpoint(model, tmp_path / "f32", {"stage": "t"}, export="fp32")
    save_checkpoint(model, tmp_path / "b16", {"stage": "t"}, export="bf16")
    f32 = load_file(str(tmp_path / "f32" / "model.safetensors"))
    b16 = load_file(str(tmp_path / "b16" / "model.safetensors"))
    name, param = next(iter(model.named_parameters()))
    assert f32[name].dtype == torch.float32 and b16[name].dtype == torch.bfloat16
    assert torch.equal(f32[name], param.detach())
    assert json.loads((tmp_path / "f32" / "config.json").read_text())["dtype"] == "float32"
    assert replace(regime_recipes("fp32_fp32")[0], export="bf16") == regime_recipes("fp32_bf16")[0]


def test_combined_report_has_map_figure_and_partial_note(tmp_path: Path) -> None:
    from agentmerge_zoo.regime_report import load_combined, write_combined
    from agentmerge_zoo.results import aggregate

    records = []
    for seed in (0, 1):
        agent = {"density": 0.5, "overlap": [0.1, 0.5, 0.4], "rho": 9.0, "lam": 1.2}
        rows = {
            "base": _metrics(0.1, 0.1, 0.1),
            "agent_code": _metrics(0.5, 0.1, 0.1),
            "agent_tool": _metrics(0.1, 0.5, 0.1),
            "agent_memory": _metrics(0.1, 0.1, 0.5),
            "linear": _metrics(0.3, 0.3, 0.3 + 0.01 * seed),
            "ram": _metrics(0.35, 0.35, 0.3),
            "ram_plus": _metrics(0.35, 0.35, 0.31),
        }
        records.append(
            {
                "seed": seed,
                "rows": rows,
                "val": {},
                "skipped": {},
                "dilution": {},
                "probe": {"agents": [agent] * 3, "independent_overlap": [[0.2, 0.5, 0.3]] * 3, "drift": [1e-5] * 3},
                "timing": {},
            }
        )
    meta = {"command": "agentmerge zoo bench", "regime": "bf16", "config": full_config().to_dict()}
    combined = load_combined(tmp_path)
    combined["regimes"]["bf16"] = aggregate(records, meta)
    write_combined(combined, tmp_path)
    assert (tmp_path / "regime-map.png").stat().st_size > 1000
    text = (tmp_path / "results.md").read_text()
    assert "| `bf16` (2 seeds) | 50.0 / 50.0 / 50.0 | 0.50 / 0.50 / 0.50 |" in text
    assert "(vs linear)" in text and "**Partial:**" in text
    assert load_combined(tmp_path)["regimes"]["bf16"]["seeds"] == [0, 1]  # kept for the next regime's run


def test_verdict_needs_two_standard_errors() -> None:
    from agentmerge_zoo.regime_map import verdict

    assert verdict({"mean": 0.03, "se": 0.01}).startswith("higher by 3.0")
    assert verdict({"mean": -0.03, "se": 0.01}).startswith("lower by 3.0")
    assert verdict({"mean": 0.03, "se": 0.02}).startswith("no clear difference")
    assert verdict(None) == "not measured"


def test_zoo_fisher_files_are_accepted_by_the_engine(tmp_path: Path) -> None:
    """The zoo's Fisher files carry the mark the engine checks (an unmarked one, from an older zoo, is redone)."""
    from agentmerge.io.formats.checkpoint import Checkpoint
    from agentmerge.io.formats.roles import check_fisher_role
    from agentmerge_zoo.fisher import is_fisher_file, save_fisher

    out = save_fisher({"w": torch.ones(2, 3)}, tmp_path / "f.safetensors")
    assert is_fisher_file(out)
    with Checkpoint(out) as ckpt:
        check_fisher_role(ckpt, fisher=True)  # raises for a file without the mark
    save_file({"w": torch.ones(2, 3)}, str(tmp_path / "old.safetensors"))
    assert not is_fisher_file(tmp_path / "old.safetensors") and not is_fisher_file(tmp_path / "missing.safetensors")
