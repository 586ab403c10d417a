"""End to end on tiny sizes: build the zoo, evaluate a checkpoint, run the bench. Checks it works, not who wins."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentmerge.cli import build_parser
from agentmerge.zoo.build import build_zoo
from agentmerge.zoo.config import DOMAINS, smoke_config
from agentmerge.zoo.modeling import read_stage


def _parser() -> argparse.ArgumentParser:
    return build_parser()  # zoo build/bench come from agentmerge.zoo.cli.register, eval is the main parser's


def _run(*argv: str) -> int:
    args = _parser().parse_args(list(argv))
    return int(args.func(args))


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("zoo")
    assert _run("zoo", "build", "--out", str(out), "--seed", "0", "--smoke", "--threads", "1", "--quiet") == 0
    return out


def test_build_writes_hf_folders_with_recipes(zoo: Path) -> None:
    for name in ("base", *[f"agent_{d}" for d in DOMAINS]):
        folder = zoo / "seed0" / name
        for file in ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json"):
            assert (folder / file).is_file(), (name, file)
        model = AutoModelForCausalLM.from_pretrained(str(folder))
        assert type(model).__name__ == "LlamaForCausalLM"
        assert next(model.parameters()).dtype.is_floating_point
        assert json.loads((folder / "config.json").read_text())["dtype"] == "bfloat16"
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        assert tokenizer.decode(tokenizer("mem:ab?a")["input_ids"], skip_special_tokens=True) == "mem:ab?a"
    for domain in DOMAINS:
        recipe = json.loads((zoo / "seed0" / f"agent_{domain}" / "recipe.json").read_text())
        assert recipe["domain"] == domain
        assert recipe["storage"] == "bf16"


def test_build_is_resumable(zoo: Path) -> None:
    before = {d: read_stage(zoo / "seed0" / f"agent_{d}")["seconds"] for d in DOMAINS}
    messages: list[str] = []
    build_zoo(smoke_config(), zoo, 0, threads=1, log=messages.append)
    assert sum("skipping" in m for m in messages) == 1 + len(DOMAINS)
    assert before == {d: read_stage(zoo / "seed0" / f"agent_{d}")["seconds"] for d in DOMAINS}


def test_eval_cli_writes_json(zoo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "eval.json"
    ckpt = str(zoo / "seed0" / "base")
    assert _run("eval", ckpt, "--suite", "zoo", "--n", "8", "--json", str(out), "--quiet", "--threads", "1") == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "reverse.char" in x)
    assert " % ± " in line and "(n=8)" in line  # percent, with its sign
    report = json.loads(out.read_text())
    assert set(report["metrics"]) >= {"code.exact", "tool.f1", "memory.long", "reverse.char"}
    assert all(0.0 <= v <= 1.0 for v in report["metrics"].values())
    assert report["count"]["code.exact"] == 8


def test_bench_smoke_writes_results(zoo: Path, tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    argv = ["zoo", "bench", "--zoo", str(zoo), "--work", str(tmp_path / "work"), "--docs", str(docs)]
    assert _run(*argv, "--seeds", "0", "--smoke", "--threads", "1", "--quiet") == 0
    combined = json.loads((docs / "results.json").read_text())
    assert list(combined["regimes"]) == ["bf16", "fp32_fp32", "paper_like"]
    for regime, results in combined["regimes"].items():
        rows = results["rows"]
        assert {"base", "agent_code", "agent_tool", "agent_memory"} <= set(rows)
        assert {"linear", "task_arithmetic", "ram", "ram_plus"} <= set(rows) | set(results["skipped"])
        assert set(results["dilution"]) == set(DOMAINS)
        assert len(results["probe"]["agents"]) == len(DOMAINS)
        assert len(results["probe"]["magnitude"]) == 4
        assert set(results["pairs"]) == {"code+tool", "code+memory", "tool+memory"}
        assert "ram_minus_best_baseline" in results["map"]
        assert bool(results["ablation"]) == (regime == "paper_like")
    # paper-like mixes recipes; fp32_fp32 mixes dtypes (bf16 base, fp32 agents): the merge keeps the base's dtype
    stages = combined["regimes"]["paper_like"]["config"]["recipes"]
    assert [(r["storage"], r["export"]) for r in stages] == [
        ("bf16", "bf16"),
        ("fp32_master", "bf16"),
        ("fp32_master", "bf16"),
    ]
    tool = next(p for p in (zoo / "seed0").iterdir() if p.name.startswith("agent_tool.") and p.name.endswith("-fp32"))
    assert load_file(str(tool / "model.safetensors"))["model.embed_tokens.weight"].dtype == torch.float32
    merged = tmp_path / "work" / "fp32_fp32" / "seed0" / "sweep-test" / "trials" / "ram" / "model.safetensors"
    assert load_file(str(merged))["model.embed_tokens.weight"].dtype == torch.bfloat16
    markdown = (docs / "results.md").read_text()
    assert "agentmerge zoo bench" in markdown
    assert "## The regime map" in markdown
    assert "## Regime `paper_like`" in markdown and "### RAM+ ablation" in markdown
    assert "### Two-agent merges" in markdown and "### Overlap by base-weight magnitude" in markdown
    assert "**Partial:** regimes not run yet: fp32_bf16; regimes on fewer than 3 seeds:" in markdown
    assert "scripts/zoo_full_run.sh" in markdown
