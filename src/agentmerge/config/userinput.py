"""What users type: YAML files read safely, and names checked with a "did you mean" suggestion."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentmerge.config.limits import read_config_yaml


def did_you_mean(word: str, options: Sequence[str]) -> str:
    """``" (did you mean 'ram_plus'?)"`` when a close option exists, else ``""``."""
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def read_yaml(path: Path) -> Any:
    """Parse a YAML file safely (no code-running tags), within ``limits``' bounds; failures: ``ConfigError``."""
    return read_config_yaml(path)
