"""agentmerge: merge RL-trained agent checkpoints of one base model, probe their task vectors.

from agentmerge import MergeConfig, ModelSpec, merge, probe
cfg = MergeConfig(method="ram_plus", base="base", models=[ModelSpec(path="a1"), ModelSpec(path="a2")])
result = merge(cfg, "merged")
report = probe("base", ["a1", "a2"])

The names that need torch (``merge``, ``probe``, ``evaluate`` and their results) or pydantic (the config)
are imported on first use, so ``import agentmerge`` and the command line's help and method list start fast.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

from agentmerge.errors import AgentMergeError, CheckpointError, ConfigError, MergeError
from agentmerge.registry import METHODS

if TYPE_CHECKING:
    from agentmerge.config import MergeConfig, ModelSpec, Override, config_from_dict, load_config
    from agentmerge.evaluation import EvalRun, evaluate
    from agentmerge.merge import MergeResult, merge
    from agentmerge.probe import ProbeResult, probe

_ON_FIRST_USE = {
    **dict.fromkeys(("MergeConfig", "ModelSpec", "Override", "config_from_dict", "load_config"), "agentmerge.config"),
    "MergeResult": "agentmerge.merge",
    "ProbeResult": "agentmerge.probe",
    "evaluate": "agentmerge.evaluation",
    "EvalRun": "agentmerge.evaluation",
}


def __getattr__(name: str) -> Any:
    """The config, torch-backed names and results, imported when first asked for."""
    if name in _ON_FIRST_USE:
        return getattr(importlib.import_module(_ON_FIRST_USE[name]), name)
    raise AttributeError(f"module 'agentmerge' has no attribute {name!r}")


def _function_of(module: str) -> property:
    """``agentmerge.merge`` (``probe``): the function, also after the submodule of the same name is imported.

    Importing a submodule sets the package attribute of its name to the module; this attribute ignores that.
    """
    name = module.rpartition(".")[2]
    return property(lambda _: getattr(importlib.import_module(module), name), lambda _, value: None)


class _Package(types.ModuleType):
    merge = _function_of("agentmerge.merge")
    probe = _function_of("agentmerge.probe")


sys.modules[__name__].__class__ = _Package


__all__ = [
    "METHODS",
    "AgentMergeError",
    "CheckpointError",
    "ConfigError",
    "EvalRun",
    "MergeConfig",
    "MergeError",
    "MergeResult",
    "ModelSpec",
    "Override",
    "ProbeResult",
    "__version__",
    "config_from_dict",
    "evaluate",
    "load_config",
    "merge",
    "probe",
]
