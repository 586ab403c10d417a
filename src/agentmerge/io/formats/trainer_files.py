"""How RL-trainer checkpoint folders are laid out, and how agentmerge tells them apart from model folders.

- **verl FSDP**: ``actor/model_world_size_W_rank_R.pt`` for ``R = 0 .. W-1`` (``huggingface/`` beside them
  with config.json and the tokenizer). verl writes W and R in ASCII digits with no leading zero; a file
  named like a rank file that does not follow that (``rank_01``, ``rank_١``, ``rank_1 (copy)``) is refused
  by name, so two files can never claim one rank (``rank_01`` next to ``rank_1``).
- **torch distributed checkpoints (DCP)**: a folder with ``.metadata`` and ``__R_I.distcp`` data files.

Both keep config.json in ``huggingface/`` inside or beside the weights, or in the folder itself or its parent.
"""

from __future__ import annotations

import re
from pathlib import Path

RANK_FILE = re.compile(r"^model_world_size_(0|[1-9][0-9]*)_rank_(0|[1-9][0-9]*)\.pt$")
RANK_LIKE = re.compile(r"^model_world_size_.*_rank_.*\.pt$", re.DOTALL)  # what a rank file's name looks like
HF_FOLDER = "huggingface"
DCP_METADATA = ".metadata"


def verl_actor_folder(path: Path) -> Path | None:
    """The folder holding verl's rank files: ``path`` itself or ``path/actor``; None when neither does."""
    for folder in (path, path / "actor"):
        try:
            if folder.is_dir() and any(RANK_LIKE.match(p.name) for p in folder.iterdir()):
                return folder
        except OSError:  # unreadable: the plain reader names the problem
            return None
    return None


def is_dcp(path: Path) -> bool:
    """Whether ``path`` is a torch distributed checkpoint folder (``.metadata`` and ``.distcp`` files).

    Anything named ``.metadata`` counts (a FIFO or a link too), so that the DCP reader, not the plain one,
    names what is wrong with it.
    """
    try:
        return path.is_dir() and (path / DCP_METADATA).exists() and any(path.glob("*.distcp"))
    except OSError:
        return False


def model_files_folder(path: Path) -> Path:
    """Where a trainer folder's config.json is: ``huggingface/`` inside or beside it, itself, or its parent."""
    for folder in (path / HF_FOLDER, path, path.parent / HF_FOLDER, path.parent):
        if (folder / "config.json").is_file():
            return folder
    return path
