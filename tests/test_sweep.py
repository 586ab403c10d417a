"""``agentmerge sweep``: trials from the file, a real local Ray runtime, resume after a kill, results you can read."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from agentmerge.cli import main
from agentmerge.errors import ConfigError
from agentmerge.sweep.run import Results, run_sweep
from agentmerge.sweep.sweepfile import choose, load_sweep, sweep_from_dict, trials

ray = pytest.importorskip("ray")

EVALUATOR = """
import json, time
from pathlib import Path
from safetensors.torch import load_file

HERE = Path(__file__).parent  # Ray workers keep the environment they started with: settings come as files


def score(folder):
    with open(HERE / "calls.log", "a") as f:
        f.write(json.dumps(str(folder)) + "\\n")
    pause = HERE / "sleep.txt"
    time.sleep(float(pause.read_text()) if pause.exists() else 0.0)
    merged = json.loads((Path(folder) / "merge.json").read_text())
    if merged["config"]["params"].get("scale") == 3.0:
        raise RuntimeError("lambda 3 is not allowed here\\nsecond line")
    w = load_file(str(Path(folder) / "model.safetensors"))["model.embed_tokens.weight"].float()
    return {"score": float(w.abs().mean()) * 100, "spread": float(w.std())}
"""


@pytest.fixture(scope="module")
def ray_runtime() -> Iterator[None]:
    """One real local Ray runtime (2 CPUs) for the in-process sweeps of this module."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def write_sweep(tmp_path: Path, family: tuple[Path, list[Path]], **extra: object) -> Path:
    base, agents = family
    (tmp_path / "sweepeval.py").write_text(EVALUATOR)
    data = {
        "base": str(base),
        "models": [str(a) for a in agents],
        "methods": {"ram": {}, "ram_plus": {"r": [0.1, 0.5]}, "task_arithmetic": {"lambda": [0.5, 3.0]}},
        "evaluate": "python:sweepeval:score",
        "objective": "score",
        **extra,
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_issue_example_gives_six_trials(tmp_path: Path) -> None:
    data = {
        "base": "b",
        "models": ["a1", "a2", "a3"],
        "subsets": "all",
        "methods": {"ram": {}, "ram_plus": {"r": [0.05, 0.1, 0.2]}, "ties": {"density": [0.3, 0.6]}},
        "search": "grid",
        "seeds": [0],
        "evaluate": "zoo",
        "resources": {"cpus": 1, "gpus": 0},
        "keep": "best",
    }
    cfg = sweep_from_dict(data)
    made = trials(cfg, choose(cfg))
    assert len(made) == 6
    assert [t.setting.method for t in made] == ["ram", "ram_plus", "ram_plus", "ram_plus", "ties", "ties"]
    again = trials(sweep_from_dict(data), choose(sweep_from_dict(data)))
    assert [t.id for t in made] == [t.id for t in again]  # stable ids
    assert len({t.id for t in made}) == 6
    assert (
        len(
            trials(sweep_from_dict({**data, "subsets": "pairs"}), choose(sweep_from_dict({**data, "subsets": "pairs"})))
        )
        == 18
    )
    seeded = sweep_from_dict({**data, "seeds": [0, 1]})
    assert len(trials(seeded, choose(seeded))) == 12
    sampled = sweep_from_dict({**data, "search": {"kind": "random", "n_trials": 4, "seed": 3}})
    picks = choose(sampled)
    assert len(picks) == 4 and picks == choose(
        sweep_from_dict({**data, "search": {"kind": "random", "n_trials": 4, "seed": 3}})
    )
    explicit = sweep_from_dict({**data, "subsets": [[0, 2]]})
    assert {t.setting.models for t in trials(explicit, choose(explicit))} == {(0, 2)}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"methdos": {}}, "did you mean 'methods'"),
        ({"methods": {"ram_pluss": {}}}, "did you mean 'ram_plus'"),
        ({"methods": {"ram_plus": {"rr": [0.1]}}}, "did you mean 'r'"),
        ({"methods": {"ties": {"density": [2.0]}}}, "out of range"),
        ({"evaluate": "zooo"}, "is not one of"),
        ({"evaluate": "python:mod"}, "python:MODULE:FUNCTION"),
        ({"merge": {"seed": 3}}, "set by the sweep itself"),
        ({"subsets": [[0, 7]]}, "distinct model indexes"),
    ],
)
def test_bad_sweep_files_are_refused_clearly(tmp_path: Path, change: dict[str, object], message: str) -> None:
    data = {"base": "b", "models": ["a1", "a2"], "methods": {"ram": {}}, "evaluate": "zoo", **change}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=message):
        cfg = load_sweep(path)
        trials(cfg, choose(cfg))


def test_sweep_on_ray_records_keeps_the_best_and_resumes(
    ray_runtime: None, tiny_family: tuple[Path, list[Path]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "calls.log"
    path = write_sweep(tmp_path, tiny_family, seeds=[0, 1])
    out = tmp_path / "out"
    outcome = run_sweep(load_sweep(path), out, source=path, quiet=True)
    records = Results(out / "results.jsonl").records()
    assert outcome.ran == len(records) == 10  # (1 + 2 + 2) settings x 2 seeds
    ok = [r for r in records if r["status"] == "ok"]
    failed = [r for r in records if r["status"] == "failed"]
    assert len(ok) == 8 and len(failed) == 2  # lambda 3.0 raises: recorded, and the sweep went on
    assert failed[0]["error"] == "RuntimeError: lambda 3 is not allowed here"
    for r in records:
        assert {"trial", "method", "params", "models", "seed", "status", "metrics", "seconds"} <= set(r)
    kept = [p.name for p in (out / "trials").iterdir()]
    best = max(ok, key=lambda r: r["metrics"]["score"])
    assert kept == [best["trial"]] and outcome.best is not None and outcome.best["trial"] == best["trial"]
    page = (out / "results.md").read_text()
    assert "± " in page and "Failed trials" in page and "methods.png" in page
    assert (out / "methods.png").is_file()
    calls = len(log.read_text().splitlines())
    again = run_sweep(load_sweep(path), out, source=path, quiet=True)  # a rerun: nothing to do
    assert again.ran == 0 and again.skipped == 10
    assert len(Results(out / "results.jsonl").records()) == 10
    assert len(log.read_text().splitlines()) == calls  # no trial evaluated again


def test_optuna_search_runs_its_trials_and_resumes(
    ray_runtime: None, tiny_family: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    pytest.importorskip("optuna")
    path = write_sweep(tmp_path, tiny_family, search={"kind": "optuna", "n_trials": 3, "seed": 0}, keep="none")
    out = tmp_path / "out"
    first = run_sweep(load_sweep(path), out, source=path, quiet=True)
    assert 1 <= first.ran <= 3
    assert not (out / "trials").exists() or not any((out / "trials").iterdir())  # keep: none
    again = run_sweep(load_sweep(path), out, source=path, quiet=True)
    assert again.ran == 0


def test_sweep_without_ray_says_how_to_install_it(
    tiny_family: tuple[Path, list[Path]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = write_sweep(tmp_path, tiny_family)
    monkeypatch.setitem(sys.modules, "ray", None)
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    assert "pip install 'agentmerge[sweep]'" in capsys.readouterr().err


def test_killed_sweep_loses_only_running_trials(tiny_family: tuple[Path, list[Path]], tmp_path: Path) -> None:
    """SIGKILL mid-sweep, then a rerun: every trial recorded exactly once, none evaluated twice."""
    path = write_sweep(tmp_path, tiny_family, methods={"task_arithmetic": {"lambda": [0.2, 0.4, 0.6, 0.8, 1.0, 1.2]}})
    out = tmp_path / "out"
    log = tmp_path / "calls.log"
    (tmp_path / "sleep.txt").write_text("1.5")
    import agentmerge  # the subprocess runs from tmp_path: it must import this package, not an installed one

    src = str(Path(agentmerge.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    cmd = [
        sys.executable,
        "-m",
        "agentmerge",
        "sweep",
        str(path),
        "--out",
        str(out),
        "--quiet",
        "--max-concurrent",
        "1",
    ]
    proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, start_new_session=True, stderr=subprocess.PIPE)
    deadline = time.time() + 180
    while time.time() < deadline and len(Results(out / "results.jsonl").records()) < 2:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = Results(out / "results.jsonl").records()
    assert 2 <= len(before) < 6, "the sweep finished before it could be killed; lengthen its sleep.txt"
    (tmp_path / "sleep.txt").write_text("0")
    done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    after = Results(out / "results.jsonl").records()
    ids = [r["trial"] for r in after]
    assert len(ids) == len(set(ids)) == 6
    assert after[: len(before)] == before  # recorded results untouched
    evaluated = [json.loads(line) for line in log.read_text().splitlines()]
    recorded_folders = {str(out / "trials" / r["trial"]) for r in before}
    second_run = evaluated[len(evaluated) - (6 - len(before)) :]
    assert not recorded_folders & set(second_run)  # nothing recorded was evaluated again
    assert "best:" in done.stderr


def test_first_line_of_a_config_error_in_a_trial(tmp_path: Path) -> None:
    """A trial whose merge fails (missing model folder) is a failed record with the error's first line."""
    from agentmerge.sweep.run import run_trial
    from agentmerge.sweep.sweepfile import trial_of

    data = {
        "base": str(tmp_path / "nope"),
        "models": [str(tmp_path / "nope2")],
        "methods": {"ram": {}},
        "evaluate": "zoo",
    }
    cfg = sweep_from_dict(data)
    trial = trial_of(cfg, choose(cfg)[0], 0)
    record = run_trial(cfg.model_dump(mode="json"), trial, str(tmp_path / "t"), [])
    assert record["status"] == "failed" and "nope" in record["error"] and "\n" not in record["error"]
    assert not (tmp_path / "t").exists()


def test_evaluator_results_are_checked() -> None:
    from agentmerge.evaluation.evaluator import checked_metrics as checked

    assert checked({"a": 1, "b": 0.5}, "f") == {"a": 1.0, "b": 0.5}
    for bad in ({}, [1], {"a": float("nan")}, {"a": "x"}, {"a": True}):
        with pytest.raises(ConfigError):
            checked(bad, "f")


def test_sweep_text_mentions_every_file_key() -> None:
    """The module docstring's example is a valid sweep file (the documentation cannot drift)."""
    import agentmerge.sweep.sweepfile as spec

    doc = spec.__doc__ or ""
    example = yaml.safe_load(textwrap.dedent(doc.split("```yaml")[1].split("```")[0]))
    cfg = sweep_from_dict(example)
    assert len(trials(cfg, choose(cfg))) == 6


def test_ram_plus_trials_find_their_statistics_counted(
    tiny_family: tuple[Path, list[Path]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before a sweep starts, each input set of its RAM+ trials is counted once; the trials then count nothing."""
    import shutil

    from agentmerge.engine import counting
    from agentmerge.engine.merge import merge
    from agentmerge.sweep.run import _count_overlaps_once
    from agentmerge.sweep.sweepfile import merge_config

    shutil.copytree(tiny_family[0].parent, tmp_path / "fam")  # files of this test's own
    family = (tmp_path / "fam" / "base", [tmp_path / "fam" / a.name for a in tiny_family[1]])
    cfg = load_sweep(write_sweep(tmp_path, family, subsets="pairs"))
    seen: list[str] = []
    task = counting._hist_task
    monkeypatch.setattr(counting, "_hist_task", lambda inputs, name, *a: seen.append(name) or task(inputs, name, *a))
    _count_overlaps_once(cfg, set(), quiet=True)
    counted = len(seen)
    assert counted > 0
    for trial in trials(cfg, choose(cfg)):
        if trial.setting.method == "ram_plus":
            merge(merge_config(cfg, trial), tmp_path / "m" / trial.id, quiet=True)
    assert len(seen) == counted  # three pairs, two values of r: no trial counted again


def test_adaptive_rule_trials_find_their_thresholds_computed(
    tiny_family: tuple[Path, list[Path]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RAM trials with an adaptive mask rule: each input set and rule's thresholds computed once, before the trials."""
    import shutil

    from agentmerge.engine import counting
    from agentmerge.engine.merge import merge
    from agentmerge.sweep.run import _count_overlaps_once
    from agentmerge.sweep.sweepfile import merge_config

    monkeypatch.setenv("AGENTMERGE_CACHE", str(tmp_path / "cache"))
    shutil.copytree(tiny_family[0].parent, tmp_path / "fam")
    family = (tmp_path / "fam" / "base", [tmp_path / "fam" / a.name for a in tiny_family[1]])
    methods = {"ram": {"epsilon_rule": ["percentile", "valley"]}, "task_arithmetic": {"lambda": [0.5]}}
    cfg = load_sweep(write_sweep(tmp_path, family, methods=methods, seeds=[0, 1]))
    computed: list[str] = []
    counted: list[str] = []
    levels, task = counting.tensor_levels, counting._hist_task
    monkeypatch.setattr(
        counting, "tensor_levels", lambda rule, name, *a: computed.append(name) or levels(rule, name, *a)
    )
    monkeypatch.setattr(counting, "_hist_task", lambda inputs, name, *a: counted.append(name) or task(inputs, name, *a))
    _count_overlaps_once(cfg, set(), quiet=True)
    tensors = len(set(computed))
    assert tensors > 0
    assert len(computed) == 3 * tensors  # valley with two seeds, percentile once (it reads no seed: cached)
    assert counted == []  # RAM needs no overlap histograms
    for trial in trials(cfg, choose(cfg)):
        merge(merge_config(cfg, trial), tmp_path / "m" / trial.id, quiet=True)
    assert len(computed) == 3 * tensors  # no trial computed them again


def _old_trial_id(cfg_data: dict[str, object], models: list[str], method: str, params: dict[str, object]) -> str:
    """The trial id as the first release computed it (the reference the ids of older sweep files must keep)."""
    import hashlib

    identity = {
        "base": cfg_data["base"],
        "models": models,
        "method": method,
        "params": params,
        "seed": 0,
        "evaluate": cfg_data["evaluate"],
        "merge": {},
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def test_explicit_trials_are_named_merges_with_their_own_inputs() -> None:
    from agentmerge.sweep.sweepfile import merge_config

    data: dict[str, object] = {
        "base": "b",
        "models": ["a1", "a2", "a3"],
        "methods": {"ties": {"density": [0.3]}},
        "evaluate": "zoo:test",
        "evaluate_options": {"n": 24, "cache": "/somewhere"},
        "trials": [
            {"name": "code+tool.ram", "method": "ram", "models": [0, 1], "evaluate_options": {"tasks": ["code"]}},
            {"name": "fisher", "method": "fisher", "fisher": ["f1", "f2", "f3"]},
            {"name": "ram_plus_r0.1_a2", "method": "ram_plus", "params": {"r": 0.1, "alpha": 2.0}},
        ],
    }
    cfg = sweep_from_dict(data)
    made = trials(cfg, choose(cfg))
    assert [t.setting.label for t in made] == ["ties(density=0.3)", "code+tool.ram", "fisher", "ram_plus_r0.1_a2"]
    assert made[1].setting.models == (0, 1) and made[2].setting.models == (0, 1, 2)
    assert cfg.options_of(made[1].setting) == {"n": 24, "cache": "/somewhere", "tasks": ["code"]}
    assert [m.fisher for m in merge_config(cfg, made[2]).models] == ["f1", "f2", "f3"]
    assert [m.fisher for m in merge_config(cfg, made[1]).models] == [None, None]
    assert merge_config(cfg, made[3]).params == {"r": 0.1, "clip": 2.0}
    # where the evaluation cache lies decides no result; the fingerprint (e.g. the inputs' digest) does
    moved = sweep_from_dict({**data, "evaluate_options": {"n": 24, "cache": "/elsewhere"}})
    assert [t.id for t in trials(moved, choose(moved))] == [t.id for t in made]
    stamped = sweep_from_dict({**data, "fingerprint": "abc"})
    assert not {t.id for t in trials(stamped, choose(stamped))} & {t.id for t in made}


def test_older_sweep_files_keep_their_trial_ids() -> None:
    data: dict[str, object] = {"base": "b", "models": ["a1", "a2"], "methods": {"ram": {}}, "evaluate": "zoo"}
    cfg = sweep_from_dict(data)
    (trial,) = trials(cfg, choose(cfg))
    assert trial.id == _old_trial_id(data, ["a1", "a2"], "ram", {})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"methods": {}}, "name the merges to try"),
        ({"trials": [{"name": "x", "method": "ram"}, {"name": "x", "method": "ram"}]}, "used twice"),
        ({"trials": [{"name": "../x", "method": "ram"}]}, "names the trial's folder"),
        ({"trials": [{"name": "x", "method": "rma"}]}, "did you mean 'ram'"),
        ({"trials": [{"name": "x", "method": "ram", "models": [0, 5]}]}, "distinct model indexes"),
        ({"trials": [{"name": "x", "method": "fisher", "fisher": ["f"]}]}, "one fisher file per merged model"),
        ({"trials": [{"name": "x", "method": "ram"}], "search": {"kind": "optuna"}}, "optuna chooses"),
        ({"evaluate_options": {"nn": 3}}, "did you mean 'n'"),
        ({"evaluate_options": {"n": 0}}, "n must be a positive integer"),
        ({"evaluate": "python:m:f", "evaluate_options": {"n": 3}}, "takes none"),
    ],
)
def test_bad_explicit_trials_are_refused_clearly(change: dict[str, object], message: str) -> None:
    data = {"base": "b", "models": ["a1", "a2"], "methods": {"ram": {}}, "evaluate": "zoo", **change}
    with pytest.raises(ConfigError, match=message):
        sweep_from_dict(data)


def test_named_trials_keep_their_folders_and_a_rerun_never_starts_ray(
    ray_runtime: None, tiny_family: tuple[Path, list[Path]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentmerge.sweep.run import RaySession

    entries = [
        {"name": "pair.ta", "method": "task_arithmetic", "params": {"lambda": 0.5}, "models": [0, 1]},
        {"name": "all.ram", "method": "ram"},
    ]
    path = write_sweep(tmp_path, tiny_family, methods={}, trials=entries, keep="all")
    out = tmp_path / "out"
    first = run_sweep(load_sweep(path), out, source=path, quiet=True)
    assert first.ran == 2 and {r["name"] for r in first.finished} == {"pair.ta", "all.ram"}
    assert sorted(p.name for p in (out / "trials").iterdir()) == ["all.ram", "pair.ta"]
    merged = json.loads((out / "trials" / "pair.ta" / "merge.json").read_text())
    assert len(merged["config"]["models"]) == 2
    assert "`pair.ta`" in (out / "results.md").read_text()

    def refuse(self: RaySession) -> None:
        raise AssertionError("Ray started with nothing to run")

    monkeypatch.setattr(RaySession, "start", refuse)
    again = run_sweep(load_sweep(path), out, source=path, quiet=True)
    assert again.ran == 0 and again.skipped == 2 and again.finished == []


def test_what_a_trial_needs_on_each_node(tmp_path: Path) -> None:
    """The inputs checked on every node: local paths (adapters split off), Fisher files, the evaluator's file;
    not hub ids, which each node fetches itself."""
    from agentmerge.sweep.cluster import Need, needs

    for name in ("base", "m1", "adapter", "f1", "f2"):
        (tmp_path / name).mkdir()
    (tmp_path / "tasks.jsonl").write_text("")
    data = {
        "base": str(tmp_path / "base"),
        "models": [str(tmp_path / "m1"), "some-org/some-model", f"{tmp_path / 'm1'}+{tmp_path / 'adapter'}"],
        "methods": {},
        "trials": [{"name": "f", "method": "fisher", "models": [0, 1], "fisher": [str(tmp_path / "f1"), "f2"]}],
        "evaluate": "tasks:tasks.jsonl",
    }
    found = needs(sweep_from_dict(data), [str(tmp_path)])
    assert found == [
        Need("base", str(tmp_path / "base")),
        Need("model", str(tmp_path / "m1")),
        Need("model", str(tmp_path / "adapter")),
        Need("fisher file", str(tmp_path / "f1")),
        Need("fisher file", "f2"),
        Need("task file", str(tmp_path / "tasks.jsonl")),
    ]
    (tmp_path / "myeval.py").write_text("def f(p):\n    return {'a': 1}\n")
    python = sweep_from_dict({**data, "trials": [], "methods": {"ram": {}}, "evaluate": "python:myeval:f"})
    assert needs(python, [str(tmp_path)])[-1] == Need("evaluator module", str(tmp_path / "myeval.py"))
    installed = sweep_from_dict({**data, "trials": [], "methods": {"ram": {}}, "evaluate": "python:json:dumps"})
    assert needs(installed, [str(tmp_path)])[-1] == Need("evaluator module", "json", "module")


def test_a_node_check_names_what_it_cannot_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``check_here`` (what runs on each node): every file of a folder opened, ``~`` read in this home, a module
    importable, the trial folder writable, OUT shared when the driver's marker reads back."""
    from agentmerge.sweep.cluster import MARKER, Need, check_here

    model = tmp_path / "home" / "model"
    model.mkdir(parents=True)
    (model / "model.safetensors").write_bytes(b"x")
    (model / "broken.safetensors").symlink_to(tmp_path / "gone")  # a file there that cannot be opened
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    out = tmp_path / "out"
    out.mkdir()
    (out / MARKER).write_text("abc")
    wanted = [
        Need("model", "~/model"),
        Need("base", str(tmp_path / "nope")),
        Need("evaluator module", "nosuchmod", "module"),
    ]
    answer = check_here(wanted, str(out), "abc")
    assert answer["shared"] is True and (out / "trials").is_dir() and not list((out / "trials").iterdir())
    assert answer["problems"] == [
        ("model", "~/model", f"{model / 'broken.safetensors'}: no such file or folder"),
        ("base", str(tmp_path / "nope"), "no such file or folder"),
        ("evaluator module", "nosuchmod", "not importable here"),
    ]
    (model / "broken.safetensors").unlink()
    (tmp_path / "file").write_text("")
    answer = check_here(
        [Need("model", "~/model"), Need("evaluator module", "json", "module")], str(tmp_path / "file"), "x"
    )
    assert answer["shared"] is False
    assert [p[0] for p in answer["problems"]] == ["output folder"]  # OUT is a file here: no trial folder in it


def test_output_scale_tunes_every_method_that_has_one_alike() -> None:
    """The fair protocol: one shared grid on each method's own output scale, a method's own grid wins."""
    from agentmerge.sweep.sweepfile import grid_size

    data = {
        "base": "b",
        "models": ["a1", "a2"],
        "methods": {"ram": {}, "ties": {"density": [0.3, 0.6]}, "linear": {}, "task_arithmetic": {"lambda": 0.4}},
        "output_scale": [0.5, 1, 1.5],
        "evaluate": "zoo",
    }
    cfg = sweep_from_dict(data)
    settings = choose(cfg)
    assert len(settings) == grid_size(cfg) == 3 + 2 * 3 + 1 + 1
    assert [dict(s.params)["scale"] for s in settings if s.method == "ram"] == [0.5, 1, 1.5]
    assert {(dict(s.params)["density"], dict(s.params)["scale"]) for s in settings if s.method == "ties"} == {
        (d, lam) for d in (0.3, 0.6) for lam in (0.5, 1, 1.5)
    }
    assert [s.params for s in settings if s.method == "linear"] == [()]  # no output scale: as given
    assert [s.params for s in settings if s.method == "task_arithmetic"] == [
        (("scale", 0.4),)
    ]  # its own value, given as lambda
    plain = sweep_from_dict({k: v for k, v in data.items() if k != "output_scale"})
    assert [t.id for t in trials(plain, choose(plain)) if t.setting.method == "linear"] == [
        t.id for t in trials(cfg, settings) if t.setting.method == "linear"
    ]  # the key does not change the ids of settings it does not touch
    with pytest.raises(ConfigError, match="output_scale"):
        sweep_from_dict({**data, "output_scale": []})


def test_report_shows_defaults_and_tuned_and_points_to_the_convergence_check() -> None:
    from agentmerge.sweep.sweep_report import extrapolation_note, markdown

    cfg = sweep_from_dict(
        {
            "base": "b",
            "models": ["a1"],
            "methods": {"ram": {}, "task_arithmetic": {}},
            "output_scale": [1, 2],
            "evaluate": "zoo",
        }
    )
    scores = {("ram", 1): 0.50, ("ram", 2): 0.40, ("task_arithmetic", 1): 0.45, ("task_arithmetic", 2): 0.60}
    param = {"ram": "scale", "task_arithmetic": "lambda"}
    records = [
        {"status": "ok", "method": m, "params": {param[m]: v}, "models": ["a1"], "seed": 0, "trial": f"{m}{v}",
         "metrics": {"agentic_avg": s}}
        for (m, v), s in scores.items()
    ]  # fmt: skip
    page = markdown(cfg, records)
    assert "## Defaults and tuned" in page
    assert "| ram | a1 | 0.5 | 0.5 | `ram(scale=1)` |" in page
    assert "| task_arithmetic | a1 | 0.45 | 0.6 | `task_arithmetic(lambda=2)` |" in page
    assert "agentmerge converge" in page  # the winner has lambda 2 > 1
    assert extrapolation_note("task_arithmetic", {"lambda": 1.0}) is None
    assert extrapolation_note("linear", {}) is None
    assert "scale = 1.5" in (extrapolation_note("ram", {"scale": 1.5}) or "")


def test_kept_adds_each_models_share_to_the_record_and_the_page(
    tiny_family: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    """``kept: true``: a trial's record carries what its merge kept of each merged model (as ``retention``
    measures it), the record reads back, the page shows it; without a base it is refused."""
    from agentmerge.engine.retention import retention
    from agentmerge.sweep.results import check_record
    from agentmerge.sweep.run import run_trial
    from agentmerge.sweep.sweep_report import markdown
    from agentmerge.sweep.sweepfile import trial_of

    base, agents = tiny_family
    path = write_sweep(tmp_path, (base, agents), methods={"ties": {}}, subsets=[[0, 2]], kept=True)
    cfg = load_sweep(path)
    trial = trial_of(cfg, choose(cfg)[0], 0)
    record = run_trial(cfg.model_dump(mode="json"), trial, str(tmp_path / "trials" / "t"), [str(tmp_path)])
    assert record["status"] == "ok", record.get("error")
    (want,) = retention(str(base), [str(agents[0]), str(agents[2])], [str(tmp_path / "trials" / "t")], quiet=True)
    assert record["kept"] == pytest.approx([a.kept for a in want.agents]) and len(record["kept"]) == 2
    check_record("results.jsonl:1", json.loads(json.dumps(record)))
    with pytest.raises(ConfigError, match="kept"):
        check_record("results.jsonl:1", {**record, "kept": ["x"]})
    page = markdown(cfg, [record])
    assert "kept of each model's update" in page and f"{record['kept'][0]:.2f} / {record['kept'][1]:.2f}" in page
    with pytest.raises(ConfigError, match="kept: true measures each merge against the base"):
        sweep_from_dict({"models": ["a1", "a2"], "methods": {"linear": {}}, "evaluate": "zoo", "kept": True})


@pytest.mark.parametrize(
    ("resources", "says"), [({"cpus": 3}, "3 CPUs and 0 GPUs"), ({"gpus": 64}, "1 CPUs and 64 GPUs")]
)
def test_a_request_no_node_can_hold_is_refused_before_any_trial(
    ray_runtime: None, tiny_family: tuple[Path, list[Path]], tmp_path: Path, resources: dict[str, int], says: str
) -> None:
    """Ray would keep such a trial pending forever (issue 42): the runtime here has 2 CPUs and no 64 GPUs."""
    path = write_sweep(tmp_path, tiny_family, methods={"task_arithmetic": {"lambda": [0.5]}}, resources=resources)
    with pytest.raises(ConfigError, match=f"a trial asks for {says}, but no node of the Ray runtime") as caught:
        run_sweep(load_sweep(path), tmp_path / "out", source=path, quiet=True)
    assert "the largest: 2 CPUs" in str(caught.value)
    assert not (tmp_path / "out" / "results.jsonl").exists()
