"""The fair protocol of the zoo bench: the choice rule, the trials it plans, the defaults and tuned tables and the
regime map under both (synthetic records; the smoke bench runs it end to end)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentmerge.api import choose_scale
from agentmerge_zoo.bench import SeedBench
from agentmerge_zoo.benchplan import METHOD_RUNS, BenchPlan, MethodRun
from agentmerge_zoo.config import ZooConfig
from agentmerge_zoo.fair import defaults_view, output_scale, tuned_view
from agentmerge_zoo.regime_map import regime_map_lines
from agentmerge_zoo.regime_report import main_tables, tuned_rows
from agentmerge_zoo.results import aggregate
from agentmerge_zoo.tasks import metric_columns


def _metrics(code: float, tool: float, memory: float, held: float = 0.9) -> dict[str, float]:
    values = {"code": code, "tool": tool, "memory": memory, "reverse": held}
    return {m: values[m.split(".")[0]] for m in metric_columns()}


def test_the_bench_chooses_with_the_librarys_rule_best_then_nearest_one() -> None:
    assert choose_scale({0.5: 0.2, 1.0: 0.3, 2.0: 0.4}) == 2.0
    assert choose_scale({0.5: 0.4, 1.0: 0.4, 2.0: 0.4}) == 1.0  # identical merges: keep the default
    assert choose_scale({0.5: 0.4, 1.5: 0.4, 3.0: 0.1}) == 0.5  # as near to 1: the smaller
    assert choose_scale({}) is None


def test_field_methods_are_planned_and_scales_come_from_the_registry() -> None:
    labels = [r.label for r in METHOD_RUNS]
    for name in ("magmax", "consensus", "sce", "karcher", "multislerp", "tsv", "iso_c", "iso_cts", "cart", "resmerge"):
        assert name in labels
    assert output_scale("ties") == "scale" and output_scale("ram") == "scale"
    assert output_scale("linear") is None and output_scale("no_such_method") is None


def _bench(tmp_path: Path, runs: tuple[MethodRun, ...]) -> SeedBench:
    plan = BenchPlan(seeds=(0,), scales=(0.5, 1.0, 2.0), methods=runs, fair=True)
    bench = SeedBench(ZooConfig(), plan, 0, {}, tmp_path, lambda _msg: None)
    bench.out = {"val": {}, "rows": {}, "skipped": {}}
    return bench


def _ok(value: float) -> dict[str, Any]:
    return {"status": "ok", "metrics": _metrics(value, value, value)}


def test_fair_bench_tunes_every_output_scale_from_one_grid_and_keeps_defaults(tmp_path: Path) -> None:
    runs = (
        MethodRun("linear", "linear"),
        MethodRun("task_arithmetic", "task_arithmetic"),
        MethodRun("ties", "ties", {"density": 0.5, "scale": 1.0}),
        MethodRun("ram", "ram"),
        MethodRun("tsv", "no_such_method"),
    )
    bench = _bench(tmp_path, runs)
    available = {"linear", "task_arithmetic", "ties", "ram"}
    names = [e["name"] for e in bench.val_entries(available)]
    assert names == [
        *("ta_lambda0.5", "ta_lambda1", "ta_lambda2"),  # task arithmetic keeps its older trial names
        *("ties_tune0.5", "ties_tune1", "ties_tune2"),
        *("ram_tune0.5", "ram_tune1", "ram_tune2"),
    ]
    scores = {"ta_lambda0.5": 0.1, "ta_lambda1": 0.2, "ta_lambda2": 0.3, "ties_tune0.5": 0.4, "ties_tune1": 0.3}
    scores |= {"ties_tune2": 0.1, "ram_tune0.5": 0.2, "ram_tune1": 0.2, "ram_tune2": 0.2}
    bench.read_val({n: _ok(v) for n, v in scores.items()})
    assert (
        bench.out["val"]["task_arithmetic"]["best"] == 2.0 and "best_lambda" not in bench.out["val"]["task_arithmetic"]
    )
    assert bench.out["val"]["ties"] == {
        "param": "scale",  # every output scale is called scale
        "best": 0.5,
        "val_agentic_avg": {"0.5": pytest.approx(0.4), "1": pytest.approx(0.3), "2": pytest.approx(0.1)},
    }
    assert bench.out["val"]["ram"]["best"] == 1.0  # a tie: the default
    entries = {e["name"]: e for e in bench.test_entries(available, None)}
    assert set(entries) == {"linear", "task_arithmetic", "ta_lambda2", "ties", "ties_at0.5", "ram"}
    assert entries["task_arithmetic"]["params"] == {} and entries["ta_lambda2"]["params"] == {"scale": 2.0}
    assert entries["ties_at0.5"]["params"] == {"density": 0.5, "scale": 0.5}
    assert "method not in the engine registry" in bench.out["skipped"]["tsv"]
    bench.read_test({name: _ok(0.1 * i) for i, name in enumerate(entries)})
    rows = bench.out["rows"]
    assert set(rows) == {"linear", "task_arithmetic", "task_arithmetic.tuned", "ties", "ties.tuned", "ram", "ram.tuned"}
    assert rows["ram.tuned"] == rows["ram"]  # the default won: the same merge
    assert rows["ties.tuned"] != rows["ties"]


def test_without_the_fair_protocol_only_task_arithmetic_is_tuned(tmp_path: Path) -> None:
    bench = _bench(tmp_path, (MethodRun("task_arithmetic", "task_arithmetic"), MethodRun("ram", "ram")))
    bench.plan = BenchPlan(seeds=(0,), scales=(0.5, 1.0), methods=bench.plan.methods)
    names = [e["name"] for e in bench.val_entries({"task_arithmetic", "ram"})]
    assert names == ["ta_lambda0.5", "ta_lambda1"]
    bench.read_val({"ta_lambda0.5": _ok(0.3), "ta_lambda1": _ok(0.2)})
    assert [e["name"] for e in bench.test_entries({"task_arithmetic", "ram"}, None)] == ["ta_lambda0.5", "ram"]


def _record(seed: int, bump: float) -> dict[str, Any]:
    """A fair seed record: TA at defaults below linear; tuned TA best; RAM's tuned row better than its default."""
    rows = {
        "base": _metrics(0.1, 0.2, 0.4),
        "agent_code": _metrics(0.5, 0.2, 0.4),
        "agent_tool": _metrics(0.1, 0.6, 0.4),
        "agent_memory": _metrics(0.1, 0.2, 0.8),
        "linear": _metrics(0.30 + bump, 0.4, 0.6),
        "task_arithmetic": _metrics(0.28 + bump, 0.4, 0.6),
        "task_arithmetic.tuned": _metrics(0.40 + bump, 0.5, 0.7),
        "ram": _metrics(0.31, 0.4, 0.6),
        "ram.tuned": _metrics(0.35, 0.5, 0.7),
    }
    val = {"task_arithmetic": {"param": "lambda", "best": 2.0, "best_lambda": 2.0}, "ram": {"param": "scale"}}
    val["ram"]["best"] = 1.5 + bump
    return {"seed": seed, "rows": rows, "val": val, "skipped": {}, "dilution": {}, "timing": {}}


def test_views_split_defaults_and_tuned_rows() -> None:
    records = [_record(0, 0.0)]
    assert "ram.tuned" not in defaults_view(records)[0]["rows"]
    tuned = tuned_view(records)[0]["rows"]
    assert tuned["ram"] == records[0]["rows"]["ram.tuned"] and tuned["linear"] == records[0]["rows"]["linear"]
    assert "ram.tuned" not in tuned


def test_aggregate_reports_both_tables_and_the_map_under_both() -> None:
    res = aggregate([_record(0, 0.0), _record(1, 0.02)], {"command": "x", "config": {"n_test": 1}})
    assert res["map"]["best_baseline"] == "linear"  # at defaults TA (lambda 1) is below linear
    assert res["map_tuned"]["best_baseline"] == "task_arithmetic"
    assert res["map_tuned"]["ram_minus_best_baseline"]["mean"] < 0 < res["map"]["ram_minus_best_baseline"]["mean"]
    assert res["tuned_choice"]["ram"] == {"param": "scale", "values": [1.5, 1.52]}
    rows = tuned_rows(res)
    assert "ram (scale 1.5, 1.52)" in rows and "task_arithmetic (lambda 2, 2)" in rows and "linear" in rows
    text = "\n".join(main_tables(res))
    assert "### Main table at defaults (3 agents)" in text and "### Main table tuned (3 agents)" in text
    lines = "\n".join(regime_map_lines({"regimes": {"bf16": res}}, None))
    assert "RAM − best baseline at defaults (pts)" in lines and "RAM − best baseline, tuned (pts)" in lines
    assert "(vs task_arithmetic)" in lines and "(vs linear)" in lines
    assert "Tuned alike: RAM vs the best baseline (task_arithmetic): lower by" in lines


def test_older_results_render_without_a_tuned_table() -> None:
    record = _record(0, 0.0)
    record["rows"] = {k: v for k, v in record["rows"].items() if not k.endswith(".tuned")}
    res = aggregate([record], {"command": "x", "config": {"n_test": 1}})
    assert "map_tuned" not in res
    assert "### Main table (3 agents)" in "\n".join(main_tables(res))
    assert "tuned" not in "\n".join(regime_map_lines({"regimes": {"bf16": res}}, None))
    fair = aggregate([_record(0, 0.0)], {"command": "x", "config": {"n_test": 1}})
    mixed = "\n".join(regime_map_lines({"regimes": {"bf16": fair, "paper_like": res}}, None))
    row = next(line for line in mixed.splitlines() if line.startswith("| `paper_like`"))
    assert "| n/a | " in row and "older protocol: only task arithmetic tuned" in row  # neither table: says so


def test_bench_methods_flag_rejects_unknown_labels_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from agentmerge.cli import main
    from agentmerge_zoo.cli import CORE_METHODS, method_labels

    assert method_labels("core") == set(CORE_METHODS) and set(CORE_METHODS) <= {m.label for m in METHOD_RUNS}
    assert method_labels("ram, task_arithmetic,") == {"ram", "task_arithmetic"}
    argv = ["zoo", "bench", "--zoo", str(tmp_path / "zoo"), "--work", str(tmp_path / "w"), "--docs", str(tmp_path)]
    assert main([*argv, "--methods", "ram,ram_pluss", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "no method labelled 'ram_pluss'" in err and "did you mean 'ram_plus'" in err
    assert not (tmp_path / "zoo").exists() and not (tmp_path / "w").exists()


def test_results_written_before_the_scale_rename_still_read() -> None:
    """The zoo's own keys say ``scale`` now (``task_arithmetic_scale``, ``ta_scale``, a seed's ``best``); results
    files written before keep ``task_arithmetic_lambda``, ``ta_lambda`` and ``best_lambda``, and read the same."""
    from agentmerge_zoo.fair import chosen_scale, read_key
    from agentmerge_zoo.regime_report import _regime_notes, pairs_lines

    assert chosen_scale({"best": 2.0, "best_lambda": 9.0}) == 2.0 and chosen_scale({"best_lambda": 1.5}) == 1.5
    assert chosen_scale({}) is None and chosen_scale({"best": "x"}) is None
    assert read_key({"ta_lambda": [1.0]}, "ta_scale") == [1.0] and read_key({}, "ta_scale", []) == []
    assert read_key({"ta_scale": [2.0], "ta_lambda": [1.0]}, "ta_scale") == [2.0]
    pair = {"domains": ["code"], "rows": {}, "diffs": {}}
    new = {"pairs": {"code+tool": {**pair, "ta_scale": [0.5, 2.0]}}, "task_arithmetic_scale": [{"best": 1.5}, {}]}
    old = {
        "pairs": {"code+tool": {**pair, "ta_lambda": [0.5, 2.0]}},
        "task_arithmetic_lambda": [{"best_lambda": 1.5}, {}],
    }
    for res in (new, old):
        assert "**code+tool** (task arithmetic λ per seed: 0.5, 2)" in pairs_lines(res)
        notes = _regime_notes({**res, "skipped": {}})
        assert "- task_arithmetic λ chosen on validation, per seed: 1.5." in notes
