"""agentmerge: merge RL-trained agent checkpoints of one base model, probe their task vectors.

from agentmerge import MergeConfig, ModelSpec, merge, probe
cfg = MergeConfig(method="ram_plus", base="base", models=[ModelSpec(path="a1"), ModelSpec(path="a2")])
result = merge(cfg, "merged")
report = probe("base", ["a1", "a2"])
"""

__version__ = "0.1.0"

from agentmerge.config import MergeConfig, ModelSpec, Override, config_from_dict, load_config
from agentmerge.errors import AgentMergeError, CheckpointError, ConfigError, MergeError
from agentmerge.merge import MergeResult, merge
from agentmerge.probe import ProbeResult, probe
from agentmerge.registry import METHODS

__all__ = [
    "METHODS",
    "AgentMergeError",
    "CheckpointError",
    "ConfigError",
    "MergeConfig",
    "MergeError",
    "MergeResult",
    "ModelSpec",
    "Override",
    "ProbeResult",
    "__version__",
    "config_from_dict",
    "load_config",
    "merge",
    "probe",
]
