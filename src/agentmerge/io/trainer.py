"""RL-trainer checkpoint folders read as models: verl FSDP actor folders (``verl``) and torch distributed
checkpoints (``dcp``); ``open_weights`` picks the reader, ``trainer_files`` tells the folders apart.
"""

from __future__ import annotations

from pathlib import Path

from agentmerge.io.checkpoint import Checkpoint, Readable
from agentmerge.io.dcp import DcpCheckpoint
from agentmerge.io.trainer_files import is_dcp, model_files_folder, verl_actor_folder
from agentmerge.io.verl import VerlCheckpoint

__all__ = ["DcpCheckpoint", "VerlCheckpoint", "open_weights", "trainer_config_folder"]


def open_weights(ref: str | Path) -> Readable:
    """Any weights folder: a verl actor folder (or the step folder holding ``actor/``), a DCP folder, else a
    Hugging Face folder or file (``Checkpoint``)."""
    path = Path(ref).expanduser()
    if verl_actor_folder(path) is not None:
        return VerlCheckpoint(ref)
    if is_dcp(path):
        return DcpCheckpoint(ref)
    return Checkpoint(ref)


def trainer_config_folder(ref: str | Path) -> Path | None:
    """The folder with a trainer checkpoint's config.json and tokenizer; None when ``ref`` is no trainer folder."""
    path = Path(ref).expanduser()
    actor = verl_actor_folder(path)
    if actor is not None:
        return model_files_folder(actor)
    return model_files_folder(path) if is_dcp(path) else None
