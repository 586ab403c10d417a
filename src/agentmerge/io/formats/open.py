"""The one way in: any model reference opened as a ``checkpoint.Readable``, with the reader its layout calls for.

``open_model(ref, base)`` opens what a command is given as a model: mergekit's ``MODEL+ADAPTER`` (the adapter on
that model), a PEFT LoRA adapter folder (``lora.LoraModel``, read on ``base``), else ``open_weights(ref)``: a verl
FSDP actor folder (``verl.VerlCheckpoint``; rank files told apart by ``trainer_files``), a torch distributed
checkpoint (``dcp.DcpCheckpoint``), a ``.gguf`` file or a folder holding one (``gguf_read.GgufCheckpoint``), else
a Hugging Face folder, file or Hub id (``checkpoint.Checkpoint``). Trainer readers keep the stored dtype (verl's
fp32 master weights stay fp32); the merge casts its output to the base's. Hostile folders are refused before any
tensor is read: stray or duplicate rank files, world sizes the files do not match, devices or FIFOs in place of
files, pickles that would build a process group, DCP metadata whose pieces do not cover each tensor exactly once.
``trainer_config_folder`` says where a trainer checkpoint's (or a GGUF file's) config.json and tokenizer lie.
"""

from __future__ import annotations

from pathlib import Path

from agentmerge.errors import CheckpointError, MergeError
from agentmerge.io.formats.checkpoint import Checkpoint, Readable
from agentmerge.io.formats.dcp import DcpCheckpoint
from agentmerge.io.formats.gguf_read import GgufCheckpoint, is_gguf
from agentmerge.io.formats.localpath import is_adapter
from agentmerge.io.formats.lora import LoraModel, split_model_plus_adapter
from agentmerge.io.formats.trainer_files import is_dcp, model_files_folder, verl_actor_folder
from agentmerge.io.formats.verl import VerlCheckpoint


def open_model(ref: str, base: Readable | None) -> Readable:
    """Any model reference: what ``open_weights`` opens, a LoRA adapter folder (read on ``base``), or mergekit's
    ``MODEL+ADAPTER`` (the adapter on that model)."""
    pair = split_model_plus_adapter(ref)
    if pair is not None:
        host = open_weights(pair[0])
        try:
            return LoraModel(pair[1], host, owns_host=True)
        except BaseException:
            host.close()
            raise
    if "+" in ref and not Path(ref).expanduser().exists():
        adapter = ref.rpartition("+")[2]
        raise CheckpointError(
            f"{ref}: read as MODEL+ADAPTER, but {adapter} is not a local LoRA adapter folder (adapter_config.json); "
            "download the adapter first"
        )
    if is_adapter(ref):
        if base is None:
            raise MergeError(f"{ref}: a LoRA adapter is merged against its base model; pass the base (--base)")
        return LoraModel(ref, base)
    return open_weights(ref)


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
