"""End to end on tiny sizes: build the zoo, evaluate a checkpoint, run the bench. Checks it works, not who wins."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentmerge.cli import build_parser
from agentmerge.sweep.run import Results
from agentmerge_zoo.build import build_zoo
from agentmerge_zoo.config import DOMAINS, smoke_config
from agentmerge_zoo.modeling import read_stage


def _parser() -> argparse.ArgumentParser:
    return build_parser()  # zoo build/bench come from agentmerge_zoo.cli.register, eval is the main parser's


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


def test_check_cli_checks_every_agent_and_prints_the_steps(
    zoo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["zoo", "check", "--zoo", str(zoo), "--work", str(tmp_path), "--regime", "bf16", "--seeds", "0"]
    assert _run(*argv, "--smoke", "--threads", "1", "--quiet", "--n", "4") == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("steps: code=2,tool=2,memory=2")
    data = json.loads((tmp_path / "bf16" / "convergence.json").read_text())
    (round0,) = data["rounds"]
    assert set(round0["checks"]["0"]) == set(DOMAINS) and round0["steps"] == {"code": 2, "tool": 2, "memory": 2}
    assert round0["checks"]["0"]["memory"]["scores"]["1.5"]["n"] == 4
    assert "| 0 | agent_memory | 2 |" in (tmp_path / "bf16" / "convergence.md").read_text()
    assert not list(tmp_path.rglob("*.s1.5"))  # the scaled models are removed once scored


def _bench_argv(zoo: Path, root: Path) -> list[str]:
    return ["zoo", "bench", "--zoo", str(zoo), "--work", str(root / "work"), "--docs", str(root / "docs")]


def _sweep_records(work: Path) -> list[dict[str, Any]]:
    """Every trial record of every sweep under ``work`` (one line per trial the sweeps ran)."""
    return [r for path in sorted(work.rglob("results.jsonl")) for r in Results(path).records()]


@pytest.fixture(scope="module")
def bench(zoo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The smoke bench, run once through the sweep engine (three regimes, pairs, ablation, dilution)."""
    root = tmp_path_factory.mktemp("bench")
    assert _run(*_bench_argv(zoo, root), "--seeds", "0", "--smoke", "--threads", "1", "--quiet") == 0
    return root


def test_bench_smoke_writes_results(zoo: Path, bench: Path) -> None:
    tmp_path, docs = bench, bench / "docs"
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
    assert "scripts/zoo_fair_run.sh" in markdown  # a fair bench resumes with the fair run
    # the merges were trials of the seed's two sweeps, named by their row labels
    for regime in combined["regimes"]:
        seed = tmp_path / "work" / regime / "seed0"
        val = {r["name"] for r in Results(seed / "sweep-val" / "results.jsonl").records()}
        test = {r["name"]: r for r in Results(seed / "sweep-test" / "results.jsonl").records()}
        assert {"ta_lambda0.5", "ta_lambda1", "code+tool.ta_lambda0.5"} <= val
        assert {"linear", "ram", "fisher", "unique_code_s1", "tool+memory.ram"} <= set(test)
        assert all(r["status"] == "ok" for r in test.values())
        rows = combined["regimes"][regime]["rows"]
        assert rows["ram"]["code.exact"]["mean"] == test["ram"]["metrics"]["code.exact"]
        assert set(test["code+tool.linear"]["metrics"]) == {
            "code.exact",
            "code.partial",
            "tool.exact",
            "tool.f1",
            "agentic_avg",
        }


def test_bench_smoke_checks_agents_and_tunes_every_output_scale(bench: Path) -> None:
    """The fair bench: each agent's convergence check, a defaults and a tuned table, the regime map under both."""
    from agentmerge_zoo.fair import output_scale

    combined = json.loads((bench / "docs" / "results.json").read_text())
    for regime, results in combined["regimes"].items():
        conv = results["convergence"]
        assert set(conv) == set(DOMAINS), regime
        for entry in conv.values():
            assert list(entry["scores"]) == ["0.5", "1", "1.5", "2"]
            assert entry["steps"] == [2] and len(entry["converged"]) == 1
        rows = results["rows"]
        scaled = [x for x in ("task_arithmetic", "ties", "ram", "ram_plus") if output_scale(x)]
        assert len(scaled) == 4  # every one has an output scale in the registry
        assert {f"{x}.tuned" for x in scaled} <= set(rows)
        assert "linear.tuned" not in rows and "fisher.tuned" not in rows  # no output scale: defaults row only
        assert set(results["tuned_choice"]) == set(scaled)
        for label in scaled:
            choice = results["tuned_choice"][label]
            assert choice["param"] == output_scale(label) and choice["values"][0] in (0.5, 1.0)
        assert "ram_minus_best_baseline" in results["map_tuned"]
        assert results["map_tuned"]["best_baseline"] not in ("ram", "ram_plus", "ram_ties")
        assert {"code+tool", "code+memory", "tool+memory"} == set(results["pairs_tuned"])
    seed = bench / "work" / "bf16" / "seed0"
    val = {r["name"] for r in Results(seed / "sweep-val" / "results.jsonl").records()}
    assert {"ties_tune0.5", "ties_tune1", "ram_plus_tune0.5", "code+tool.ram_tune1"} <= val
    test = {r["name"]: r for r in Results(seed / "sweep-test" / "results.jsonl").records()}
    assert {"task_arithmetic", "ties", "ram"} <= set(test)  # the defaults rows
    for label in ("ties", "ram", "ram_plus"):  # a tuned row is its own trial unless the default value won
        best = combined["regimes"]["bf16"]["tuned_choice"][label]["values"][0]
        assert (f"{label}_at{best:g}" in test) == (best != 1.0)
    markdown = (bench / "docs" / "results.md").read_text()
    assert "### Convergence check" in markdown and "| agent_memory | 2 |" in markdown
    assert "### Main table at defaults (3 agents)" in markdown and "### Main table tuned (3 agents)" in markdown
    assert "RAM − best baseline, tuned (pts)" in markdown and "Tuned alike: RAM vs the best baseline" in markdown
    assert "### Two-agent merges, tuned" in markdown


def test_bench_rerun_runs_no_trial_and_scores_nothing(zoo: Path, bench: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A finished bench run again: every trial is found in results.jsonl, Ray never starts, nothing is evaluated."""
    from agentmerge.sweep.run import RaySession
    from agentmerge_zoo import evaluate as zoo_evaluate

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the rerun did work that was done already")

    before = _sweep_records(bench / "work")
    evals = sorted((bench / "work" / "evals").rglob("*.json"))
    first = json.loads((bench / "docs" / "results.json").read_text())
    monkeypatch.setattr(RaySession, "start", refuse)
    monkeypatch.setattr(zoo_evaluate, "evaluate", refuse)
    assert _run(*_bench_argv(zoo, bench), "--seeds", "0", "--smoke", "--threads", "1", "--quiet") == 0
    assert _sweep_records(bench / "work") == before  # no trial ran: no line was added
    assert sorted((bench / "work" / "evals").rglob("*.json")) == evals
    again = json.loads((bench / "docs" / "results.json").read_text())
    for regime, results in again["regimes"].items():
        keys = ("rows", "pairs", "dilution", "task_arithmetic_scale", "ablation", "probe", "skipped", "convergence")
        for key in (*keys, "tuned_choice", "map_tuned", "pairs_tuned"):
            assert results[key] == first["regimes"][regime][key], (regime, key)


def test_killed_bench_resumes(zoo: Path, tmp_path: Path) -> None:
    """SIGKILL in the middle of the test sweep, then a rerun: finished trials are kept, the rest run once."""
    import agentmerge

    src = str(Path(agentmerge.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    argv = [*_bench_argv(zoo, tmp_path), "--seeds", "0", "--smoke", "--regimes", "bf16", "--no-pairs", "--no-fair"]
    argv.append("--no-check")
    cmd = [sys.executable, "-m", "agentmerge", *argv, "--threads", "1", "--max-concurrent", "1", "--quiet"]
    results = tmp_path / "work" / "bf16" / "seed0" / "sweep-test" / "results.jsonl"
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stderr=subprocess.PIPE)
    deadline = time.time() + 240
    while time.time() < deadline and len(Results(results).records()) < 2 and proc.poll() is None:
        time.sleep(0.1)
    if proc.poll() is not None:  # ended on its own: a failure (or a bench too fast to kill), say which
        err = proc.stderr.read().decode() if proc.stderr else ""
        pytest.fail(f"the bench ended before it could be killed (exit {proc.returncode}): {err[-2000:]}")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    killed = Results(results).records()
    val = Results(results.parent.parent / "sweep-val" / "results.jsonl").records()
    assert 2 <= len(killed) < 12, "the bench finished before it could be killed"
    assert not (tmp_path / "docs" / "results.json").exists()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    after = Results(results).records()
    assert after[: len(killed)] == killed  # the recorded trials were not run again
    assert len(after) == len({r["trial"] for r in after}) == 12  # each of the other trials ran exactly once
    assert Results(results.parent.parent / "sweep-val" / "results.jsonl").records() == val
    rows = json.loads((tmp_path / "docs" / "results.json").read_text())["regimes"]["bf16"]["rows"]
    assert {"linear", "task_arithmetic", "ties", "fisher", "ram", "ram_plus"} <= set(rows)
