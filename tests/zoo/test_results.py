"""Aggregation over seeds and the Markdown report, on synthetic per-seed records."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from agentmerge_zoo.results import aggregate, stat, write_results
from agentmerge_zoo.tasks import metric_columns


def _metrics(code: float, tool: float, memory: float, held: float = 0.9) -> dict[str, float]:
    values = {"code": code, "tool": tool, "memory": memory, "reverse": held}
    return {m: values[m.split(".")[0]] for m in metric_columns()}


def _record(seed: int, bump: float) -> dict[str, Any]:
    probe_agent = {"density": 0.3, "overlap": [0.2, 0.5, 0.3], "rho": 4.0, "lam": 1.2}
    return {
        "seed": seed,
        "rows": {
            "base": _metrics(0.1, 0.2, 0.4),
            "agent_code": _metrics(0.5 + bump, 0.2, 0.4),
            "agent_tool": _metrics(0.1, 0.6 + bump, 0.4),
            "agent_memory": _metrics(0.1, 0.2, 0.8 + bump),
            "linear": _metrics(0.3, 0.4, 0.6),
        },
        "val": {"task_arithmetic": {"best_lambda": 1.0, "val_agentic_avg": {"1": 0.5}}},
        "skipped": {"fisher": "method not in the engine registry"},
        "dilution": {
            d: {"s1": _metrics(0.2, 0.3, 0.5), "s1_over_n": _metrics(0.1, 0.2, 0.4)} for d in ("code", "tool", "memory")
        },
        "probe": {
            "agents": [dict(probe_agent, name=n) for n in ("agent_code", "agent_tool", "agent_memory")],
            "independent_overlap": [[0.4, 0.45, 0.15]] * 3,
        },
        "timing": {"build": 10.0, "total": 20.0},
    }


def test_stat_mean_and_standard_error() -> None:
    cell = stat([1.0, 2.0, 3.0])
    assert cell["mean"] == 2.0
    assert cell["se"] == pytest.approx(1.0 / math.sqrt(3))
    assert stat([5.0])["se"] == 0.0


def test_aggregate_gains_retention_and_dilution() -> None:
    res = aggregate([_record(0, 0.0), _record(1, 0.1)], {"command": "agentmerge zoo bench", "config": {"n_test": 1}})
    assert res["seeds"] == [0, 1]
    assert res["rows"]["agent_code"]["code.exact"]["mean"] == pytest.approx(0.55)
    assert res["gains"]["code"]["code.exact"]["mean"] == pytest.approx(0.45)
    assert res["gains"]["memory"]["domain_avg"]["values"] == pytest.approx([0.4, 0.5])
    retention = res["retention"]["linear"]["code"]["values"]
    assert retention == pytest.approx([0.2 / 0.4, 0.2 / 0.5])
    assert res["retention"]["agent_tool"]["tool"]["mean"] == pytest.approx(1.0)
    assert res["dilution"]["tool"]["s1"]["mean"] == pytest.approx(0.3)
    assert res["probe"]["agents"]["agent_tool"]["density"]["mean"] == pytest.approx(0.3)
    assert res["skipped"] == {"fisher": "method not in the engine registry"}


def test_write_results_files(tmp_path: Path) -> None:
    meta = {"command": "agentmerge zoo bench --seeds 0,1", "config": {"n_test": 1000}, "threads": 1}
    res = aggregate([_record(0, 0.0), _record(1, 0.1)], meta)
    json_path, md_path = write_results(res, tmp_path)
    loaded = json.loads(json_path.read_text())
    assert loaded["rows"]["linear"]["agentic_avg"]["mean"] == pytest.approx(
        sum(_metrics(0.3, 0.4, 0.6)[m] for m in metric_columns()[:6]) / 6
    )
    text = md_path.read_text()
    assert "`agentmerge zoo bench --seeds 0,1`" in text
    assert "| linear |" in text
    assert "`fisher` not in the table" in text


def test_render_only_rebuilds_markdown_from_json(tmp_path: Path) -> None:
    from agentmerge_zoo.results import render_from_json

    meta = {"command": "agentmerge zoo bench", "config": {"n_test": 1000}, "threads": 1}
    _, md_path = write_results(aggregate([_record(0, 0.0), _record(1, 0.1)], meta), tmp_path)
    before = md_path.read_text()
    md_path.write_text("stale")
    assert render_from_json(tmp_path).read_text() == before


def test_variants_are_paired_against_ram_and_never_the_best_baseline() -> None:
    records = [_record(0, 0.0), _record(1, 0.1)]
    for r, shift in zip(records, (0.0, 0.02), strict=True):
        r["rows"]["ram"] = _metrics(0.35, 0.45, 0.6)
        r["rows"]["v_ram_elect"] = _metrics(0.9 + shift, 0.9, 0.9)  # far above everything: must not be "baseline"
    res = aggregate(records, {"command": "agentmerge zoo bench", "config": {"n_test": 1}})
    assert res["map"]["best_baseline"] == "linear"
    entry = res["variants"]["v_ram_elect"]
    assert entry["best_baseline"] == "linear" and set(entry["minus"]) == {"ram", "linear"}
    n = len(metric_columns()[:6])
    code_cols = sum(1 for m in metric_columns()[:6] if m.startswith("code"))
    expected = [(0.9 + s - 0.35) * code_cols / n + (0.9 - 0.45) * 2 / n + (0.9 - 0.6) * 2 / n for s in (0.0, 0.02)]
    assert entry["minus"]["ram"]["values"] == pytest.approx(expected)
    from agentmerge_zoo.regime_report import variant_lines

    text = "\n".join(variant_lines(res))
    assert "`v_ram_elect`" in text and "− ram (pts)" in text and "− linear (pts)" in text


def test_a_tuned_variant_is_chosen_on_validation_and_run_at_its_value(tmp_path: Path) -> None:
    from agentmerge_zoo.bench import SeedBench
    from agentmerge_zoo.benchplan import BenchPlan, MethodRun
    from agentmerge_zoo.config import ZooConfig

    run = MethodRun("v_ram_scaled", "ram", tune="scale")
    plan = BenchPlan(seeds=(0,), tune_grid=(0.5, 1.0, 2.0), methods=(run,))
    bench = SeedBench(ZooConfig(), plan, 0, {}, tmp_path, lambda _msg: None)
    bench.out = {"val": {}, "rows": {}, "skipped": {}}
    names = [e["name"] for e in bench.val_entries({"ram"})]
    assert names == ["v_ram_scaled_tune0.5", "v_ram_scaled_tune1", "v_ram_scaled_tune2"]
    scores = {"v_ram_scaled_tune0.5": 0.2, "v_ram_scaled_tune1": 0.5, "v_ram_scaled_tune2": 0.4}
    records = {n: {"status": "ok", "metrics": _metrics(v, v, v)} for n, v in scores.items()}
    bench.read_val(records)
    assert bench.out["val"]["v_ram_scaled"]["best"] == 1.0
    (entry,) = bench.test_entries({"ram"}, None)
    assert entry["name"] == "v_ram_scaled_at1" and entry["params"] == {"scale": 1.0}
