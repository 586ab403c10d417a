"""Plug-ins: installed packages add commands and evaluators to agentmerge through entry points.

Two entry-point groups, declared in the plug-in's ``pyproject.toml``:

```toml
[project.entry-points."agentmerge.commands"]
zoo = "agentmerge_zoo.cli:register"          # register(subparsers): adds `agentmerge zoo ...`

[project.entry-points."agentmerge.evaluators"]
zoo = "agentmerge_zoo.suite:ZooEvaluator"     # an Evaluator subclass: `evaluate: zoo` in a sweep file
```

The library names no plug-in: the agent zoo of this repository is one, found like any other. Entry points are
read from the installed packages' metadata only when asked for (importing ``importlib.metadata`` alone costs
about 30 ms), and a plug-in's module is imported only when it is used.
"""

from __future__ import annotations

from typing import Any

from agentmerge.errors import ConfigError

COMMANDS = "agentmerge.commands"
EVALUATORS = "agentmerge.evaluators"


def entry_points(group: str) -> dict[str, str]:
    """``{name: "module:attribute"}`` of every installed entry point of ``group`` (the first of a name wins)."""
    from importlib.metadata import entry_points as installed

    found: dict[str, str] = {}
    for ep in installed(group=group):
        found.setdefault(ep.name, ep.value)
    return found


def load(group: str, name: str, target: str) -> Any:
    """The object ``target`` (``"module:attribute"``) names; a ``ConfigError`` naming the plug-in if it fails."""
    import importlib

    module, _, attribute = target.partition(":")
    try:
        value = importlib.import_module(module)
        for part in attribute.split(".") if attribute else []:
            value = getattr(value, part)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"plug-in {name!r} of {group} ({target}) cannot be loaded: {e}") from None
    return value
