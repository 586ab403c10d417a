"""The BFCL lineup (``zoo real run --smoke --lineup bfcl``) end to end on the tiny random Llama: agents bfcl, code,
memory; their check, bench and report, with BFCL per category; and the lineup read back from each result.json."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from agentmerge.cli import build_parser
from agentmerge.errors import ConfigError
from agentmerge_zoo.real import suite
from agentmerge_zoo.real.config import RealConfig, bfcl_config, smoke_config
from agentmerge_zoo.real.skill_bfcl import TEST_CATEGORIES, BfclSkill

from .test_real_smoke import _VowelReward

torch.set_num_threads(1)
LINEUP = ("bfcl", "code", "memory")


def _run(*argv: str) -> int:
    args = build_parser().parse_args(list(argv))
    return int(args.func(args))


def _argv(work: Path) -> list[str]:
    return ["zoo", "real", "run", "--smoke", "--lineup", "bfcl", "--work", str(work), "--docs", str(work / "docs")]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        BfclSkill().live_items()
    except ConfigError as exc:
        pytest.skip(f"the pinned bfcl-eval wheel cannot be had here: {exc}")
    work = tmp_path_factory.mktemp("real-bfcl")
    with pytest.MonkeyPatch.context() as mp:
        for name in LINEUP:  # the training reward only (so the agents move); evaluation is the real one
            mp.setitem(suite.SKILLS, name, _VowelReward(suite.SKILLS[name]))
        assert _run(*_argv(work), "--threads", "1", "--quiet") == 0
    return work


def test_the_lineup_is_the_configurations() -> None:
    assert RealConfig().trained == suite.TRAINED
    assert bfcl_config().trained == LINEUP and bfcl_config().recipe("code") == RealConfig().recipe("code")
    assert smoke_config("bfcl").trained == LINEUP and smoke_config().trained == suite.TRAINED
    assert suite.lineup_of({"seed": 0}) == suite.TRAINED  # a result written before lineups: the default


def test_the_bfcl_lineup_runs_end_to_end(smoke: Path) -> None:
    seed = json.loads((smoke / "seed0" / "result.json").read_text())
    assert suite.lineup_of(seed) == LINEUP
    assert all((smoke / "seed0" / f"agent_{s}" / "model.safetensors").is_file() for s in LINEUP)
    assert not (smoke / "seed0" / "agent_tool").exists()
    check, bench = seed["check"], seed["bench"]
    assert tuple(check["convergence"]) == LINEUP and tuple(check["probe"]) == LINEUP
    assert all(check["probe"][s]["drift"] > 0 for s in LINEUP)
    assert set(check["base"]) == {*LINEUP, "capitals"} and check["base"]["bfcl"]["n"] == 4
    assert bench["failed"] == {}
    assert set(bench["reports"]) >= {"ram", "ram_plus", "task_arithmetic", "bfcl+code.ram", "code+memory.ram"}
    assert set(bench["reports"]["bfcl+memory.ram"]) == {"bfcl", "memory", "capitals"}
    assert [a["name"] for a in bench["kept"]["ram"]["agents"]] == list(LINEUP)


def test_the_whole_bfcl_test_scores_the_leading_rows(smoke: Path) -> None:
    """Base, the BFCL agent, the top method and RAM and RAM+ at their better rows, on the plan's 8 prompts (two per
    category), each the same checkpoint's report that an evaluation of it gives."""
    from agentmerge_zoo.real.evaluate import evaluate
    from agentmerge_zoo.real.rows import merge_rows, top_rows

    seed = json.loads((smoke / "seed0" / "result.json").read_text())
    whole, bench = seed["bfcl_whole"], seed["bench"]
    assert whole["run"] and whole["n"] == 8 and whole["failed"] == {}
    rows = merge_rows(bench)
    assert whole["top"] == top_rows(bench["reports"], rows, LINEUP, 1)
    assert {m.split(".")[0] for m in whole["merges"]} >= {"ram", "ram_plus"} and len(whole["merges"]) <= 3
    assert set(whole["rows"]) == {"base", "bfcl agent", *whole["merges"]}
    assert all(len(r["values"]) == 8 for r in whole["rows"].values())
    agent = evaluate(smoke / "seed0" / "agent_bfcl", ["bfcl"], "test", 8)["bfcl"]
    assert whole["rows"]["bfcl agent"]["values"] == agent["values"]
    assert not (smoke / "seed0" / ".bfcl-whole-merge").exists()  # the merges made again are deleted
    text = (smoke / "docs" / "results.md").read_text()
    assert "## BFCL whole test (strict %, 2 per category)" in text and "- ram-base: " in text


def test_the_report_shows_bfcl_per_category(smoke: Path) -> None:
    seed = json.loads((smoke / "seed0" / "result.json").read_text())
    text = (smoke / "docs" / "results.md").read_text()
    assert "Lineup: bfcl, code, memory" in text and "| method | bfcl | code | memory | mean |" in text
    header = f"| row | {' | '.join(TEST_CATEGORIES)} | BFCL overall | code | memory | capitals |"
    assert "## BFCL per category" in text and header in text
    for name in ("base", "bfcl agent", "code agent", "memory agent", "ram", "ram_plus", "ram.tuned"):
        values = seed["check"]["base"] if name == "base" else seed["bench"]["reports"].get(name)
        values = seed["check"]["agents"][name.split()[0]] if name.endswith("agent") else values
        cells = [f"{100 * v:.1f} ± 0.0" for v in values["bfcl"]["values"]]  # one item per category: SE 0
        assert f"| {name} | {' | '.join(cells)} |" in text, name
    assert "defaults: ram_plus-task_arithmetic on BFCL = " in text
    data = json.loads((smoke / "docs" / "results.json").read_text())
    assert "--lineup bfcl" in data["command"]


def test_a_work_folder_keeps_its_lineup(smoke: Path) -> None:
    """The report and a rerun refuse the other lineup (its check and sweeps would overwrite this one's)."""
    from agentmerge.cli import main

    report = ["zoo", "real", "report", "--work", str(smoke), "--docs", str(smoke / "other")]
    assert main(report) == 2 and not (smoke / "other").exists()
    argv = [a for a in _argv(smoke) if a not in ("--lineup", "bfcl")]
    assert main([*argv, "--quiet"]) == 2


def _report(values: dict[str, list[float]]) -> dict[str, Any]:
    out = {}
    for skill, v in values.items():
        mean = sum(v) / len(v)
        se = math.sqrt(sum((x - mean) ** 2 for x in v) / (len(v) - 1) / len(v))
        out[skill] = {"strict": mean, "strict_se": se, "partial": mean, "n": len(v), "values": v}
    return out


def _bfcl_seed(seed: int, ram_bfcl: list[float]) -> dict[str, Any]:
    flat = {"code": [0.5, 0.5], "memory": [0.25, 0.75], "capitals": [1.0, 0.0]}
    base = _report({"bfcl": [0.0] * 8, **flat})
    agents = {s: _report({"bfcl": [1.0, 0.0] * 4, **flat}) for s in LINEUP}
    reports = {"ram": _report({"bfcl": ram_bfcl, **flat}), "ties": _report({"bfcl": [0.0] * 8, **flat})}
    bench = {"methods": ["ram", "ties"], "tuning": {}, "reports": reports, "failed": {}}
    return {
        "seed": seed,
        "config": {"recipes": [{"skill": s} for s in LINEUP]},
        "check": {"base": base, "agents": agents},
        "bench": bench,
    }


def test_bfcl_categories_are_the_test_sets_consecutive_quarters() -> None:
    """Per category: the mean of its n/4 consecutive items; one seed: ± SE over them; two: mean ± SE over seeds."""
    from agentmerge_zoo.real.aggregate import aggregate
    from agentmerge_zoo.real.report import bfcl_section
    from agentmerge_zoo.real.report_bfcl import bfcl_table, by_category

    assert by_category([1, 2, 3, 4, 5, 6, 7, 8]) == [[1, 2], [3, 4], [5, 6], [7, 8]]
    with pytest.raises(ValueError, match="10 prompts"):
        by_category([0.0] * 10)
    one = [_bfcl_seed(0, [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0])]
    header, rows = bfcl_table(one, aggregate(one))
    assert header == [*TEST_CATEGORIES, "BFCL overall", "code", "memory", "capitals"]
    ram = dict(rows)["ram"]
    assert [c["mean"] for c in ram[:5]] == pytest.approx([1.0, 0.5, 0.0, 0.5, 0.5])
    assert [c["se"] for c in ram[:4]] == pytest.approx([0.0, 0.5, 0.0, 0.5])  # sqrt(p (1 - p) / (m - 1)), m = 2
    assert ram[5]["mean"] == pytest.approx(0.5) and [name for name, _ in rows][:4] == [
        "base",
        *(f"{s} agent" for s in LINEUP),
    ]
    two = [*one, _bfcl_seed(1, [0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0])]
    ram = dict(bfcl_table(two, aggregate(two))[1])["ram"]
    assert ram[0]["mean"] == pytest.approx(0.75) and ram[0]["se"] == pytest.approx(0.25)  # seeds: 1.0 and 0.5
    assert ram[1]["mean"] == pytest.approx(0.75) and ram[1]["se"] == pytest.approx(0.25)
    text = "\n".join(bfcl_section(two, aggregate(two)))
    assert "| ram | 75.0 ± 25.0 | 75.0 ± 25.0 | 0.0 ± 0.0 | 25.0 ± 25.0 | 43.8 ± 6.2 |" in text
    assert "- defaults: ram-ties on BFCL = +43.8 ± 6.2" in text  # the per-seed BFCL differences 0.5 and 0.375


def _whole(seed: dict[str, Any], rows: dict[str, list[float]], top: list[str]) -> dict[str, Any]:
    reports = {name: _report({"bfcl": v})["bfcl"] for name, v in rows.items()}
    merges = [n for n in rows if n not in ("base", "bfcl agent")]
    return seed | {"bfcl_whole": {"run": True, "n": 8, "top": top, "merges": merges, "rows": reports, "failed": {}}}


def test_whole_test_differences_pair_the_same_prompts() -> None:
    """One seed: mean ± SE of the per-prompt differences; two: of the per-seed differences; RAM's row is whichever
    of its rows the seed scored, "best" each seed's top method."""
    from agentmerge_zoo.real.report import whole_section
    from agentmerge_zoo.real.report_bfcl import whole_numbers

    base, agent = [0.0] * 8, [1.0, 0.0] * 4
    ram, ties = [1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0], [1.0] * 4 + [0.0] * 4
    one = [_whole(_bfcl_seed(0, ram), {"base": base, "bfcl agent": agent, "ties": ties, "ram.tuned": ram}, ["ties"])]
    numbers = whole_numbers(one)
    d = numbers["differences"]
    naive = [a - b for a, b in zip(ram, ties, strict=True)]
    mean = sum(naive) / 8
    se = math.sqrt(sum((x - mean) ** 2 for x in naive) / 7 / 8)
    assert d["ram-best"] == pytest.approx({"mean": mean, "se": se, "over": 8.0})
    assert d["ram-base"]["mean"] == pytest.approx(3 / 8) and d["best-base"]["mean"] == pytest.approx(0.5)
    assert "ram_plus-base" not in d  # not scored
    assert [c["mean"] for c in numbers["rows"]["ram.tuned"]["cells"]] == pytest.approx([1.0, 0.0, 0.5, 0.0, 3 / 8])
    second = {"base": base, "bfcl agent": agent, "ram": ties, "ties": ram}  # seed 1: RAM at defaults, tops
    two = [*one, _whole(_bfcl_seed(1, ram), second, ["ram"])]
    d = whole_numbers(two)["differences"]
    assert d["ram-base"]["mean"] == pytest.approx((3 / 8 + 4 / 8) / 2) and d["ram-base"]["se"] == pytest.approx(1 / 16)
    assert "ram-best" not in d  # seed 1's best is RAM itself: not a pair on every seed
    text = "\n".join(whole_section(numbers))
    assert "| ram.tuned | 100.0 ± 0.0 | 0.0 ± 0.0 | 50.0 ± 50.0 | 0.0 ± 0.0 | 37.5 ± 18.3 | 1 |" in text
    assert whole_numbers([_bfcl_seed(0, ram)]) == {"run": False}


def test_a_report_of_mixed_lineups_is_refused() -> None:
    from agentmerge_zoo.real.aggregate import lineup

    default = {"config": {"recipes": [{"skill": s} for s in suite.TRAINED]}}
    assert lineup([default, {"seed": 1}]) == suite.TRAINED  # an old result: the default lineup
    with pytest.raises(ConfigError, match="different lineups"):
        lineup([default, _bfcl_seed(0, [0.0] * 8)])


def test_whole_rows_are_the_top_and_the_paper_methods() -> None:
    from agentmerge_zoo.real.bfcl_whole import WholePlan, whole_rows

    flat = {"code": [0.5, 0.5], "memory": [0.5, 0.5]}
    reports = {
        name: _report({"bfcl": [v, v], **flat})
        for name, v in (("ties", 1.0), ("ties.tuned", 0.5), ("ram", 0.0), ("ram.tuned", 0.5), ("ram_plus", 0.25))
    }
    bench = {"methods": ["ties", "ram", "ram_plus"], "reports": reports}
    assert whole_rows(bench, LINEUP, WholePlan(top=1)) == (["ties"], ["ram.tuned", "ram_plus"])
    assert whole_rows(bench, LINEUP, WholePlan(top=2)) == (["ties", "ram.tuned"], ["ram_plus"])
    assert whole_rows(bench, LINEUP, WholePlan(top=1, ram=False)) == (["ties"], [])
    for bad in (WholePlan(n=6), WholePlan(n=0), WholePlan(top=-1)):
        with pytest.raises(ConfigError, match="bfcl whole test"):
            bad.check()
