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
from typing import TYPE_CHECKING, Any

from agentmerge._version import __version__
from agentmerge.errors import AgentMergeError, CheckpointError, ConfigError, MergeError
from agentmerge.methods.registry import METHODS

if TYPE_CHECKING:
    from agentmerge.config.schema import MergeConfig, ModelSpec, Override, config_from_dict, load_config
    from agentmerge.engine.merge import MergeResult, merge
    from agentmerge.engine.probe import ProbeResult, probe
    from agentmerge.evaluation.scoring import EvalRun, evaluate

_ON_FIRST_USE = {
    **dict.fromkeys(
        ("MergeConfig", "ModelSpec", "Override", "config_from_dict", "load_config"), "agentmerge.config.schema"
    ),
    "merge": "agentmerge.engine.merge",
    "MergeResult": "agentmerge.engine.merge",
    "probe": "agentmerge.engine.probe",
    "ProbeResult": "agentmerge.engine.probe",
    "evaluate": "agentmerge.evaluation.scoring",
    "EvalRun": "agentmerge.evaluation.scoring",
}


def __getattr__(name: str) -> Any:
    """The config, torch-backed names and results, imported when first asked for."""
    if name in _ON_FIRST_USE:
        return getattr(importlib.import_module(_ON_FIRST_USE[name]), name)
    raise AttributeError(f"module 'agentmerge' has no attribute {name!r}")


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
