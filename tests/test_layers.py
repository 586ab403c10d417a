"""The shape of the house: imports run one way, one registry of methods, short functions."""

from __future__ import annotations

import ast
from pathlib import Path

import agentmerge

SRC = Path(agentmerge.__file__).parent


def _module(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    name = ".".join(rel.parts)
    return name.removesuffix(".__init__")


def _trees() -> dict[str, tuple[Path, ast.Module]]:
    return {_module(p): (p, ast.parse(p.read_text())) for p in sorted(SRC.rglob("*.py"))}


def import_graph() -> dict[str, set[str]]:
    """Module -> the agentmerge modules it imports, anywhere in the file (type-checking and lazy imports too)."""
    trees = _trees()
    graph: dict[str, set[str]] = {m: set() for m in trees}
    for mod, (path, tree) in trees.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, *([node.module] if node.module else [])])
                names = [base, *(f"{base}.{a.name}" for a in node.names)]
            graph[mod] |= {n for n in names if n in trees and n not in (mod, "agentmerge")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle, one path per strongly connected component with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_finds_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles() -> None:
    assert cycles(import_graph()) == []


def test_probe_dry_run_and_streaming_do_not_import_the_driver() -> None:
    graph = import_graph()
    for mod in ("agentmerge.probe", "agentmerge.dryrun", "agentmerge.stream", "agentmerge.plan", "agentmerge.report"):
        assert "agentmerge.merge" not in graph[mod], mod


def test_methods_are_declared_only_in_the_registry() -> None:
    """``Method(...)`` entries are built in registry.py and nowhere else: one table a reader can see whole."""
    places = []
    for mod, (_, tree) in _trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Method":
                places.append(mod)
    assert set(places) == {"agentmerge.registry"}


def test_every_function_is_short() -> None:
    long = []
    for mod, (_, tree) in _trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size >= 60:
                    long.append(f"{mod}.{node.name}: {size} lines")
    assert long == []
