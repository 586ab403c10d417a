"""RL-trainer checkpoint folders read as models: verl FSDP actor folders and torch distributed checkpoints.

``open_weights`` opens any weights folder with the reader its layout calls for (``trainer_files``): verl
rank files (``verl.VerlCheckpoint``), a DCP folder (``dcp.DcpCheckpoint``), a ``.gguf`` file or a folder
holding one (``gguf_read.GgufCheckpoint``), else a Hugging Face folder or file (``Checkpoint``). Both trainer
readers keep the stored dtype (verl's fp32 master weights stay fp32); the merge casts its output to the base's.
Hostile folders are refused before any tensor is read: stray or duplicate rank files, world sizes the files do
not match, devices or FIFOs in place of files, pickles that would build a process group, DCP metadata whose
pieces do not cover each tensor exactly once.
"""

from __future__ import annotations

from pathlib import Path

from agentmerge.io.formats.checkpoint import Checkpoint, Readable
from agentmerge.io.formats.dcp import DcpCheckpoint, read_dcp_metadata
from agentmerge.io.formats.gguf_read import GgufCheckpoint, is_gguf
from agentmerge.io.formats.trainer_files import RANK_FILE, is_dcp, model_files_folder, verl_actor_folder
from agentmerge.io.formats.verl import VerlCheckpoint, dtensor_globals, load_rank_file

__all__ = [
    "RANK_FILE",
    "DcpCheckpoint",
    "VerlCheckpoint",
    "dtensor_globals",
    "is_dcp",
    "load_rank_file",
    "model_files_folder",
    "open_weights",
    "read_dcp_metadata",
    "trainer_config_folder",
    "verl_actor_folder",
]


def open_weights(ref: str | Path) -> Readable:
    """Any weights folder: a verl actor folder (or the step folder holding ``actor/``), a DCP folder, a GGUF file
    (or a folder holding one), else a Hugging Face folder or file (``Checkpoint``)."""
    path = Path(ref).expanduser()
    if verl_actor_folder(path) is not None:
        return VerlCheckpoint(ref)
    if is_dcp(path):
        return DcpCheckpoint(ref)
    if is_gguf(path):
        return GgufCheckpoint(ref)
    return Checkpoint(ref)


def trainer_config_folder(ref: str | Path) -> Path | None:
    """The folder with a trainer checkpoint's (or a GGUF file's recovered) config.json and tokenizer; None when
    ``ref`` is neither."""
    path = Path(ref).expanduser()
    if is_gguf(path):
        with GgufCheckpoint(ref) as gguf:
            return gguf.folder
    actor = verl_actor_folder(path)
    if actor is not None:
        return model_files_folder(actor)
    return model_files_folder(path) if is_dcp(path) else None
