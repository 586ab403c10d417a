"""The exceptions agentmerge raises for bad input; each message names the file or tensor and what to do."""


class AgentMergeError(Exception):
    """Base class: the CLI prints these as one-line errors instead of tracebacks."""


class CheckpointError(AgentMergeError):
    """A model folder or weight file is missing, corrupt, hostile or inconsistent."""


class ConfigError(AgentMergeError):
    """The merge configuration is invalid (unknown method or parameter, value out of range...)."""


class MergeError(AgentMergeError):
    """The inputs cannot be merged together (different tensor sets, shapes, NaN values...)."""


def one_line(e: BaseException) -> str:
    """``TypeName: first line of its message`` (just ``TypeName`` for an empty one): a foreign error, in a line."""
    said = str(e).strip().splitlines()
    return f"{type(e).__name__}: {said[0]}" if said else type(e).__name__
