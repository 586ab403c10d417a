"""The many-agent study: subset sampling, retained gain, aggregation and rendering (synthetic records), and one
tiny end-to-end run of ``agentmerge zoo many --smoke``."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from agentmerge.cli import build_parser
from agentmerge_zoo.many import subsets
from agentmerge_zoo.many_report import aggregate_many, gain_kept, render_many, write_many
from agentmerge_zoo.tasks import SIX_DOMAINS

DOMAINS = ("code", "math", "sort")


def test_subsets_are_fixed_and_cover_each_size() -> None:
    got = subsets(SIX_DOMAINS, (2, 3, 4, 6), 5)
    assert got == subsets(SIX_DOMAINS, (2, 3, 4, 6), 5)  # the same subsets in every seed
    assert [len(s) for s in got] == [2] * 5 + [3] * 5 + [4] * 5 + [6]
    assert len(set(got)) == len(got)
    assert all(list(s) == sorted(s, key=SIX_DOMAINS.index) for s in got)
    assert subsets(DOMAINS, (2,), 5) == list(itertools.combinations(DOMAINS, 2))  # fewer than 5 exist: all
    assert subsets(SIX_DOMAINS, (2,), 5, seed=1) != subsets(SIX_DOMAINS, (2,), 5, seed=0)
    with pytest.raises(ValueError, match="between 2 and 3"):
        subsets(DOMAINS, (4,), 1)


def _metrics(**domain_scores: float) -> dict[str, float]:
    names = {"code": ("code.exact", "code.partial"), "math": ("math.exact", "math.partial"), "sort": ("sort.exact",)}
    return {m: v for d, v in domain_scores.items() for m in names[d]}


def test_gain_kept_is_the_share_of_the_summed_gain() -> None:
    rows = {
        "base": _metrics(code=0.2, math=0.1),
        "agent_code": _metrics(code=0.6),
        "agent_math": _metrics(math=0.3),
        "m": _metrics(code=0.4, math=0.2),
    }
    assert gain_kept(rows, ("code", "math"), "m") == pytest.approx((0.2 + 0.1) / (0.4 + 0.2))
    rows["base_only"] = rows["base"]
    assert gain_kept(rows, ("code", "math"), "base_only") == pytest.approx(0.0)
    assert gain_kept(rows, ("code",), "agent_code") == pytest.approx(1.0)


def _record(seed: int, shift: float) -> dict[str, Any]:
    """A seed whose merges keep a known share of the gain: ram 0.5 + shift, linear 0.5 / N, ta 0.8."""
    zoo = {"base": _metrics(code=0.2, math=0.2, sort=0.2)}
    zoo |= {f"agent_{d}": _metrics(**{d: 0.6}) for d in DOMAINS}
    out: dict[str, Any] = {"seed": seed, "zoo": zoo, "subsets": {}}
    for group in subsets(DOMAINS, (2, 3), 5):
        n = len(group)
        rows = {"base": zoo["base"], **{f"agent_{d}": zoo[f"agent_{d}"] for d in group}}
        for label, kept in (("linear", 0.5 / n), ("task_arithmetic", 0.8), ("ram", 0.5 + shift)):
            rows[label] = _metrics(**{d: 0.2 + 0.4 * kept for d in group})
        crowd = {"unique": 0.5 / n, "shared": 0.1 * n, "shared_independent": 0.1 * n, "conflict": 0.2}
        val = {"task_arithmetic": {"best_lambda": float(n)}}
        out["subsets"]["+".join(group)] = {"domains": list(group), "rows": rows, "val": val, "crowding": crowd}
    return out


def test_aggregate_gives_curves_against_n(tmp_path: Path) -> None:
    records = [_record(0, 0.0), _record(1, 0.1)]
    res = aggregate_many(records, {"command": "agentmerge zoo many", "regime": "fp32_bf16"})
    assert res["sizes"] == [2, 3]
    assert list(res["views"]) == ["as run"]  # an older study: one view
    view = res["views"]["as run"]
    assert view["kept"]["linear"]["2"]["mean"] == pytest.approx(0.25)
    assert view["kept"]["linear"]["3"]["mean"] == pytest.approx(0.5 / 3)
    assert view["kept"]["ram"]["3"]["mean"] == pytest.approx(0.55)
    assert view["kept"]["ram"]["3"]["se"] == pytest.approx(0.05)  # over the two seeds
    assert view["minus"]["ram"]["task_arithmetic"]["2"]["mean"] == pytest.approx(0.25)
    assert view["minus"]["task_arithmetic"]["ram"]["2"]["mean"] == pytest.approx(-0.25)
    assert res["crowding"]["shared"]["3"]["mean"] == pytest.approx(0.3)
    assert res["chosen"]["task_arithmetic"]["2"]["mean"] == pytest.approx(2.0)
    assert res["specialists"]["math"]["gain"]["mean"] == pytest.approx(0.4)
    text = render_many(res, "many-agents.png")
    assert text.startswith("# Many-agent study: merges of 2 and 3 agents")
    assert "| ram | 55.0 ± 5.0 | 55.0 ± 5.0 |" in text
    assert "| linear | 25.0 ± 0.0 | 16.7 ± 0.0 |" in text
    json_path, md_path = write_many(res, tmp_path)
    assert json.loads(json_path.read_text())["sizes"] == [2, 3]
    assert (tmp_path / "many-agents.png").stat().st_size > 1000 and md_path.read_text() == text


def _fair_record(seed: int) -> dict[str, Any]:
    """A fair study's seed: ram at defaults keeps 0.5, tuned 0.9; task arithmetic 0.6 and 0.8; linear has no
    output scale (no tuned row)."""
    record = _record(seed, 0.0)
    for sub in record["subsets"].values():
        rows, group = sub["rows"], sub["domains"]
        for label, default, tuned in (("ram", 0.5, 0.9), ("task_arithmetic", 0.6, 0.8)):
            rows[label] = _metrics(**{d: 0.2 + 0.4 * default for d in group})
            rows[label + ".tuned"] = _metrics(**{d: 0.2 + 0.4 * tuned for d in group})
        sub["val"] = {"ram": {"param": "scale", "best": 3.0}, "task_arithmetic": {"best": 2.0, "best_lambda": 2.0}}
    return record


def test_a_fair_study_has_a_defaults_and_a_tuned_view(tmp_path: Path) -> None:
    res = aggregate_many([_fair_record(0), _fair_record(1)], {"command": "c", "regime": "fp32_bf16"})
    assert list(res["views"]) == ["defaults", "tuned"]
    defaults, tuned = res["views"]["defaults"], res["views"]["tuned"]
    assert set(defaults["kept"]) == set(tuned["kept"]) == {"linear", "task_arithmetic", "ram"}  # no ".tuned" label
    assert defaults["kept"]["ram"]["2"]["mean"] == pytest.approx(0.5)
    assert tuned["kept"]["ram"]["2"]["mean"] == pytest.approx(0.9)
    assert tuned["kept"]["linear"]["3"]["mean"] == pytest.approx(0.5 / 3)  # no output scale: its defaults row
    assert defaults["minus"]["ram"]["task_arithmetic"]["3"]["mean"] == pytest.approx(0.1)
    assert tuned["minus"]["ram"]["task_arithmetic"]["3"]["mean"] == pytest.approx(-0.1)
    assert res["chosen"]["ram"]["2"]["mean"] == pytest.approx(3.0)
    # the best baseline of each N: task arithmetic (0.6 / 0.8) over linear (0.5 / N)
    assert defaults["best"]["label"] == tuned["best"]["label"] == {"2": "task_arithmetic", "3": "task_arithmetic"}
    assert defaults["best"]["minus"]["ram"]["2"]["mean"] == pytest.approx(-0.1)
    assert tuned["best"]["minus"]["ram"]["3"]["mean"] == pytest.approx(0.1)
    assert "linear" not in defaults["best"]["minus"] and "task_arithmetic" not in tuned["best"]["minus"]
    text = render_many(res | {"meta": res["meta"] | {"steps": {"code": 80, "math": 120}}}, None)
    assert "## Share of the specialists' gain kept, against N: defaults" in text
    assert "## Share of the specialists' gain kept, against N: tuned" in text
    assert "| ram | 90.0 ± 0.0 | 90.0 ± 0.0 |" in text and "| ram | 50.0 ± 0.0 | 50.0 ± 0.0 |" in text
    assert "Agents' RL steps: code 80, math 120. The convergence check" in text
    assert "`docs/convergence/six-fp32_bf16.md`" in text
    assert "### RAM against the best baseline of each N (points of gain kept, tuned)" in text
    assert "| ram − best | 10.0 ± 0.0 | 10.0 ± 0.0 |" in text and "| ram − best | -10.0 ± 0.0 | -10.0 ± 0.0 |" in text
    write_many(res, tmp_path)
    assert (tmp_path / "many-agents.png").stat().st_size > 1000


def test_zoo_many_smoke_end_to_end(tmp_path: Path) -> None:
    """Build the tiny six-domain zoo and run the study's smoke plan; the tables come out with every method."""
    zoo, work, docs = tmp_path / "zoo", tmp_path / "work", tmp_path / "docs"
    common = ["--zoo", str(zoo), "--work", str(work), "--docs", str(docs), "--seeds", "0", "--smoke"]
    args = build_parser().parse_args(["zoo", "many", *common, "--threads", "1", "--quiet"])
    assert args.func(args) == 0
    assert (zoo / "six" / "seed0" / "base" / "model.safetensors").is_file()
    assert not (zoo / "seed0").exists()  # the six-domain zoo never touches the core zoo's folders
    res = json.loads((docs / "results.json").read_text())
    assert res["sizes"] == [2, 6]
    assert list(res["views"]) == ["defaults", "tuned"]  # the fair protocol by default
    assert set(res["views"]["tuned"]["kept"]) == {"linear", "task_arithmetic", "ram"}
    assert res["meta"]["plan"]["fair"] and set(res["chosen"]) == {"task_arithmetic", "ram"}
    six = res["records"][0]["subsets"]["+".join(SIX_DOMAINS)]
    assert set(six["rows"]["ram"]) >= {"math.exact", "sort.exact", "search.exact", "code.exact"}
    assert {"ram.tuned", "task_arithmetic.tuned"} <= set(six["rows"]) and "linear.tuned" not in six["rows"]
    assert 0.0 <= six["crowding"]["shared"] <= 1.0
    assert res["meta"]["steps"] == dict.fromkeys(SIX_DOMAINS, 2)  # the smoke recipes' steps
    before = (docs / "results.md").read_text()
    rerender = build_parser().parse_args(["zoo", "many", "--docs", str(docs), "--render-only"])
    assert rerender.func(rerender) == 0
    assert (docs / "results.md").read_text() == before


def test_zoo_check_of_the_six_domain_zoo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``zoo check --suite six`` checks all six agents of ZOO/six and keeps its files apart from the core zoo's."""
    zoo, work = tmp_path / "zoo", tmp_path / "work"
    argv = ["zoo", "check", "--zoo", str(zoo), "--work", str(work), "--regime", "fp32_bf16", "--suite", "six"]
    args = build_parser().parse_args([*argv, "--seeds", "0", "--n", "4", "--smoke", "--threads", "1", "--quiet"])
    assert args.func(args) == 0
    assert capsys.readouterr().out.rstrip().endswith("steps: " + ",".join(f"{d}=2" for d in SIX_DOMAINS))
    data = json.loads((work / "many" / "fp32_bf16" / "convergence.json").read_text())
    assert set(data["rounds"][0]["checks"]["0"]) == set(SIX_DOMAINS)
    assert "--suite six" in data["command"]
    assert list((work / "evals" / "six" / "seed0").glob("agent_search.*.json"))
    assert not (work / "evals" / "seed0").exists() and not (zoo / "seed0").exists()
