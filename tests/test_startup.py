"""Start-up: help, the method list and input errors answer without importing torch (or numba)."""

from __future__ import annotations

import subprocess
import sys

import pytest

RUN = """
import sys
from agentmerge.__main__ import main
sys.argv = ["agentmerge", *sys.argv[1:]]
try:
    code = main()
except SystemExit as e:
    code = e.code
heavy = sorted(m for m in ("torch", "numba", "transformers") if m in sys.modules)
print("HEAVY", ",".join(heavy) or "-", "CODE", code, file=sys.stderr)
"""


def _run(*argv: str) -> tuple[str, str]:
    done = subprocess.run([sys.executable, "-c", RUN, *argv], capture_output=True, text=True, timeout=120)
    return done.stdout, done.stderr


@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        (["--help"], 0, ""),
        (["methods"], 0, ""),
        (["methods", "--json"], 0, ""),
        (["merge", "--help"], 0, ""),
        (["merge", "--no-such-flag"], 2, "unrecognized arguments"),
        (["merge", "--method", "ram_pluss", "--base", "b", "--model", "a", "-o", "o"], 2, "did you mean 'ram_plus'"),
        (["merge", "--method", "ties", "--base", "b", "--model", "a", "-o", "o", "--param", "density=2"], 2, "density"),
        (["merge", "--method", "dare_ties", "--base", "b", "--model", "a", "-o", "o", "--param", "p=1"], 2, "below 1"),
        (["merge", "--method", "ram", "--base", "b", "--model", "a", "-o", "o", "--dtype", "fp7"], 2, "unknown dtype"),
        (["merge", "--method", "ram", "--base", "/no/base", "--model", "./agent", "-o", "o"], 2, "/no/base: no such"),
        (
            ["merge", "--method", "ram", "--base", "org/b", "--model", "/no/a+/no/lora", "-o", "o"],
            2,
            "/no/lora: no such",
        ),
    ],
)
def test_answers_without_torch(argv: list[str], code: int, says: str) -> None:
    out, err = _run(*argv)
    assert f"HEAVY - CODE {code}" in err, err
    assert says in err
    if argv[0] == "methods":
        assert "ram_plus" in out


def test_a_merge_still_loads_the_kernels(tiny_family: tuple[object, list[object]], tmp_path: object) -> None:
    """The other side: a command that merges does import torch (so the check above can fail)."""
    base, agents = tiny_family
    argv = ["merge", "--method", "ram", "--base", str(base), "--model", str(agents[0]), "-o", f"{tmp_path}/o"]
    _, err = _run(*argv, "--quiet")
    assert "HEAVY numba,torch CODE 0" in err, err


def test_every_lazy_reference_of_the_table_resolves() -> None:
    """A misspelt ``Lazy`` target would only fail at merge time; resolve them all here."""
    from dataclasses import fields

    from agentmerge.methods.registry import METHODS
    from agentmerge.methods.spec import Compiled, Lazy

    for m in METHODS.values():
        for f in fields(m):
            value = getattr(m, f.name)
            if isinstance(value, Lazy) and f.name != "compiled_at":
                assert callable(value.get()), (m.name, f.name)
        assert m.compiled_at is None or isinstance(m.compiled, Compiled), m.name
    assert METHODS["ties"].compiled is not None and METHODS["della"].compiled is None


def test_heavy_imports_pause_the_collector_only_while_importing() -> None:
    import gc

    from agentmerge.cli import heavy_imports

    assert gc.isenabled()
    with heavy_imports():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_convert_config_to_mergekit_answers_without_torch(tmp_path: object) -> None:
    from pathlib import Path

    native = Path(str(tmp_path)) / "ours.yaml"
    native.write_text("method: ties\nbase: b\nmodels: [a1, a2]\nparams: {density: 0.3}\n")
    out, err = _run("convert-config", "--to", "mergekit", str(native))
    assert "HEAVY - CODE 0" in err, err
    assert "merge_method: ties" in out
