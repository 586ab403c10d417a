"""The real zoo's report numbers on made-up seed results: cells over seeds, gain kept, paired differences."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from agentmerge_zoo.real.aggregate import aggregate, best_baseline, gain_kept, paired
from agentmerge_zoo.real.report import differences, kept_note, write_results

SKILLS = ("tool", "code", "memory", "capitals")


def _report(scores: dict[str, list[float]]) -> dict[str, Any]:
    out = {}
    for skill, values in scores.items():
        mean = sum(values) / len(values)
        out[skill] = {"strict": mean, "strict_se": 0.1, "partial": mean, "n": len(values), "values": values}
    return out


def _flat(level: float) -> dict[str, Any]:
    return _report({s: [level] * 4 for s in SKILLS})


def _seed(seed: int, ram: float, ties: float) -> dict[str, Any]:
    base = _flat(0.25)
    agents = {s: _report({k: [0.75 if k == s else 0.25] * 4 for k in SKILLS}) for s in SKILLS[:3]}
    check: dict[str, Any] = {"base": base, "agents": agents, "digests": {}}
    check["convergence"] = {
        s: {
            "scores": {"1": {"strict": 0.7}, "1.5": {"strict": 0.72}},
            "converged": True,
            "gain_1.5": 0.02,
            "two_se": 0.1,
        }
        for s in SKILLS[:3]
    }
    check["probe"] = {s: {"density": 0.5, "overlap": [0.2, 0.3, 0.5], "drift": 1e-3} for s in SKILLS[:3]}
    check["probe"]["tool"] |= {"independent": [0.25, 0.5, 0.25], "rho": 4.0, "lambda": 1.25}
    reports = {"ram": _flat(ram), "ties": _flat(ties), "ram.tuned": _flat(ram), "ties.tuned": _flat(ties + 0.25)}
    reports["tool+code.ram"] = _report({"tool": [ram] * 4, "code": [ram] * 4, "capitals": [0.25] * 4})
    tuning = {"ram": {"param": "scale", "value": 1.0, "val": {}}, "ties": {"param": "lambda", "value": 1.5, "val": {}}}
    bench = {"methods": ["ram", "ties"], "tuning": tuning, "reports": reports, "failed": {}}
    recipes = [{"skill": s, "storage": "bf16"} for s in SKILLS[:3]]
    curves = {s: [{"reward": 0.1 * i} for i in range(6)] for s in SKILLS[:3]}
    return {"seed": seed, "config": {"recipes": recipes}, "check": check, "bench": bench, "curves": curves}


def test_cells_are_means_over_seeds_with_their_standard_error() -> None:
    seeds = [_seed(0, 0.5, 0.25), _seed(1, 0.75, 0.5)]
    agg = aggregate(seeds)
    ram = agg["tables"]["defaults"]["ram"]
    assert ram["tool"]["mean"] == pytest.approx(0.625)
    assert ram["tool"]["se"] == pytest.approx(0.125)  # sd of (0.5, 0.75) / sqrt(2)
    assert ram["gain_kept"]["mean"] == pytest.approx((0.5 + 1.0) / 2)  # (0.5-0.25)/0.5 and (0.75-0.25)/0.5
    assert ram["capitals_delta"]["mean"] == pytest.approx(0.375)
    diff = agg["differences"]["defaults"]["ram-ties"]
    assert diff["mean"] == pytest.approx(0.25) and diff["se"] == pytest.approx(0.0)
    assert agg["differences"]["tuned"]["best_baseline"] == "ties"
    assert agg["differences"]["tuned"]["ram-ties"]["mean"] == pytest.approx(0.0)
    assert set(agg["pairs"]) == {"tool+code.ram"}
    assert ram["code_kept"]["mean"] == pytest.approx(0.75) and ram["code_kept"]["se"] == pytest.approx(0.25)
    assert agg["differences"]["defaults"]["best"] == "ram"
    assert "ram-task_arithmetic" not in agg["differences"]["defaults"]  # no task arithmetic row to pair with


def test_differences_pair_ram_with_task_arithmetic_and_ram_plus_with_ram() -> None:
    seeds = [_seed(0, 0.5, 0.25), _seed(1, 0.75, 0.5)]
    for seed, level in zip(seeds, (0.25, 0.5), strict=True):
        reports = seed["bench"]["reports"]
        reports["task_arithmetic"], reports["ram_plus"] = _flat(level + 0.25), _flat(level + 0.5)
        seed["bench"]["methods"] += ["task_arithmetic", "ram_plus"]
    diffs = aggregate(seeds)["differences"]["defaults"]
    assert diffs["best"] == "ram_plus" and diffs["best_baseline"] == "task_arithmetic"
    assert diffs["ram-task_arithmetic"]["mean"] == pytest.approx(0.0)  # ram 0.5 / 0.75, task arithmetic the same
    assert diffs["ram_plus-ram"]["mean"] == pytest.approx(0.25)


def test_one_seed_pairs_prompts() -> None:
    seed = _seed(0, 0.5, 0.25)
    seed["bench"]["reports"]["ram"]["tool"]["values"] = [1.0, 0.0, 1.0, 0.0]
    d = paired([seed], "ram", "ties")
    assert d is not None and d["over"] == 12
    diffs = [0.75, -0.25, 0.75, -0.25] + [0.25] * 8
    mean = sum(diffs) / 12
    assert d["mean"] == pytest.approx(mean)
    assert d["se"] == pytest.approx(math.sqrt(sum((x - mean) ** 2 for x in diffs) / 11 / 12))
    assert paired([seed], "ram", "missing") is None


def test_gain_kept_skips_agents_that_did_not_beat_the_base() -> None:
    seed = _seed(0, 0.5, 0.25)
    agents = seed["check"]["agents"]
    agents["code"] = _flat(0.25)  # no gain on code
    kept = gain_kept(_flat(0.5), seed["check"]["base"], agents)
    assert kept == pytest.approx(0.5)
    assert math.isnan(gain_kept(_flat(0.5), _flat(0.9), agents))


def test_kept_note_names_the_seeds_whose_agent_beat_the_base() -> None:
    seeds = [_seed(0, 0.5, 0.25), _seed(1, 0.5, 0.25)]
    seeds[1]["check"]["agents"]["code"] = _flat(0.25)  # seed 1's code agent: no gain
    seeds[0]["check"]["agents"]["tool"] = _flat(0.2)  # seed 0's tool agent: below the base
    note = kept_note(seeds)
    assert "tool 1; code 0; memory 0, 1." in note
    seeds[1]["check"]["agents"]["tool"] = _flat(0.25)
    assert "tool none;" in kept_note(seeds)


def test_best_baseline_is_never_a_ram_method() -> None:
    rows = {"ram": {"trained_avg": {"mean": 0.9}}, "ram_plus": {"trained_avg": {"mean": 0.95}}}
    rows |= {"ties": {"trained_avg": {"mean": 0.4}}, "linear": {"trained_avg": {"mean": 0.5}}}
    assert best_baseline(rows) == "linear"
    assert best_baseline({"ram": {"trained_avg": {"mean": 0.9}}}) is None


def test_write_results_renders_every_section(tmp_path: Path) -> None:
    for s in (0, 1):
        (tmp_path / f"seed{s}").mkdir()
        result = _seed(s, 0.5 + 0.25 * s, 0.25)
        result["check"]["convergence"]["tool"]["gain_1.5"] = -0.05 * s
        (tmp_path / f"seed{s}" / "result.json").write_text(json.dumps(result))
    json_path, md_path = write_results(tmp_path, [0, 1], tmp_path / "docs", "agentmerge zoo real run ...")
    text = md_path.read_text()
    assert "| yes (+2.0 vs 2 SE 10.0) |" in text  # the verdict's margin, signed once
    assert "| yes (-5.0 vs 2 SE 10.0) |" in text
    headings = ("## Agents", "## Probe", "## Defaults", "## Tuned", "## Paired differences", "## Share", "## Pairs")
    for heading in (*headings, "## Dilution"):
        assert heading in text
    assert (
        "| 0 | tool | 50.0 | 20.0 / 30.0 / 50.0 | 25.0 / 50.0 / 25.0 | 4.00 | 1.250 | 0.52 / - | 46.2, 40.8 / 56.1 / 3.1 |"
        in text
    )
    assert "| ram.tuned | 75 ± 25 | 75 ± 25 | 75 ± 25 | 75 ± 25 |" in text
    assert (tmp_path / "docs" / "curves.png").stat().st_size > 0
    assert "lambda=1.5, lambda=1.5" in text  # the chosen scale of each seed
    assert "defaults: ram-ties = +37.5 ± 12.5 over seeds (± 0.0 over prompts)" in text  # 25 and 50, flat prompts
    data = json.loads(json_path.read_text())
    assert "values" not in json.dumps(data)  # per-prompt lists stay in the work folder
    assert data["aggregate"]["seeds"] == [0, 1]


def test_a_method_benched_in_fewer_seeds_says_so_and_is_never_the_best(tmp_path: Path) -> None:
    seeds = [_seed(0, 0.5, 0.25), _seed(1, 0.5, 0.25)]
    seeds[1]["bench"]["reports"]["tsv"] = _flat(0.9)  # a later bench added TSV-M to seed 1 only: best by far
    seeds[1]["bench"]["methods"] = [*seeds[1]["bench"]["methods"], "tsv"]
    agg = aggregate(seeds)
    assert agg["tables"]["defaults"]["tsv"]["trained_avg"]["seeds"] == 1
    assert agg["differences"]["defaults"]["best"] == "ram"
    assert agg["differences"]["defaults"]["best_baseline"] == "ties"
    for s in seeds:
        (tmp_path / f"seed{s['seed']}").mkdir()
        (tmp_path / f"seed{s['seed']}" / "result.json").write_text(json.dumps(s))
    text = write_results(tmp_path, [0, 1], tmp_path / "docs", "cmd")[1].read_text()
    assert "| tsv (1 of 2 seeds) | 90.0 ± 10.0 |" in text
    assert "| ram | " in text and "| ram (" not in text


def test_kept_rows_average_each_agents_share_over_the_seeds_that_measured_it(tmp_path: Path) -> None:
    from agentmerge_zoo.real.aggregate import kept_rows

    def kept(x: float, w0: float | None) -> dict[str, Any]:
        agent = {"kept": x, "by_region": [w0, 0.5, 1 / 3], "cos": 0.5}
        return {"merged": "ram", "agents": [agent] * 3, "outside": 0.0}

    seeds = [_seed(0, 0.5, 0.25), _seed(1, 0.5, 0.25), _seed(2, 0.5, 0.25)]
    seeds[0]["bench"]["kept"] = {"ram": kept(0.6, 1.0)}
    seeds[1]["bench"]["kept"] = {"ram": kept(0.8, None)}  # no unique element in this seed
    rows = kept_rows(seeds)  # seed 2 did not measure it
    tool = rows["ram"]["agents"]["tool"]
    assert rows["ram"]["seeds"] == 2 and tool["kept"] == pytest.approx(0.7)
    assert tool["by_region"][0] == pytest.approx(1.0) and tool["by_region"][2] == pytest.approx(1 / 3)
    for s in seeds:
        (tmp_path / f"seed{s['seed']}").mkdir()
        (tmp_path / f"seed{s['seed']}" / "result.json").write_text(json.dumps(s))
    text = write_results(tmp_path, [0, 1, 2], tmp_path / "docs", "cmd")[1].read_text()
    assert "| ram | 0.70 (1.00 / 0.50 / 0.33) |" in text
    assert "| 0 | tool | 50.0 | 20.0 / 30.0 / 50.0 | 25.0 / 50.0 / 25.0 | 4.00 | 1.250 | 0.52 / 0.60 |" in text


def test_two_seeds_give_the_prompts_share_of_the_difference_beside_the_seeds_se() -> None:
    seeds = [_seed(0, 0.5, 0.25), _seed(1, 0.75, 0.25)]
    seeds[1]["bench"]["reports"]["ram"]["code"]["values"] = [1.0, 0.0, 1.0, 1.0]  # mean stays 0.75
    d = paired(seeds, "ram", "ties")
    assert d is not None and d["over"] == 2
    assert d["mean"] == pytest.approx(0.375) and d["se"] == pytest.approx(0.125)
    code = [0.75, -0.25, 0.75, 0.75]  # seed 1's code differences; every other skill and seed has a constant one
    var = sum((x - 0.5) ** 2 for x in code) / 3
    assert d["prompt_se"] == pytest.approx(math.sqrt(var / 4) / 3 / 2)


def test_a_method_without_an_output_scale_stands_in_the_tuned_table_at_its_defaults(tmp_path: Path) -> None:
    seeds = [_seed(0, 0.5, 0.25), _seed(1, 0.75, 0.5)]
    for seed, level in zip(seeds, (0.5, 0.75), strict=True):
        seed["bench"]["reports"] |= {"cart": _flat(level + 0.125), "ram_ties": _flat(level + 0.0625)}
        seed["bench"]["methods"] += ["cart", "ram_ties"]
    agg = aggregate(seeds)
    assert agg["tables"]["tuned"]["cart"] == agg["tables"]["defaults"]["cart"]  # nothing to tune
    tuned = agg["differences"]["tuned"]
    assert tuned["best_baseline"] == "cart" and tuned["best"] == "cart"  # ties.tuned is 0.5 / 0.75 < cart
    assert tuned["tied"] == [] and agg["differences"]["defaults"]["tied"] == []
    assert tuned["ram_ties-ram"]["mean"] == pytest.approx(0.0625)
    assert tuned["ram_ties-cart"]["mean"] == pytest.approx(-0.0625) and "ram_fisher-cart" not in tuned
    for s in (0, 1):
        (tmp_path / f"seed{s}").mkdir()
        (tmp_path / f"seed{s}" / "result.json").write_text(json.dumps(seeds[s]))
    text = write_results(tmp_path, [0, 1], tmp_path / "docs", "cmd")[1].read_text()
    assert "no output scale: its defaults |" in text and "| cart.tuned |" not in text


def test_a_tie_for_the_best_method_is_named() -> None:
    seeds = [_seed(0, 0.5, 0.25), _seed(1, 0.75, 0.5)]
    for seed, level in zip(seeds, (0.5, 0.75), strict=True):
        seed["bench"]["reports"] |= {"cart": _flat(level), "karcher": _flat(level)}
        seed["bench"]["methods"] += ["cart", "karcher"]
    diffs = aggregate(seeds)["differences"]["defaults"]
    assert diffs["best"] == "ram" and diffs["tied"] == ["cart", "karcher"]
    assert diffs["best_baseline"] == "karcher"  # the last name among the tied baselines
    assert "- defaults: best method ram (tied with cart, karcher), best baseline (not RAM) karcher" in differences(
        aggregate(seeds)
    )
