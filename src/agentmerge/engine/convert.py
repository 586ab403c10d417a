"""``agentmerge convert SRC DST``: any readable input written as a plain Hugging Face safetensors folder.

SRC is anything the merge reads (``io.formats.open.open_model``): a verl actor folder, a torch distributed
checkpoint, a safetensors or ``pytorch_model.bin`` folder, or ``MODEL+ADAPTER`` (a LoRA adapter applied to
its model). Tensors are copied chunk by chunk (``CHUNK`` elements), cast once to ``dtype`` (floating tensors
only; ``keep`` writes the stored dtype), into shards planned up front by ``shards.plan_shards``, inside a
hidden folder renamed into place when complete. config.json and generation_config.json come from where SRC
keeps them (``huggingface/`` for verl), the tokenizer from there or a ``tokenizer/`` beside SRC. DST must be
new or empty and may not be, hold or lie inside SRC.
"""

from __future__ import annotations

from pathlib import Path

import torch

from agentmerge.engine.coverage import check_written
from agentmerge.errors import CheckpointError
from agentmerge.io.formats.checkpoint import Readable
from agentmerge.io.formats.lora import LoraModel, split_model_plus_adapter
from agentmerge.io.formats.open import open_model
from agentmerge.io.formats.tensorfile import dtype_from_name
from agentmerge.io.guards.finite import check_finite
from agentmerge.io.guards.safety import check_output_target
from agentmerge.io.guards.units import TOKENIZER_FILES, parse_size
from agentmerge.io.output.atomic import atomic_output_dir
from agentmerge.io.output.shards import PlannedTensor, plan_shards
from agentmerge.io.output.writer import ShardWriter, finish_model_files

CHUNK = 1 << 20
DTYPES = {"keep": None, "bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def convert(
    src: str | Path,
    dst: str | Path,
    *,
    dtype: str = "keep",
    max_shard_size: str | int = "5GB",
    model_files: str | Path | None = None,
) -> Path:
    """Write ``src`` as a safetensors folder at ``dst``; returns ``dst`` resolved.

    ``model_files`` is the folder to take config.json and the tokenizer from (default: found beside ``src``).
    """
    out = Path(dst)
    check_output_target(out, [*(split_model_plus_adapter(str(src)) or [src]), model_files])
    target = _target_dtype(dtype)
    reader = open_model(str(src), None)
    try:
        planned = [_planned(reader, name, target) for name in reader.tensors]
        host = reader.host if isinstance(reader, LoraModel) else reader  # an adapter's config is its model's
        source = Path(model_files) if model_files is not None else host.folder
        if not (source / "config.json").is_file():
            raise CheckpointError(
                f"{src}: no config.json found for it (looked in {source}); pass the folder that has it (--model-files)"
            )
        with atomic_output_dir(out) as tmp:
            writer = ShardWriter(tmp, plan_shards(planned, parse_size(max_shard_size)), planned)
            try:
                for t in planned:
                    _copy(reader, t, writer)
            finally:
                writer.close()
            check_written(tmp, planned)  # every tensor of the input, as planned
            finish_model_files(tmp, source, _tokenizer_folder(source, reader.path), _dtype_record(planned, target))
    finally:
        reader.close()
    return out.resolve()


def _target_dtype(name: str) -> torch.dtype | None:
    key = name.lower()
    if key in DTYPES:
        return DTYPES[key]
    try:
        return dtype_from_name(name)
    except ValueError:
        raise CheckpointError(f"--dtype {name}: use one of {', '.join(DTYPES)}") from None


def _planned(reader: Readable, name: str, target: torch.dtype | None) -> PlannedTensor:
    info = reader.tensors[name]
    floating = info.dtype.is_floating_point
    return PlannedTensor(name, target if floating and target is not None else info.dtype, info.shape)


def _copy(reader: Readable, t: PlannedTensor, writer: ShardWriter) -> None:
    """Copy tensor ``t`` chunk by chunk, cast once; a non-finite value stops the conversion, naming the tensor."""
    numel = reader.tensors[t.name].numel
    for start in range(0, numel, CHUNK):
        values = check_finite(
            f"{reader.path}: tensor {t.name!r}", reader.read(t.name, start, min(start + CHUNK, numel)), start
        )
        writer.write(t.name, start, values.to(t.dtype))


def _tokenizer_folder(source: Path, src: Path) -> Path:
    """The config's folder when it holds a tokenizer, else a ``tokenizer/`` beside the source (NeMo RL's layout)."""
    for folder in (source, src.parent / "tokenizer", src / "tokenizer"):
        if any((folder / n).is_file() for n in TOKENIZER_FILES):
            return folder
    return source


def _dtype_record(planned: list[PlannedTensor], target: torch.dtype | None) -> str | None:
    """The dtype config.json records: the target, or with ``keep`` the floating tensors' single dtype."""
    if target is not None:
        return str(target).removeprefix("torch.")
    kinds = {t.dtype for t in planned if t.dtype.is_floating_point}
    return str(kinds.pop()).removeprefix("torch.") if len(kinds) == 1 else None
