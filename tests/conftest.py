"""Shared fixtures: tiny synthetic model families written to tmp folders."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import tomllib
from pathlib import Path

import pytest

from agentmerge.synthetic import write_family

ROOT = Path(__file__).parents[1]
PYPROJECTS = (ROOT / "pyproject.toml", ROOT / "zoo" / "pyproject.toml")  # agentmerge, and the zoo's distribution
ZOO_SRC = ROOT / "zoo" / "src"


def declared_entry_points() -> dict[str, dict[str, str]]:
    """The plug-in entry points this checkout's two pyproject.toml files declare: group -> {name: "module:attr"}."""
    found: dict[str, dict[str, str]] = {}
    for path in PYPROJECTS:
        project = tomllib.loads(path.read_text())["project"]
        for group, eps in project.get("entry-points", {}).items():
            found.setdefault(group, {}).update(eps)
    return found


def _put_first(folder: Path) -> None:
    """``folder`` first on the import path of this process and of the ones it starts (CLI subprocesses, Ray)."""
    sys.path.insert(0, str(folder))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)


def _see_this_checkouts_zoo() -> None:
    """The zoo is a distribution of its own (``zoo/``): with ``PYTHONPATH=src`` alone, or an install made from
    another checkout, ``agentmerge_zoo`` would be missing or another checkout's; use this checkout's."""
    from importlib.util import find_spec

    spec = find_spec("agentmerge_zoo")
    here = ZOO_SRC / "agentmerge_zoo" / "__init__.py"
    if spec is None or spec.origin is None or Path(spec.origin).resolve() != here.resolve():
        _put_first(ZOO_SRC)


def _see_this_checkouts_entry_points() -> None:
    """Tests run this checkout's sources (``PYTHONPATH=src``) on whatever install the environment holds. When
    that install's metadata lacks this checkout's entry points (installed from another checkout, or before they
    changed), put a metadata-only distribution holding them first on the path, for this process and the ones it
    starts (the CLI in a subprocess, Ray workers), so plug-ins are found as ``pip install -e .`` would make them.
    """
    from importlib.metadata import entry_points

    declared = declared_entry_points()
    installed = {g: {ep.name: ep.value for ep in entry_points(group=g)} for g in declared}
    if all(installed[g].get(n) == v for g, eps in declared.items() for n, v in eps.items()):
        return
    folder = Path(tempfile.mkdtemp(prefix="agentmerge-entry-points-"))
    atexit.register(shutil.rmtree, folder, True)
    dist = folder / "agentmerge_checkout_entry_points-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: agentmerge-checkout-entry-points\nVersion: 0\n")
    sections = [f"[{g}]\n" + "".join(f"{n} = {v}\n" for n, v in eps.items()) for g, eps in declared.items()]
    (dist / "entry_points.txt").write_text("\n".join(sections))
    _put_first(folder)


_see_this_checkouts_zoo()
_see_this_checkouts_entry_points()


@pytest.fixture(scope="session")
def tiny_family(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    """A tiny Qwen2-shaped bf16 base and three RL-like agents (densities 3 %, 46 %, 54 %). Read only."""
    root = tmp_path_factory.mktemp("family")
    return write_family(root, "tiny", [0.03, 0.46, 0.54], seed=0)


@pytest.fixture(autouse=True)
def _private_hash_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the input-hash cache of merge.json out of the user's ~/.cache during tests."""
    monkeypatch.setenv("AGENTMERGE_CACHE", str(tmp_path_factory.getbasetemp() / "hash-cache"))
