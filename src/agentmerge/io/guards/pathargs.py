"""Which command-line values are inputs and which are outputs, declared where each argument is added.

Every command adds its path arguments through :func:`input_arg` and :func:`output_arg` instead of
``add_argument``; each records the argument's role in the parser (a default under ``ROLES``), so after parsing
``args`` knows which of its values are read and which are written. ``main`` then calls :func:`check_paths` before
any command runs: the one guard that no file is written over an input, whatever the command (a plug-in's
commands declare theirs the same way). Commands whose inputs are named inside a file (a merge config, a moe YAML,
an evaluator spec) call it again with those inputs.

Roles:

- ``model``: a model, adapter or other folder input (a file inside one protects its whole folder);
- ``file``: a single input file (a config, a prompts or task file);
- ``out-file``: a file the command writes (a report, a config, a plot): never an input, inside a model input's
  folder, inside the command's own output folder, or the file another output flag names;
- ``out-folder``: a folder the command creates or replaces: never is, contains or lies inside an input
  (``io.guards.safety.refuse_overlap``), nor the current directory;
- ``out-into``: a folder the command writes files into (results, caches): never an input or inside a model's.

``tests/test_output_guard.py`` walks every subcommand: each value-taking argument whose name says it is a path
must have a role, and every output is pointed at every file of a tiny model and adapter.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from agentmerge.io.guards.safety import refuse_into_input, refuse_overlap, refuse_write_over

ROLES = "_agentmerge_path_roles"
InputKind = Literal["model", "file"]
OutputKind = Literal["file", "folder", "into"]


@dataclass(frozen=True)
class PathRole:
    """One path argument: its ``dest``, how the user writes it, and its role (module docstring)."""

    dest: str
    flag: str
    role: str


def _declare(p: argparse.ArgumentParser, names: tuple[str, ...], role: str, kwargs: dict[str, Any]) -> argparse.Action:
    action = p.add_argument(*names, **kwargs)
    roles: list[PathRole] | None = p.get_default(ROLES)
    if roles is None:
        roles = []
        p.set_defaults(**{ROLES: roles})
    flag = max(action.option_strings, key=len) if action.option_strings else action.dest.upper()
    roles.append(PathRole(action.dest, flag, role))
    return action


def input_arg(p: argparse.ArgumentParser, *names: str, kind: InputKind = "model", **kwargs: Any) -> argparse.Action:
    """``p.add_argument(*names, **kwargs)`` for an input path (``kind`` model or file)."""
    return _declare(p, names, kind, kwargs)


def output_arg(p: argparse.ArgumentParser, *names: str, kind: OutputKind = "file", **kwargs: Any) -> argparse.Action:
    """``p.add_argument(*names, **kwargs)`` for an output path (``kind`` file, folder or into)."""
    return _declare(p, names, f"out-{kind}", kwargs)


def path_roles(args: argparse.Namespace) -> list[PathRole]:
    """The path roles the parsed command declared (none for a command that has no path arguments)."""
    return list(getattr(args, ROLES, None) or [])


def _values(args: argparse.Namespace, role: PathRole) -> list[str]:
    value = getattr(args, role.dest, None)
    items = value if isinstance(value, list | tuple) else [value]
    return [str(v) for v in items if v is not None and str(v) not in ("", "-")]  # '-': standard output


def _expand(ref: str) -> list[str]:
    """A ``MODEL+ADAPTER`` reference protects both parts."""
    if "+" in ref and not Path(ref).expanduser().exists():
        model, _, adapter = ref.rpartition("+")
        return [model, adapter]
    return [ref]


def check_paths(
    args: argparse.Namespace, *, models: Iterable[str | Path] = (), files: Iterable[str | Path] = ()
) -> None:
    """Refuse, in one line and before anything is written, an output over an input (module docstring).

    ``models`` and ``files``: inputs named elsewhere than on the command line (in a config file), added.
    """
    roles = path_roles(args)
    found: dict[str, list[tuple[PathRole, str]]] = {}
    for role in roles:
        found.setdefault(role.role, []).extend((role, v) for v in _values(args, role))
    model_refs = [r for _, v in found.get("model", []) for r in _expand(v)] + [str(m) for m in models]
    file_refs = [v for _, v in found.get("file", [])] + [str(f) for f in files]
    for role, value in found.get("out-folder", []):
        refuse_overlap(Path(value), [*model_refs, *file_refs], f"output folder ({role.flag})")
    for role, value in found.get("out-into", []):
        refuse_into_input(Path(value), role.flag, model_refs, file_refs)
    folders = [v for kind in ("out-folder", "out-into") for _, v in found.get(kind, [])]
    written: list[tuple[str, str]] = []
    for role, value in found.get("out-file", []):
        refuse_write_over(Path(value), role.flag, models=model_refs, files=file_refs, folders=folders, written=written)
        written.append((role.flag, value))
