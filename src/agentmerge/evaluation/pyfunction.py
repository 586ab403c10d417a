"""The ``python`` evaluator: the user's own function scores a checkpoint.

``evaluate: python:MODULE:FUNCTION`` in a sweep file: ``FUNCTION(path_to_merged_folder)`` returns
``{metric: number}``; MODULE is imported from the sweep file's folder, the current folder or the installed
packages (in that order). A long-lived worker (Ray reuses them) that holds a module of that name from another
sweep's folder imports it afresh.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentmerge.errors import ConfigError, one_line
from agentmerge.evaluation.evaluator import Context, Evaluator, Reads, Score, checked_metrics


class PythonEvaluator(Evaluator):
    """A function ``folder -> {metric: number}``; its result is checked (finite numbers, at least one)."""

    kind = "python"
    usage = "python:MODULE:FUNCTION"

    def __init__(self, function: Callable[[Path], object], target: str = "") -> None:
        self.function = function
        self.target = target or getattr(function, "__qualname__", "function")

    @property
    def name(self) -> str:
        return f"python:{self.target}"

    def score(self, checkpoint: Path) -> Score:
        return Score(checked_metrics(self.function(checkpoint), f"evaluate: {self.target}"))

    @classmethod
    def check_spec(cls, spec: str, arg: str) -> None:
        if arg.count(":") != 1:
            raise ConfigError(f"evaluate: {spec!r}: write python:MODULE:FUNCTION")

    @classmethod
    def reads(cls, arg: str, search_path: Sequence[str]) -> list[Reads]:
        """The module's file when it lies in ``search_path``, else the module (importable where it scores)."""
        module = arg.partition(":")[0]
        file = module_file(module, search_path)
        return [Reads("evaluator module", file) if file else Reads("evaluator module", module, "module")]

    @classmethod
    def from_spec(cls, arg: str, options: Mapping[str, Any], context: Context) -> PythonEvaluator:
        module_name, _, function = arg.partition(":")
        try:
            module = import_from(module_name, context.search_path)
        except ImportError as e:
            raise ConfigError(f"evaluate: cannot import {module_name!r} ({e})") from None
        except SyntaxError as e:  # the user's module: where, not a traceback
            raise ConfigError(
                f"evaluate: {e.filename}:{e.lineno}: {type(e).__name__} ({e.msg}) in module {module_name!r}; fix it"
            ) from None
        except Exception as e:  # the module raised while it was imported
            raise ConfigError(f"evaluate: importing {module_name!r} raised {one_line(e)}; fix the module") from None
        fn = getattr(module, function, None)
        if not callable(fn):
            raise ConfigError(f"evaluate: {module_name!r} has no function {function!r}")
        return cls(fn, arg)


def import_from(name: str, search_path: Sequence[str]) -> Any:
    """Import ``name`` with ``search_path`` first on ``sys.path``.

    A module of that name already imported from another file than the one ``search_path`` holds is imported
    afresh.
    """
    for folder in reversed(search_path):
        if folder in sys.path:
            sys.path.remove(folder)
        sys.path.insert(0, folder)
    wanted = next((p for f in search_path if (p := Path(f) / f"{name}.py").is_file()), None)
    held = sys.modules.get(name)
    if (
        held is not None
        and wanted is not None
        and Path(getattr(held, "__file__", "") or "").resolve() != wanted.resolve()
    ):
        del sys.modules[name]
    importlib.invalidate_caches()
    return importlib.import_module(name)


def module_file(module: str, search_path: Sequence[str]) -> str | None:
    """The file ``module`` is imported from when it lies in ``search_path`` (else None: an installed one)."""
    top = module.split(".")[0]
    for folder in search_path:
        for candidate in (Path(folder) / f"{top}.py", Path(folder) / top / "__init__.py"):
            if candidate.is_file():
                return str(candidate)
    return None
