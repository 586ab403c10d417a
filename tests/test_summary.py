"""What a merge tells the user: the summary on stderr, its warnings, and how inputs are named on disk."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from agentmerge.cli import main
from agentmerge.config.schema import MergeConfig, ModelSpec
from agentmerge.engine.provenance import MergeResult, input_ref
from agentmerge.engine.render import model_card


def _merge(base: Path, models: list[Path | str], out: Path, *extra: str) -> int:
    argv = ["merge", "--base", str(base), "-o", str(out), *[x for m in models for x in ("--model", str(m))]]
    return main([*argv, *extra])


def test_summary_names_rho_lambda_and_regions(
    tiny_family: tuple[Path, list[Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, agents = tiny_family
    assert _merge(base, agents, tmp_path / "a", "--method", "ram_plus") == 0
    err = capsys.readouterr().err
    assert "merged 3 models with ram_plus" in err
    assert "agent0: density 3.0 %, unique 27.4 % of its updates, rho 2.650, lambda 1.2000" in err
    assert "lambda at its clip bound (rho >= clip = 2) for agent0" in err and "warning" not in err
    regions = next(line for line in err.splitlines() if "untouched" in line)
    shares = [float(w) for w in regions.replace(",", " ").split() if w.replace(".", "").isdigit()]
    assert len(shares) == 3 and sum(shares) == pytest.approx(100.0, abs=0.2)
    assert _merge(base, agents, tmp_path / "b", "--method", "ram_plus", "--param", "alpha=0.5") == 0
    assert "every lambda sits at its clip bound (rho >= clip = 0.5): RAM+ here is RAM" in capsys.readouterr().err
    assert _merge(base, agents, tmp_path / "c", "--method", "ram_plus", "--quiet") == 0
    assert capsys.readouterr().err == ""


def test_summary_gives_the_adaptive_thresholds_in_one_line(
    tiny_family: tuple[Path, list[Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, agents = tiny_family
    assert _merge(base, agents, tmp_path / "a", "--method", "ram") == 0
    assert "mask thresholds min" not in capsys.readouterr().err  # the default rule: nothing to say
    assert _merge(base, agents, tmp_path / "b", "--method", "ram", "--param", "epsilon_rule=valley") == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("  mask thresholds min")]
    thresholds = json.loads((tmp_path / "b" / "merge.json").read_text())["thresholds"]
    assert len(lines) == 1 and f"over {len(thresholds['tensors'])} tensors" in lines[0]
    for row in thresholds["summary"]:
        cell = f"{row['agent']} {row['min']:.3g} / {row['median']:.3g} / {row['max']:.3g}"
        assert cell in lines[0]
        assert (f"no valley in {row['fallbacks']}: epsilon" in lines[0]) == (row["fallbacks"] > 0)
    assert _merge(base, agents, tmp_path / "c", "--method", "ram", "--param", "epsilon_rule=percentile") == 0
    assert "no valley" not in capsys.readouterr().err


def test_duplicate_inputs_and_untuned_defaults_are_warned(
    tiny_family: tuple[Path, list[Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, agents = tiny_family
    copy = Path(shutil.copytree(agents[1], tmp_path / "copy"))
    assert _merge(base, [agents[0], agents[0], agents[1], copy], tmp_path / "o", "--method", "task_arithmetic") == 0
    err = capsys.readouterr().err
    assert f"warning: {agents[0]} is given twice as a model" in err
    assert f"warning: {copy} holds the same weights as {agents[1]} (same xxh3_128)" in err
    assert "warning: task_arithmetic: scale left at its default with 4 models" in err
    assert _merge(base, agents[:2], tmp_path / "p", "--method", "task_arithmetic", "--param", "lambda=0.5") == 0
    assert "warning" not in capsys.readouterr().err
    base_copy = Path(shutil.copytree(base, tmp_path / "base-copy"))
    assert _merge(base, [base, base_copy, agents[0]], tmp_path / "q", "--method", "ram", "--hash", "sha256") == 0
    err = capsys.readouterr().err
    assert f"warning: {base} is the base as well: its task vector is zero" in err
    assert f"warning: {base_copy} holds the base's weights (same sha256)" in err


def test_inputs_are_recorded_absolute_never_cwd_relative(
    tiny_family: tuple[Path, list[Path]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, agents = tiny_family
    monkeypatch.chdir(base.parent)
    assert _merge(Path(base.name), [Path(a.name) for a in agents], tmp_path / "o", "--method", "ram", "--quiet") == 0
    record = json.loads((tmp_path / "o" / "merge.json").read_text())
    assert record["config"]["base"] == str(base.resolve())
    assert [m["path"] for m in record["config"]["models"]] == [str(a.resolve()) for a in agents]
    assert sorted(record["inputs"]) == sorted(str(p.resolve()) for p in [base, *agents])
    card = (tmp_path / "o" / "README.md").read_text()
    assert "base_model" not in card and f"Base: `{base.resolve()}`" in card


def test_model_card_names_hub_inputs_by_id(tiny_family: tuple[Path, list[Path]], tmp_path: Path) -> None:
    _, agents = tiny_family
    assert input_ref("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    cfg = MergeConfig(method="ram", base="HuggingFaceTB/SmolLM2-135M-Instruct", models=[ModelSpec(path=str(agents[0]))])
    card = model_card(cfg, MergeResult(tmp_path, "ram", {"epsilon": 1e-5}, 1.0, 3, 2))
    assert card.startswith('---\nbase_model: "HuggingFaceTB/SmolLM2-135M-Instruct"\n')
    assert f"- `{agents[0].resolve()}`" in card


def _shared_only_agent(base: Path, agents: list[Path], out: Path) -> Path:
    """An agent that updated only where both ``agents`` did (its own values): all of its updates are shared."""
    shutil.copytree(agents[0], out)
    theta0 = load_file(base / "model.safetensors")
    a, b = (load_file(m / "model.safetensors") for m in agents)
    own = {}
    for name, t0 in theta0.items():
        both = (a[name] != t0) & (b[name] != t0)
        own[name] = torch.where(both, t0.float() + 0.5 * (a[name].float() - t0.float()), t0.float()).to(t0.dtype)
    save_file(own, out / "model.safetensors")
    return out


def test_ram_notes_an_agent_it_averages_nearly_whole(
    tiny_family: tuple[Path, list[Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, agents = tiny_family
    shared = _shared_only_agent(base, agents[1:], tmp_path / "shared")
    models = [agents[1], agents[2], shared]
    for method in ("ram", "ram_plus"):
        assert _merge(base, models, tmp_path / method, "--method", method) == 0
        notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: ")]
        assert len(notes) == 1 and notes[0].startswith("note: shared: 100.0 % of its updates lie where other")
        assert "it keeps about 33 % of this agent's update (plain averaging: 33 %)" in notes[0]
    assert _merge(base, models, tmp_path / "elect", "--method", "ram", "--param", "shared=elect") == 0
    assert "note: " not in capsys.readouterr().err  # elected signs in the shared region: not a plain mean
    assert _merge(base, agents, tmp_path / "family", "--method", "ram") == 0
    assert "note: " not in capsys.readouterr().err  # the family's agents keep more than half by count
