"""``agentmerge.api``, the surface a client builds on: every name resolves to what its module holds, and it holds
exactly what the zoo (its one client in this repository) imports, which is nothing else of the library."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import agentmerge
from agentmerge import api

ZOO = Path(__file__).parents[1] / "zoo" / "src" / "agentmerge_zoo"


def imported_names(root: Path, module: str) -> set[str]:
    """The names the files under ``root`` import with ``from MODULE import ...``."""
    names = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == module and not node.level:
                names |= {a.name for a in node.names}
    return names


def test_every_api_name_is_its_modules_object() -> None:
    assert sorted(api.__all__) == sorted(api._WHERE)
    for name, (module, attribute) in api._WHERE.items():
        assert getattr(api, name) is getattr(importlib.import_module(module), attribute), name


def test_the_type_checkers_view_names_the_same_objects() -> None:
    """The ``TYPE_CHECKING`` imports (what mypy sees) say what ``_WHERE`` (what runs) says."""
    tree = ast.parse(Path(api.__file__).read_text())
    (block,) = [n for n in tree.body if isinstance(n, ast.If)]
    seen = {
        a.asname or a.name: (node.module, a.name)
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for a in node.names
    }
    assert seen == api._WHERE


def test_the_api_holds_exactly_what_the_zoo_imports() -> None:
    assert imported_names(ZOO, "agentmerge.api") == set(api.__all__)
    assert imported_names(ZOO, "agentmerge") <= set(agentmerge.__all__)


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        api.no_such_name  # noqa: B018
    except AttributeError as e:
        assert "agentmerge.api" in str(e)
    else:
        raise AssertionError("api.no_such_name resolved")
