"""The statistics pass counts a given set of files once: later RAM+ merges and probes reuse its histograms."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from agentmerge import MergeConfig, ModelSpec, merge, probe, stream
from agentmerge.cache import cache_dir


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
    task = stream._hist_task

    def spy(inputs: stream.Inputs, name: str, *args: object) -> object:
        seen.append(name)
        return task(inputs, name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(stream, "_hist_task", spy)
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
