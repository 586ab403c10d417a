"""``agentmerge search``: a space checked before Ray, per-group weights in the merge, a known optimum found on
validation, resume after SIGKILL, the best point's YAML reproduced byte for byte, test scored once at the end."""

from __future__ import annotations

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
import yaml
from safetensors.torch import load_file

from agentmerge.config.schema import config_from_dict
from agentmerge.engine.merge import merge
from agentmerge.errors import ConfigError
from agentmerge.sweep.run import Results
from agentmerge.sweep.space import Space, groups_of
from agentmerge.sweep.sweepfile import sweep_from_dict

ray = pytest.importorskip("ray")

TARGET = {"layers0-0": [1.5, 0.5], "layers1-1": [0.5, 1.5]}  # the fitness peaks at these weights per agent

KNOWN_OPTIMUM = """
import json, time
from pathlib import Path
from safetensors.torch import load_file

HERE = Path(__file__).parent  # settings come as files: Ray workers keep the environment they started with


def fitness(folder, split="val"):
    with open(HERE / "calls.log", "a") as f:
        f.write(json.dumps([split, str(folder)]) + "\\n")
    pause = HERE / "sleep.txt"
    time.sleep(float(pause.read_text()) if pause.exists() and split == "val" else 0.0)
    family = json.loads((HERE / "family.json").read_text())
    base = load_file(family["base"] + "/model.safetensors")
    agents = [load_file(a + "/model.safetensors") for a in family["agents"]]
    merged = load_file(str(Path(folder) / "model.safetensors"))
    err = total = 0.0
    for name, b in base.items():
        layer = next((i for i in (0, 1) if f".layers.{i}." in name and "norm" not in name), None)
        if layer is None:
            continue
        taus = [a[name].double() - b.double() for a in agents]
        target = b.double() + sum(w * t for w, t in zip(family["target"][f"layers{layer}-{layer}"], taus))
        err += float(((merged[name].double() - target) ** 2).sum())
        total += float(sum((t ** 2).sum() for t in taus))
    return {"fit": -err / total}


def test_fitness(folder):
    return fitness(folder, "test")
"""


def search_data(family: tuple[Path, list[Path]], **extra: Any) -> dict[str, Any]:
    base, agents = family
    data: dict[str, Any] = {
        "base": str(base),
        "models": [str(agents[1]), str(agents[2])],  # the two dense agents: every weight is well identified
        "space": {
            "method": "task_arithmetic",
            "layers_per_group": 1,
            "groups": ["blocks"],
            "per_agent": {"weight": [0, 2]},
            "params": {"lambda": 1.0},
        },
        "search": {"kind": "cmaes", "n_trials": 60, "seed": 0},
        "evaluate": "python:knownopt:fitness",
        "test": "python:knownopt:test_fitness",
        "baseline": {"method": "task_arithmetic", "params": {"lambda": 1.0}},
        "objective": "fit",
        "merge": {"dtype": "float32"},
    }
    return data | extra


def _space(data: dict[str, Any], **change: Any) -> dict[str, Any]:
    return {**data, "space": {**data["space"], **change}}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: _space(d, params={"lamda": [0.5, 1.5]}), "has no parameter 'lamda' (did you mean 'lambda'?)"),
        (lambda d: _space(d, method="ties", per_group={"density": [0.1, 1.5]}), "leaves the allowed range"),
        (lambda d: _space(d, groups=["blocks", "head"]), "group 'head' holds no tensor of the base"),
        (lambda d: _space(d, per_agent={"weight": [1, 1]}), "is empty; give low < high"),
        (lambda d: _space(d, per_agent={"density": [0.1, 1]}), "cannot vary per agent"),
        (lambda d: _space(d, method="ram"), "does not use model weights"),
        (lambda d: {**d, "search": {"kind": "cmaes", "n_trials": 0}}, "greater than or equal to 1"),
        (lambda d: {**d, "search": {"kind": "cmaes", "n_trials": 10**9}}, "give the budget, 1 to 100000"),
        (lambda d: {**d, "evaluate": "python:knownopt:test_fitness"}, "name the test split in test: only"),
        (lambda d: {**d, "evaluate": "zoo:test", "test": None, "baseline": None}, "score validation there"),
        (lambda d: {**d, "search": {"kind": "grid"}}, "searched by cmaes, tpe or random"),
        (lambda d: {**d, "test_options": {"n": 5}}, "unknown option 'n' (the python evaluator takes none)"),
    ],
)
def test_bad_spaces_get_one_line_before_ray_starts(
    tiny_family: tuple[Path, list[Path]], change: Any, message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        sweep_from_dict(change(search_data(tiny_family)), "search.yaml")
    assert message in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith("search.yaml: ")
    assert not ray.is_initialized()


def test_groups_follow_the_override_order() -> None:
    names = ["model.embed_tokens.weight", "model.layers.0.mlp.w", "model.layers.0.input_layernorm.weight"]
    names += ["model.layers.1.mlp.w", "model.layers.2.mlp.w", "model.norm.weight", "lm_head.weight"]
    groups = groups_of(names, Space(method="task_arithmetic", layers_per_group=2))
    assert [g.name for g in groups] == ["embeddings", "layers0-1", "layers2-2", "norms", "head"]
    assert groups[1].patterns == ("*.layers.0.*", "*.layers.1.*")


def test_override_weights_reach_each_tensor(tiny_family: tuple[Path, list[Path]], tmp_path: Path) -> None:
    """``overrides[].weights``: task arithmetic on a layer's tensors with their own per-model weights."""
    base, agents = tiny_family
    data = {
        "method": "task_arithmetic",
        "base": str(base),
        "models": [{"path": str(agents[1]), "weight": 0.3}, {"path": str(agents[2]), "weight": 0.9}],
        "params": {"lambda": 0.5},
        "overrides": [{"pattern": "*.layers.1.*", "weights": [1.7, 0.2]}],
        "dtype": "float32",
    }
    merge(config_from_dict(data), tmp_path / "m", quiet=True)
    got = load_file(str(tmp_path / "m" / "model.safetensors"))
    b, a1, a2 = (load_file(str(p / "model.safetensors")) for p in (base, agents[1], agents[2]))
    for name in ("model.layers.1.mlp.up_proj.weight", "model.layers.0.mlp.up_proj.weight"):
        w = (1.7, 0.2) if ".layers.1." in name else (0.3, 0.9)
        want = b[name].float() + 0.5 * (
            w[0] * (a1[name].float() - b[name].float()) + w[1] * (a2[name].float() - b[name].float())
        )
        torch.testing.assert_close(got[name], want, rtol=1e-6, atol=1e-6)
    with pytest.raises(ConfigError, match=r"overrides\[0\].weights: give one weight per model \(2\), got 3"):
        config_from_dict({**data, "overrides": [{"pattern": "*", "weights": [1, 1, 1]}]})


def _cli(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "agentmerge", *args]


def _env() -> dict[str, str]:
    """The subprocess runs from the test's folder: it must import this package, not an installed one."""
    import agentmerge

    src = str(Path(agentmerge.__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}


def test_search_finds_a_known_optimum_resumes_after_a_kill_and_scores_test_once(
    tiny_family: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    """CMA-ES on per-agent x per-layer weights: SIGKILL mid-search, rerun; every trial recorded once, test scored
    only after the last trial (best and baseline, once), the best within 0.3 of the optimum, its YAML reproduced."""
    base, agents = tiny_family
    (tmp_path / "knownopt.py").write_text(KNOWN_OPTIMUM)
    (tmp_path / "family.json").write_text(
        json.dumps({"base": str(base), "agents": [str(agents[1]), str(agents[2])], "target": TARGET})
    )
    (tmp_path / "search.yaml").write_text(yaml.safe_dump(search_data(tiny_family)))
    (tmp_path / "sleep.txt").write_text("0.4")
    out, log = tmp_path / "out", tmp_path / "calls.log"
    cmd = _cli(["search", "search.yaml", "--out", str(out), "--quiet", "--max-concurrent", "2"])
    proc = subprocess.Popen(cmd, env=_env(), cwd=tmp_path, start_new_session=True, stderr=subprocess.PIPE)
    deadline = time.time() + 180
    while time.time() < deadline and len(Results(out / "results.jsonl").records()) < 8:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = Results(out / "results.jsonl").records()
    assert 8 <= len(before) < 60, "the search finished before it could be killed; lengthen its sleep.txt"
    assert all(split == "val" for split, _ in map(json.loads, log.read_text().splitlines()))
    (tmp_path / "sleep.txt").write_text("0")
    done = subprocess.run(cmd, env=_env(), cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    after = Results(out / "results.jsonl").records()
    assert len({r["trial"] for r in after}) == len(after) == 60 and after[: len(before)] == before
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    tests = [i for i, (split, _) in enumerate(calls) if split == "test"]
    assert [calls[i][1] for i in tests] == [str(out / "best"), str(out / "baseline")]
    assert tests[0] == len(calls) - 2  # test: after every validation call, once per checkpoint
    recorded = {str(out / "trials" / r["trial"]) for r in before}
    assert not recorded & {f for _, f in calls[len(calls) - 2 - (60 - len(before)) :]}  # none evaluated again
    summary = json.loads((out / "search.json").read_text())
    best = summary["best"]["point"]
    for group, weights in TARGET.items():
        for i, w in enumerate(weights):
            assert abs(best[f"weight.{i}.{group}"] - w) < 0.3, (group, i, best)
    assert summary["test"]["difference"]["value"] > 0  # the searched merge beats plain task arithmetic on test
    _reproduces(tmp_path, out)
    again = subprocess.run(cmd, env=_env(), cwd=tmp_path, capture_output=True, text=True)
    assert again.returncode == 0 and log.read_text().count('"test"') == 2  # test is not scored again
    report = (out / "results.md").read_text()
    assert "## Best point" in report and "| layers0-0 |" in report and "best - baseline" in report
    assert (out / "best-so-far.png").is_file() and (out / "weights.png").is_file()


def _reproduces(tmp_path: Path, out: Path) -> None:
    """``agentmerge merge best.yaml`` gives the best trial's weights byte for byte."""
    done = subprocess.run(
        _cli(["merge", str(out / "best.yaml"), "--out", str(tmp_path / "again"), "--quiet"]),
        env=_env(), cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    best_trial = json.loads((out / "search.json").read_text())["best"]["key"]
    again = (tmp_path / "again" / "model.safetensors").read_bytes()
    assert again == (out / "best" / "model.safetensors").read_bytes()
    assert again == (out / "trials" / best_trial / "model.safetensors").read_bytes()
    assert yaml.safe_load((out / "best.yaml").read_text())["overrides"][0]["pattern"] == "*.layers.0.*"


@pytest.mark.parametrize("kind", ["cmaes", "tpe", "random"])
def test_a_resumed_sampler_runs_the_rest_of_the_budget_with_new_points(
    tiny_family: tuple[Path, list[Path]], kind: str
) -> None:
    """Told the recorded points, a seeded sampler asks them again first: they are skipped, not counted."""
    from agentmerge.sweep.run import trial_record
    from agentmerge.sweep.tune import optuna_trials

    def run(cfg: Any, earlier: list[dict[str, Any]]) -> list[dict[str, Any]]:
        finished: list[dict[str, Any]] = []
        for t in optuna_trials(cfg, {r["trial"] for r in earlier}, earlier, finished):
            record = trial_record(cfg, t) | {"status": "ok"}
            record["metrics"] = {"fit": -sum(v for _, v in t.setting.point or ())}
            finished.append(record)
        return finished

    data = search_data(tiny_family, search={"kind": kind, "n_trials": 5, "seed": 1})
    first = run(sweep_from_dict(data), [])
    rest = run(sweep_from_dict({**data, "search": {"kind": kind, "n_trials": 8, "seed": 1}}), first)
    assert len(first) == 5 and len(rest) == 3
    assert len({r["trial"] for r in first + rest}) == 8
