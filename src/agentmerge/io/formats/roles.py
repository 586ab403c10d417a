"""What a model folder or file is for, checked before it is read: model weights, a Fisher file, a tokenizer source.

- ``check_fisher_role``: a Fisher file (``agentmerge fisher``'s output, marked ``FISHER_MARK`` in its safetensors
  ``__metadata__``) is never read as a model, and a model never as a Fisher file.
- ``check_tokenizer_source``: a ``tokenizer_source`` must be a model folder that holds tokenizer files.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from agentmerge.errors import CheckpointError, ConfigError
from agentmerge.io.formats.checkpoint import Checkpoint, resolve_model_path
from agentmerge.io.guards.units import TOKENIZER_FILES

FISHER_MARK = ("agentmerge", "fisher")  # (key, value) in the safetensors __metadata__ of every Fisher file


def is_fisher(metadata: Mapping[str, str]) -> bool:
    return metadata.get(FISHER_MARK[0]) == FISHER_MARK[1]


def check_fisher_role(ckpt: Checkpoint, fisher: bool) -> None:
    """A Fisher file given as a model, or a model given as a Fisher file, is refused."""
    marked = any(is_fisher(m) for m in ckpt.metadata.values())
    if fisher and not marked:
        raise CheckpointError(
            f"{ckpt.path}: not a Fisher file made by `agentmerge fisher` (no {FISHER_MARK[0]}={FISHER_MARK[1]} "
            "metadata); pass the folder `agentmerge fisher --out` wrote"
        )
    if not fisher and marked:
        raise CheckpointError(
            f"{ckpt.path}: is a Fisher file (from `agentmerge fisher`), not model weights; "
            "pass it with --fisher (fisher: PATH), and the model itself as the model"
        )


def check_tokenizer_source(ref: str) -> Path:
    """The tokenizer source's folder; ``ConfigError`` when it is missing, not a folder or holds no tokenizer."""
    folder = resolve_model_path(ref)
    if not folder.is_dir():
        raise ConfigError(f"tokenizer_source {ref}: not a folder; give the model folder whose tokenizer to copy")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(
            f"tokenizer_source {ref}: holds no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}...); "
            "the output would have no tokenizer; give a model folder that has one"
        )
    return folder
