"""The real zoo end to end on a tiny random Llama (`agentmerge zoo real run --smoke`): tasks -> GRPO -> export ->
convergence check -> probe -> every planned merge through the sweep engine -> evaluation -> results; a rerun does
nothing. Checks the paths run, not who wins."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open

from agentmerge.cli import build_parser
from agentmerge_zoo.real import suite
from agentmerge_zoo.real.config import smoke_config
from agentmerge_zoo.real.tasks import Example, strict_partial

torch.set_num_threads(1)


class _VowelReward:
    """Wraps a skill: same prompts, a training reward that varies between random samples (so agents move)."""

    def __init__(self, skill: Any) -> None:
        self.skill = skill
        self.name, self.max_new_tokens = skill.name, skill.max_new_tokens

    def sample(self, rng: Any) -> Example:
        return self.skill.sample(rng)  # type: ignore[no-any-return]

    def score(self, example: Example, completion: str) -> dict[str, float]:
        share = sum(c in "aeiou" for c in completion) / max(1, len(completion))
        return strict_partial(share > 0.3, share)


def _run(*argv: str) -> int:
    args = build_parser().parse_args(list(argv))
    return int(args.func(args))


def _argv(work: Path) -> list[str]:
    return [
        "zoo",
        "real",
        "run",
        "--smoke",
        "--work",
        str(work),
        "--docs",
        str(work / "docs"),
        "--threads",
        "1",
        "--concurrent",
        "2",
    ]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("real")
    with pytest.MonkeyPatch.context() as mp:
        for name in suite.TRAINED:  # the training reward only: evaluation (in the sweep's workers) is the real one
            mp.setitem(suite.SKILLS, name, _VowelReward(suite.SKILLS[name]))
        assert _run(*_argv(work), "--quiet") == 0
    return work


def test_agents_moved_and_were_exported_in_bf16(smoke: Path) -> None:
    with safe_open(str(smoke / "base" / "model.safetensors"), "pt") as f:
        base = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    for name in suite.TRAINED:
        folder = smoke / "seed0" / f"agent_{name}"
        meta = json.loads((folder / "agent.json").read_text())
        assert len(meta["curve"]) == 2 and meta["recipe"]["skill"] == name
        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            weights = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
        assert all(t.dtype == torch.bfloat16 for t in weights.values())
        assert any(not torch.equal(weights[k], base[k]) for k in base), name
        for file in ("tokenizer.json", "tokenizer_config.json", "config.json"):
            assert (folder / file).is_file()
    assert json.loads((smoke / "seed0" / "agent_code" / "agent.json").read_text())["recipe"]["storage"] == "bf16"


def test_worker_trained_agents_equal_an_agent_trained_in_this_process(
    smoke: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run trains its agents two at a time in spawned workers (``--concurrent 2``); the same recipe and seed
    trained here, in the test's process, must give the same bits (and the workers saw the test's reward)."""
    from agentmerge_zoo.real.train import train_agent

    monkeypatch.setitem(suite.SKILLS, "memory", _VowelReward(suite.SKILLS["memory"]))
    cfg = smoke_config()
    here = tmp_path / "agent_memory"
    train_agent(smoke / "base", here, cfg.recipe("memory"), 0, cfg.checkpoint_every)
    there = smoke / "seed0" / "agent_memory"
    assert (here / "model.safetensors").read_bytes() == (there / "model.safetensors").read_bytes()
    curves = [json.loads((p / "agent.json").read_text())["curve"] for p in (here, there)]
    assert [r["reward"] for r in curves[0]] == [r["reward"] for r in curves[1]]


def test_results_hold_every_table(smoke: Path) -> None:
    data = json.loads((smoke / "docs" / "results.json").read_text())
    agg, plan = data["aggregate"], smoke_config().bench
    assert sorted(agg["tables"]["defaults"]) == sorted(plan.methods)
    assert {"ram", "ram_plus", "task_arithmetic", "ties"} <= set(agg["tables"]["tuned"])
    assert len(agg["pairs"]) == 3 * len(plan.pair_methods)
    assert len(agg["dilution"]) == 2 * len(suite.TRAINED)
    seed = data["seeds"][0]
    check = seed["check"]
    assert set(check["convergence"]) == set(suite.TRAINED)
    assert set(check["convergence"]["tool"]["scores"]) == {"0.5", "1", "1.5", "2"}
    assert all(0.0 < check["probe"][s]["density"] <= 1.0 and check["probe"][s]["drift"] > 0 for s in suite.TRAINED)
    assert seed["bench"]["failed"] == {}
    text = (smoke / "docs" / "results.md").read_text()
    for heading in ("## Agents", "## Defaults", "## Tuned", "## Paired differences", "## Pairs", "## Dilution"):
        assert heading in text
    assert "--smoke" in data["command"] and "--concurrent 2" in data["command"]


def test_kept_measures_the_test_trials_own_merges(smoke: Path, tmp_path: Path) -> None:
    """Every default merge's weight-space "kept" is in the results; RAM keeps unique updates whole; the merge
    measured is the very one the test scored (its digest keys an evaluation in the cache)."""
    from agentmerge_zoo.evaluate import cache_key, file_digest
    from agentmerge_zoo.real.bench_seed import ALL_SKILLS
    from agentmerge_zoo.real.kept import merge_again
    from agentmerge_zoo.real.run import seed_inputs
    from agentmerge_zoo.real.tasks import SKILLS_VERSION

    cfg = smoke_config()
    seed = json.loads((smoke / "docs" / "results.json").read_text())["seeds"][0]
    assert sorted(seed["bench"]["kept"]) == sorted(cfg.bench.methods)
    for agent in seed["bench"]["kept"]["ram"]["agents"]:
        if agent["by_region"][0] is not None:
            assert agent["by_region"][0] == pytest.approx(1.0, abs=1e-4)
    assert any(a["by_region"][0] is not None for a in seed["bench"]["kept"]["ram"]["agents"])
    assert "## What each default merge kept" in (smoke / "docs" / "results.md").read_text()
    inputs = seed_inputs(cfg, smoke / "base", smoke, 0, smoke / "evals")
    merged = merge_again(inputs, "ties", tmp_path / "ties", threads=1)
    key = cache_key(file_digest(merged), "test", cfg.bench.n_test, sorted(ALL_SKILLS), SKILLS_VERSION)
    assert (smoke / "evals" / f"{key}.json").is_file()


def test_a_rerun_does_nothing(smoke: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agentmerge.sweep.run import RaySession
    from agentmerge_zoo.real import evaluate, train

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the rerun did work that was done already")

    monkeypatch.setattr(RaySession, "start", refuse)
    monkeypatch.setattr(evaluate, "evaluate", refuse)
    monkeypatch.setattr(train, "grpo_step", refuse)
    before = (smoke / "docs" / "results.json").read_text()
    assert _run(*_argv(smoke), "--quiet") == 0
    assert (smoke / "docs" / "results.json").read_text() == before


def test_method_lists_name_registry_methods(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from agentmerge.cli import main
    from agentmerge.errors import ConfigError
    from agentmerge_zoo.real.cli import method_list

    assert method_list("ram, task_arithmetic,", "--methods") == ("ram", "task_arithmetic")
    with pytest.raises(ConfigError, match=r"--pair-methods: unknown merge method 'ram_pluss'.*ram_plus"):
        method_list("ram,ram_pluss", "--pair-methods")
    with pytest.raises(ConfigError, match="no method named"):
        method_list(" , ", "--methods")
    assert main([*_argv(tmp_path), "--methods", "tsvm", "--quiet"]) == 2  # before anything is built
    assert main([*_argv(tmp_path), "--concurrent", "0", "--quiet"]) == 2
    assert "unknown merge method 'tsvm'" in capsys.readouterr().err
    assert not (tmp_path / "base").exists()
