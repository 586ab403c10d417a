"""The shape of the house: imports run one way between the layers, one registry of methods, short functions.

Layers, lowest first (a module may import its own layer and the ones below, never above):
    methods            pure tensor math, the one registry (no file I/O)
    io                 checkpoints in and out, itself in four floors (``IO_FLOORS``):
                         guards < cache < formats < output
    config             what the user asks for (schema, mergekit files)
    engine             the streamed merge, probe, dry run
    evaluation         scoring checkpoints
    sweep              merge-and-evaluate trials on Ray
    cli                the command line (``agentmerge.cli``, ``agentmerge.__main__``)
The package root re-exports names lazily; ``errors``, ``_version``, ``plugins``, ``paramtext`` (the one grammar of a
parameter value typed as text, read by ``methods`` and the CLI alike) and ``synthetic`` are leaves.
``agentmerge.api`` is the documented surface for client code, above every layer (nothing in the library imports it).
The zoo (``agentmerge_zoo``, its own distribution under ``zoo/``) is a client: it imports ``agentmerge`` and
``agentmerge.api`` and nothing deeper; nothing in ``agentmerge`` imports it or names its modules; it plugs in
through entry points (``plugins``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import agentmerge
from agentmerge.methods.spec import Lazy

SRC = Path(agentmerge.__file__).parent
ZOO = Path(__file__).parents[1] / "zoo" / "src" / "agentmerge_zoo"
PUBLIC = {"agentmerge", "agentmerge.api"}  # all of the library a client (the zoo) may import
LAYERS = ("methods", "io", "config", "engine", "evaluation", "sweep", "cli")
LEAVES = {"agentmerge.errors", "agentmerge._version", "agentmerge.plugins", "agentmerge.paramtext"}


def _module(path: Path) -> str:
    root = ZOO.parent if path.is_relative_to(ZOO) else SRC.parent
    rel = path.relative_to(root).with_suffix("")
    name = ".".join(rel.parts)
    return name.removesuffix(".__init__")


def _trees() -> dict[str, tuple[Path, ast.Module]]:
    files = [*sorted(SRC.rglob("*.py")), *sorted(ZOO.rglob("*.py"))]
    return {_module(p): (p, ast.parse(p.read_text())) for p in files}


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
                # ``from pkg import submodule`` imports the submodule (the package runs first for any of its
                # modules anyway); ``from pkg import name`` imports the package's own names
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in trees]
                names = [*([base] if len(subs) < len(node.names) else []), *subs]
            graph[mod] |= {n for n in names if n in trees and n != mod}
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
    for name in ("probe", "merge_dryrun", "inputs", "parallel", "caches", "counting", "merge_plan", "render"):
        mod = f"agentmerge.engine.{name}"
        assert "agentmerge.engine.merge" not in graph[mod], mod


def test_a_method_is_declared_in_its_own_package() -> None:
    """``Method(...)`` entries are built in their method's package (its ``__init__``, beside its record) and nowhere
    else; the registry lists them, one line each, and its list is all there is (no aliases, no special cases)."""
    from agentmerge.methods.registry import ALL, METHODS

    places = []
    for mod, (_, tree) in _trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Method":
                places.append(mod)
    assert set(places) == method_packages()
    assert len(ALL) == len(METHODS) == len(places)
    registry = _trees()["agentmerge.methods.registry"][1]
    assert [n.name for n in registry.body if isinstance(n, ast.FunctionDef)] == []
    for m in METHODS.values():  # each entry's kernel lives in the package that declares the entry
        assert isinstance(m.kernel, Lazy) and m.kernel.target.startswith(f"{package_of(m)}."), m.name


def test_every_function_is_short() -> None:
    long = []
    for mod, (_, tree) in _trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size >= 60:
                    long.append(f"{mod}.{node.name}: {size} lines")
    assert long == []


def layer(mod: str) -> str | None:
    """The layer of a module (``LAYERS``), ``zoo`` for the client, None for the root and its leaves."""
    if mod.startswith("agentmerge_zoo"):
        return "zoo"
    parts = mod.split(".")
    if parts[1:2] == ["__main__"]:
        return "cli"
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def test_layer_table_covers_the_house() -> None:
    """Every module of the library is in a layer or is one of the few named leaves: no loose room."""
    loose = {m for m in import_graph() if layer(m) is None}
    assert loose == {*PUBLIC, "agentmerge.synthetic", *LEAVES}


def test_imports_run_down_the_layers() -> None:
    """A module imports its own layer or lower ones; the leaves import no layer but ``methods``' table."""
    up = []
    for mod, targets in import_graph().items():
        here = layer(mod)
        for target in targets:
            there = layer(target)
            if here == "zoo":  # the client: itself and the public surface
                ok = there == "zoo" or target in PUBLIC
            elif there is None or mod in PUBLIC:  # the root and the api are the public face: they hand on
                continue
            elif there == "zoo":
                ok = False
            elif here is None:  # the leaves: synthetic writes models with io
                ok = mod == "agentmerge.synthetic" and there in ("io", "methods")
            else:
                ok = LAYERS.index(there) <= LAYERS.index(here)
            if not ok:
                up.append(f"{mod} -> {target}")
    assert up == []


def test_the_math_reads_no_files() -> None:
    """``methods`` imports nothing of io (and no safetensors): kernels see tensors, never checkpoints."""
    bad = []
    for mod, (_, tree) in _trees().items():
        if layer(mod) != "methods":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                bad += [f"{mod} imports {n}" for n in names if n.startswith(("agentmerge.io", "safetensors"))]
    assert bad == []


def past_the_surface(graph: dict[str, set[str]]) -> list[str]:
    """Imports of the zoo that reach past ``PUBLIC`` into the library, and library modules importing the api (the
    api is for clients: a library module that used it would hide the layer it really depends on)."""
    bad = []
    for mod, targets in sorted(graph.items()):
        client = layer(mod) == "zoo"
        bad += [f"{mod} -> {t}" for t in sorted(targets) if client and layer(t) != "zoo" and t not in PUBLIC]
        bad += [f"{mod} -> {t}" for t in sorted(targets) if not client and t == "agentmerge.api"]
    return bad


def test_the_zoo_imports_only_the_public_api() -> None:
    """No exemption: the zoo uses ``agentmerge`` and ``agentmerge.api`` as any user's code would."""
    graph = import_graph()
    assert "agentmerge_zoo.cli" in graph and "agentmerge_zoo.real.cli" in graph  # the check sees the zoo
    assert past_the_surface(graph) == []
    assert past_the_surface(
        {
            "agentmerge_zoo.a": {"agentmerge", "agentmerge.api", "agentmerge_zoo.b", "agentmerge.sweep.sweepfile"},
            "agentmerge_zoo.b": {"agentmerge.errors"},
            "agentmerge.cli.main": {"agentmerge.api"},
        }
    ) == [
        "agentmerge.cli.main -> agentmerge.api",
        "agentmerge_zoo.a -> agentmerge.sweep.sweepfile",
        "agentmerge_zoo.b -> agentmerge.errors",
    ]


def test_nothing_in_the_library_imports_the_zoo() -> None:
    """The zoo is a client of the library; the library never names it in an import."""
    users = {
        m for m, targets in import_graph().items() if layer(m) != "zoo" and any(layer(t) == "zoo" for t in targets)
    }
    assert users == set()


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstring nodes of a module and its classes and functions."""
    holders = [
        tree,
        *(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)),
    ]
    return {
        id(h.body[0].value)
        for h in holders
        if h.body and isinstance(h.body[0], ast.Expr) and isinstance(h.body[0].value, ast.Constant)
    }


def zoo_names(tree: ast.Module) -> list[str]:
    """String constants in code (not docstrings) that name a zoo module (``find_spec("agentmerge_zoo.cli")``)."""
    docs = _docstrings(tree)
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant)
        and isinstance(n.value, str)
        and "agentmerge_zoo" in n.value
        and id(n) not in docs
    ]


def test_the_library_names_no_zoo_module() -> None:
    """Not even by a string: the zoo is found through its entry points (pyproject.toml), like any plug-in."""
    named = {m: zoo_names(tree) for m, (_, tree) in _trees().items() if layer(m) != "zoo"}
    assert {m: n for m, n in named.items() if n} == {}
    assert zoo_names(ast.parse('"""agentmerge_zoo is fine here"""\nspec = find_spec("agentmerge_zoo.cli")\n')) == [
        "agentmerge_zoo.cli"
    ]


# --------------------------------------------------------------------------- io's floors and one name per module

IO_FLOORS = ("guards", "cache", "formats", "output")  # lowest first, as LAYERS

# names that two library modules may share, with the reason (an __init__ is named by its package, so none yet)
SHARED_NAMES: dict[str, str] = {
    "kernels": "each method package's reference kernels (fused.kernels: the compiled kernels' shared chunk pieces)",
    "compiled": "each method package's compiled form",
    "loops": "numba loops: the shared ones (fused) and the TIES family's own",
    "fisher": "diagonal Fisher: the merge method (methods.fisher) and the estimate it reads (evaluation.fisher)",
}


def io_floor(mod: str) -> str | None:
    """The floor of a module under ``agentmerge.io`` (its first subpackage); None for ``agentmerge.io`` itself and
    for modules outside io."""
    parts = mod.split(".")
    return parts[2] if parts[:2] == ["agentmerge", "io"] and len(parts) > 2 else None


def test_every_io_module_is_on_a_floor() -> None:
    """io holds no loose module: what it reads (formats), writes (output), keeps (cache) and checks (guards) shows."""
    io_mods = {m for m in import_graph() if io_floor(m) is not None}
    assert {m for m in io_mods if io_floor(m) not in IO_FLOORS} == set()
    assert io_floor("agentmerge.io.formats.checkpoint") == "formats" and io_floor("agentmerge.io") is None


def test_io_floors_run_down() -> None:
    """guards import no other floor, cache only guards, formats guards and cache, output any of them."""
    up = []
    for mod, targets in import_graph().items():
        here = io_floor(mod)
        for target in targets:
            there = io_floor(target)
            if here in IO_FLOORS and there in IO_FLOORS and IO_FLOORS.index(there) > IO_FLOORS.index(here):
                up.append(f"{mod} -> {target}")
    assert up == []


def shared_names(modules: list[str]) -> dict[str, list[str]]:
    """Last name -> the modules (or packages) that bear it, for names more than one bears and not allowed."""
    bearers: dict[str, list[str]] = {}
    for mod in modules:
        bearers.setdefault(mod.rpartition(".")[2], []).append(mod)
    return {n: sorted(ms) for n, ms in bearers.items() if len(ms) > 1 and n not in SHARED_NAMES}


def test_no_two_library_modules_share_a_name() -> None:
    """A name says what a module holds: ``report`` / ``spec`` / ``plan`` in three packages said nothing."""
    library = [m for m in import_graph() if layer(m) != "zoo"]
    assert shared_names(library) == {}
    assert shared_names(["a.spec", "b.spec", "a", "b.c.a", "d"]) == {"spec": ["a.spec", "b.spec"], "a": ["a", "b.c.a"]}


def test_nothing_below_the_cli_imports_it() -> None:
    users = {
        m for m, targets in import_graph().items() if layer(m) != "cli" and any(layer(t) == "cli" for t in targets)
    }
    assert users == set()


def text_readers(tree: ast.Module) -> list[str]:
    """What in ``tree`` reads a value from text its own way: a call of ``yaml.safe_load`` / ``yaml.load``, or a
    function named as the grammar's (``parse_value``, ``parse_scalar``, ``parse_assignments``); in line order."""
    found = []
    for node in ast.walk(tree):
        func = node.func if isinstance(node, ast.Call) else None
        if isinstance(func, ast.Attribute) and func.attr in ("safe_load", "load") and _named(func.value, "yaml"):
            found.append((node.lineno, f"yaml.{func.attr}"))
        if isinstance(node, ast.FunctionDef) and node.name in ("parse_value", "parse_scalar", "parse_assignments"):
            found.append((node.lineno, f"def {node.name}"))
    return [f"line {line}: {what}" for line, what in sorted(found)]


def _named(node: ast.expr, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def test_one_grammar_reads_parameter_text() -> None:
    """``--param`` values and parameter values left as text are read by ``agentmerge.paramtext`` alone; YAML parses
    config files only (``config/limits.read_config_yaml``); no command keeps a grammar of its own."""
    readers = {m: text_readers(tree) for m, (_, tree) in _trees().items() if layer(m) != "zoo"}
    allowed = {"agentmerge.paramtext", "agentmerge.config.limits"}
    assert {m: r for m, r in readers.items() if r and m not in allowed} == {}
    assert text_readers(ast.parse("import yaml\nyaml.safe_load(v)\ndef parse_value(t): ...\n")) == [
        "line 2: yaml.safe_load",
        "line 3: def parse_value",
    ]


def test_the_layer_check_can_fail() -> None:
    assert layer("agentmerge.io.formats.checkpoint") == "io" and layer("agentmerge_zoo.bench") == "zoo"
    assert LAYERS.index("io") > LAYERS.index("methods")


def test_few_loose_files_and_no_big_rooms() -> None:
    """At most 10 files directly under the package; no module over 450 lines."""
    loose = [p.name for p in SRC.glob("*.py")]
    big = [
        f"{m}: {len(p.read_text().splitlines())}"
        for m, (p, _) in _trees().items()
        if len(p.read_text().splitlines()) > 450
    ]
    assert len(loose) <= 10, loose
    assert big == []


# --------------------------------------------------------------------------- the engine runs every method alike

# the driver, the dry run, the report and the engine modules under them (the probe is RAM+'s own tool)
METHOD_BLIND = ("merge", "merge_dryrun", "render", "merge_plan", "passes", "counting", "inputs", "parallel", "caches")


def method_literals(source: str, names: set[str]) -> list[str]:
    """The string literals of ``source`` that are a method's name (``"ram_plus"``, ``== "ties"``, dict keys)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            found.append(f"line {node.lineno}: {node.value!r}")
    return found


def test_the_engine_names_no_method() -> None:
    """What a method needs is in its registry entry (parameters, hooks), so the driver never asks which one it runs.

    An extra per-model input is named like the method that reads it (``fisher``): that name is an input kind.
    """
    from agentmerge.methods.registry import METHODS

    kinds = {kind for m in METHODS.values() for kind in m.needs.extras}
    names = set(METHODS) - kinds
    assert method_literals('if plan.method.name == "ram_plus" or p["scope"] == "global": pass', names)
    found = {m: method_literals((SRC / "engine" / f"{m}.py").read_text(), names) for m in METHOD_BLIND}
    assert {m: f for m, f in found.items() if f} == {}


def test_a_method_entry_is_small() -> None:
    """``Method`` had 16 fields (kernel, parameters and five ways to ask for a pre-pass); its hooks bundle them."""
    from dataclasses import fields

    from agentmerge.methods.method import Method

    assert len(fields(Method)) < 16
    assert [f.name for f in fields(Method)] == [
        "name",
        "summary",
        "kernel",
        "record",
        "needs",
        "passes",
        "scales",
        "advice",
        "compiled_at",
        "paper",
        "mergekit",
    ]


# --------------------------------------------------------------------------- inside methods/: helpers below the methods


def package_of(method: object) -> str:
    """The package whose ``__init__`` declares a registry entry (``agentmerge.methods.ties`` for TIES)."""
    import sys

    from agentmerge.methods.method import Method

    assert isinstance(method, Method)
    homes = [
        name
        for name, mod in sys.modules.items()
        if name.startswith("agentmerge.methods.") and any(v is method for v in vars(mod).values())
    ]
    home = min(homes, key=len)  # the declaring package (the registry names the package, not the entry)
    return home


def method_packages() -> set[str]:
    """The packages of the methods: where the registry's entries are declared."""
    from agentmerge.methods.registry import METHODS

    return {package_of(m) for m in METHODS.values()}


def helpers_importing_methods(graph: dict[str, set[str]], packages: set[str]) -> dict[str, set[str]]:
    """Modules of ``agentmerge.methods`` outside ``packages`` (and not the registry) that import one of them."""

    def inside(mod: str) -> bool:
        return any(mod == p or mod.startswith(p + ".") for p in packages)

    lists = {"agentmerge.methods", "agentmerge.methods.registry"}  # the package's names and the list of methods
    helpers = [m for m in graph if m.startswith("agentmerge.methods.") and not inside(m) and m not in lists]
    return {m: {i for i in graph[m] if inside(i)} for m in helpers if any(inside(i) for i in graph[m])}


def test_shared_helpers_never_import_a_method() -> None:
    """The primitives (``spec``, ``deltas``, ``stats``, ...) and the compiled helpers (``fused/``) sit below the
    method packages: a method imports them, never the other way (once ``stats`` and ``fused/`` imported each
    other, and ``fused/`` imported RAM's, TIES's and the field methods' kernels)."""
    graph = import_graph()
    packages = method_packages()
    assert {"agentmerge.methods.ram", "agentmerge.methods.ties", "agentmerge.methods.svd"} <= packages
    assert "agentmerge.methods.fused" not in packages and "agentmerge.methods" not in packages
    assert helpers_importing_methods(graph, packages) == {}
    bad = {**graph, "agentmerge.methods.stats": graph["agentmerge.methods.stats"] | {"agentmerge.methods.ties.kernels"}}
    assert helpers_importing_methods(bad, packages) == {"agentmerge.methods.stats": {"agentmerge.methods.ties.kernels"}}


# Modules outside a method's package that may still name it, and why (shrink this list, never grow it lightly).
NAMES_ALLOWED = {
    "agentmerge.config.mergekit": {"task_arithmetic", "breadcrumbs", "della"},  # mergekit reader's per-method rules
    "agentmerge.engine.probe": {"ram_plus"},  # the probe is RAM+'s own tool (its config of the counts)
    "agentmerge.cli.merging": {"ram_plus"},  # the probe command's RAM+ mask parameters
    "agentmerge.engine.moe.moe_config": {"ram"},  # the MoE static merge's default method
    "agentmerge.engine.extract_lora": {"linear"},  # a homonym: PEFT's kind of module (nn.Linear)
    "agentmerge.io.formats.peft_layout": {"linear"},  # the same homonym
}


def named_methods(tree: ast.Module, names: set[str]) -> set[str]:
    """The method names among the string literals of ``tree`` (docstrings left out)."""
    docs = _docstrings(tree)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            found |= {node.value} & names
    return found


def test_no_module_names_a_method_outside_its_package() -> None:
    """No code branches on a method's name outside the method's own package and the registry's list: what differs
    between methods is a field of their entry or record (``Method.mergekit``, ``MethodParams.sum_multiple``, ...).
    An extra per-model input named like the method that reads it (``fisher``) is an input kind, not a method."""
    from agentmerge.methods.registry import METHODS

    kinds = {kind for m in METHODS.values() for kind in m.needs.extras}
    home = {m.name: package_of(m) for m in METHODS.values() if m.name not in kinds}
    found = {}
    for mod, (_, tree) in _trees().items():
        if not mod.startswith("agentmerge.") or mod == "agentmerge.methods.registry":
            continue
        named = {n for n in named_methods(tree, set(home)) if not (mod + ".").startswith(home[n] + ".")}
        if named - NAMES_ALLOWED.get(mod, set()):
            found[mod] = named - NAMES_ALLOWED.get(mod, set())
    assert found == {}
    assert named_methods(ast.parse('"""ties"""\nif m == "ties": pass'), set(home)) == {"ties"}
