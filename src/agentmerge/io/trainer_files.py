"""Where a trainer checkpoint folder keeps what: verl rank files, DCP metadata, the Hugging Face files beside them.

Detection only (no weights are read here): ``verl_actor_folder``, ``is_dcp``, ``model_files_folder``.
"""

from __future__ import annotations

import re
from pathlib import Path

RANK_FILE = re.compile(r"^model_world_size_(\d+)_rank_(\d+)\.pt$")
HF_FOLDER = "huggingface"
DCP_METADATA = ".metadata"
MAX_METADATA_BYTES = 1 << 30
_DCP_META = "torch.distributed.checkpoint.metadata"
DCP_METADATA_GLOBALS = frozenset(
    {(_DCP_META, n) for n in ("Metadata", "TensorStorageMetadata", "TensorProperties", "ChunkStorageMetadata")}
    | {(_DCP_META, n) for n in ("BytesStorageMetadata", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")}
    | {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size")}
    | {("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath")}
)


def verl_actor_folder(path: Path) -> Path | None:
    """The folder holding verl's rank files: ``path`` itself or ``path/actor``; None when neither does."""
    for folder in (path, path / "actor"):
        try:
            if folder.is_dir() and any(RANK_FILE.match(p.name) for p in folder.iterdir()):
                return folder
        except OSError:  # unreadable: the plain reader names the problem
            return None
    return None


def is_dcp(path: Path) -> bool:
    """Whether ``path`` is a torch distributed checkpoint folder (``.metadata`` and ``.distcp`` files)."""
    return path.is_dir() and (path / DCP_METADATA).is_file() and any(path.glob("*.distcp"))


def model_files_folder(path: Path) -> Path:
    """Where a trainer folder's config.json is: ``huggingface/`` inside or beside it, itself, or its parent."""
    for folder in (path / HF_FOLDER, path, path.parent / HF_FOLDER, path.parent):
        if (folder / "config.json").is_file():
            return folder
    return path
