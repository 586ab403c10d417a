"""Shared fixtures: tiny synthetic model families written to tmp folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentmerge.synthetic import write_family


@pytest.fixture(scope="session")
def tiny_family(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    """A tiny Qwen2-shaped bf16 base and three RL-like agents (densities 3 %, 46 %, 54 %). Read only."""
    root = tmp_path_factory.mktemp("family")
    return write_family(root, "tiny", [0.03, 0.46, 0.54], seed=0)


@pytest.fixture(autouse=True)
def _private_hash_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the input-hash cache of merge.json out of the user's ~/.cache during tests."""
    monkeypatch.setenv("AGENTMERGE_CACHE", str(tmp_path_factory.getbasetemp() / "hash-cache"))
