"""Two distributions: ``agentmerge`` (the library, ``pyproject.toml``) ships no zoo; ``agentmerge-zoo``
(``zoo/pyproject.toml``) ships the zoo and plugs it in through entry points.

Package discovery is read the way setuptools reads it when it builds the wheels (``read_configuration``), which
costs well under a second; ``pip wheel --no-deps .`` builds the same list (docs/zoo.md).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from setuptools.config.pyprojecttoml import read_configuration

ROOT = Path(__file__).parents[1]
LIBRARY, ZOO = ROOT / "pyproject.toml", ROOT / "zoo" / "pyproject.toml"


def _config(path: Path) -> dict[str, Any]:
    return read_configuration(path)


def _packages_on_disk(src: Path) -> set[str]:
    return {".".join(p.parent.relative_to(src).parts) for p in src.rglob("__init__.py")}


def test_the_library_wheel_holds_agentmerge_and_no_zoo() -> None:
    config = _config(LIBRARY)
    packages = set(config["tool"]["setuptools"]["packages"])
    assert packages == {p for p in _packages_on_disk(ROOT / "src") if p.split(".")[0] == "agentmerge"}
    assert not [p for p in packages if p.startswith("agentmerge_zoo")]
    entry_points = config["project"].get("entry-points", {})
    assert "agentmerge_zoo" not in repr(entry_points) and "agentmerge-zoo" not in repr(config["project"])


def test_the_zoo_distribution_holds_the_zoo_and_plugs_in() -> None:
    config = _config(ZOO)
    assert set(config["tool"]["setuptools"]["packages"]) == _packages_on_disk(ROOT / "zoo" / "src")
    assert all(p.split(".")[0] == "agentmerge_zoo" for p in config["tool"]["setuptools"]["packages"])
    project = config["project"]
    assert project["name"] == "agentmerge-zoo"
    assert any(d.startswith("agentmerge[") or d == "agentmerge" for d in project["dependencies"])
    assert project["entry-points"] == {
        "agentmerge.commands": {"zoo": "agentmerge_zoo.cli:register"},
        "agentmerge.evaluators": {
            "zoo": "agentmerge_zoo.suite:ZooEvaluator",
            "real": "agentmerge_zoo.real.plugin:RealEvaluator",
        },
    }


def test_a_zoo_put_back_under_src_would_stay_out_of_the_library_wheel(tmp_path: Path) -> None:
    """The library's discovery names ``agentmerge`` alone, so a zoo package next to it is not picked up."""
    shutil.copy(LIBRARY, tmp_path / "pyproject.toml")
    for package in ("agentmerge", "agentmerge_zoo", "agentmerge/io"):
        (tmp_path / "src" / package).mkdir(parents=True)
        (tmp_path / "src" / package / "__init__.py").write_text("")
    (tmp_path / "src" / "agentmerge" / "_version.py").write_text('__version__ = "0"\n')
    (tmp_path / "README.md").write_text("x\n")
    assert set(_config(tmp_path / "pyproject.toml")["tool"]["setuptools"]["packages"]) == {
        "agentmerge",
        "agentmerge.io",
    }
