"""The statistics pass counts a given set of files once: later RAM+ merges and probes reuse its histograms."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from agentmerge import MergeConfig, ModelSpec, merge, probe
from agentmerge.engine import counting
from agentmerge.io.cache.store import cache_dir, seal, unseal
from agentmerge.methods.masks import Levels
from agentmerge.methods.spec import MaskRule


@pytest.fixture
def family(tiny_family: tuple[Path, list[Path]], tmp_path: Path) -> tuple[Path, list[Path]]:
    """A private copy of the tiny family (its files' identities are this test's own)."""
    base, agents = tiny_family
    root = tmp_path / "fam"
    shutil.copytree(base.parent, root)
    return root / base.name, [root / a.name for a in agents]


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The tensors whose chunks the statistics pass really counts."""
    seen: list[str] = []
    task = counting._hist_task

    def spy(inputs: counting.Inputs, name: str, *args: object) -> object:
        seen.append(name)
        return task(inputs, name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(counting, "_hist_task", spy)
    return seen


def _config(family: tuple[Path, list[Path]], **params: object) -> MergeConfig:
    base, agents = family
    models = [ModelSpec(path=str(a)) for a in agents]
    return MergeConfig(method="ram_plus", base=str(base), models=models, params=params)  # type: ignore[arg-type]


def test_second_merge_reads_its_inputs_once(
    family: tuple[Path, list[Path]], tmp_path: Path, counted: list[str]
) -> None:
    merge(_config(family, r=0.1), tmp_path / "a", quiet=True)
    first = len(counted)
    assert first > 0
    merge(_config(family, r=0.3), tmp_path / "b", quiet=True)  # another r: the same histograms
    assert len(counted) == first  # nothing counted again
    merge(_config(family, r=0.1), tmp_path / "c", quiet=True)
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "c" / "model.safetensors").read_bytes()
    probe(str(family[0]), [str(a) for a in family[1]], quiet=True)  # the probe counts at the same threshold
    assert len(counted) == first


def test_another_threshold_or_a_changed_file_is_counted_again(
    family: tuple[Path, list[Path]], tmp_path: Path, counted: list[str]
) -> None:
    merge(_config(family), tmp_path / "a", quiet=True)
    first = len(counted)
    merge(_config(family, epsilon=1e-4), tmp_path / "b", quiet=True)
    assert len(counted) == 2 * first
    weights = family[1][0] / "model.safetensors"
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # same bytes, a new identity
    merge(_config(family), tmp_path / "c", quiet=True)
    assert len(counted) == 3 * first


def test_cache_can_be_off_or_broken(
    family: tuple[Path, list[Path]], tmp_path: Path, counted: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    merge(_config(family), tmp_path / "a", quiet=True)
    first = len(counted)
    for store in (cache_dir() / "stats").glob("*.json"):
        store.write_text("[not a store")
    merge(_config(family), tmp_path / "b", quiet=True)  # a broken store is ignored, then rewritten
    assert len(counted) == 2 * first
    monkeypatch.setenv("AGENTMERGE_NO_CACHE", "1")
    merge(_config(family), tmp_path / "c", quiet=True)
    assert len(counted) == 3 * first
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "c" / "model.safetensors").read_bytes()


# --------------------------------------------------------------------------- adaptive mask thresholds


@pytest.fixture
def computed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """The tensors whose adaptive thresholds are really computed (``masks.tensor_levels`` calls), own cache."""
    monkeypatch.setenv("AGENTMERGE_CACHE", str(tmp_path / "cache"))
    seen: list[str] = []
    levels = counting.tensor_levels

    def spy(rule: MaskRule, name: str, *args: object) -> Levels:
        seen.append(name)
        return levels(rule, name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(counting, "tensor_levels", spy)
    return seen


def _ram(family: tuple[Path, list[Path]], method: str = "ram", seed: int = 0, **params: object) -> MergeConfig:
    base, agents = family
    models = [ModelSpec(path=str(a)) for a in agents]
    return MergeConfig(method=method, base=str(base), models=models, params=params, seed=seed)  # type: ignore[arg-type]


def _thresholds(out: Path) -> object:
    return json.loads((out / "merge.json").read_text())["thresholds"]


def test_second_adaptive_merge_reads_its_thresholds(
    family: tuple[Path, list[Path]], tmp_path: Path, computed: list[str]
) -> None:
    rule = {"epsilon_rule": "percentile", "epsilon_q": 70.0}
    merge(_ram(family, **rule), tmp_path / "a", quiet=True)
    first = len(computed)
    assert first > 0 and len(set(computed)) == first  # each tensor once
    merge(_ram(family, **rule), tmp_path / "b", quiet=True)
    assert len(computed) == first  # read from the cache
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    assert _thresholds(tmp_path / "a") == _thresholds(tmp_path / "b")
    merge(_ram(family, "ram_plus", **rule, r=0.3), tmp_path / "c", quiet=True)  # another method, the same rule
    probe(str(family[0]), [str(a) for a in family[1]], quiet=True, mask=rule)  # and the probe
    assert len(computed) == first


def test_another_rule_or_a_changed_file_computes_again(
    family: tuple[Path, list[Path]], tmp_path: Path, computed: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    rules: list[dict[str, object]] = [
        {"epsilon_rule": "percentile", "epsilon_q": 70.0},
        {"epsilon_rule": "percentile", "epsilon_q": 71.0},
        {"epsilon_rule": "valley"},
        {"epsilon_rule": "valley", "epsilon": 1e-4},  # the valley's fallback epsilon
        {"epsilon_rule": "valley", "seed": 1},  # the valley's subsample
    ]
    seen = []
    for i, rule in enumerate(rules):
        merge(_ram(family, **rule), tmp_path / f"r{i}", quiet=True)
        seen.append(len(computed))
    per_merge = seen[0]
    assert seen == [per_merge * (i + 1) for i in range(len(rules))]  # no rule was served another's thresholds
    merge(_ram(family, epsilon_rule="percentile", epsilon_q=70.0, epsilon=1e-3), tmp_path / "same", quiet=True)
    assert len(computed) == seen[-1]  # the percentile rule does not read epsilon: the same thresholds
    weights = family[1][2] / "model.safetensors"
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # same bytes, a new identity
    merge(_ram(family, **rules[0]), tmp_path / "touched", quiet=True)
    assert len(computed) == seen[-1] + per_merge
    monkeypatch.setenv("AGENTMERGE_NO_CACHE", "1")
    merge(_ram(family, **rules[0]), tmp_path / "off", quiet=True)
    assert len(computed) == seen[-1] + 2 * per_merge
    for out in ("touched", "off"):
        assert (tmp_path / out / "model.safetensors").read_bytes() == (
            tmp_path / "r0" / "model.safetensors"
        ).read_bytes()


def test_fixed_rule_leaves_no_threshold_store(
    family: tuple[Path, list[Path]], tmp_path: Path, computed: list[str]
) -> None:
    merge(_ram(family), tmp_path / "a", quiet=True)
    merge(_ram(family, mask_dtype="base"), tmp_path / "b", quiet=True)  # a grid is not adaptive either
    assert computed == [] and not (cache_dir() / "levels").exists()


def test_broken_threshold_entries_are_computed_again(
    family: tuple[Path, list[Path]], tmp_path: Path, computed: list[str]
) -> None:
    merge(_ram(family, epsilon_rule="valley"), tmp_path / "a", quiet=True)
    first = len(computed)
    (store,) = (cache_dir() / "levels").glob("*.json")
    entries = json.loads(store.read_text())
    name, entry = next(iter(entries.items()))
    value = unseal(name, entry)
    assert value is not None, "the entry is sealed with its key"
    entries[name] = seal(name, {**value, "values": value["values"][:-1]})  # one agent short, checksum right
    store.write_text(json.dumps(entries))
    merge(_ram(family, epsilon_rule="valley"), tmp_path / "b", quiet=True)
    assert len(computed) == first + 1  # that tensor alone
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
