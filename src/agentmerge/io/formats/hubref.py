"""Hugging Face Hub references: ``org/name`` or ``org/name@revision``, told apart from local paths.

A reference is a hub reference when no such local path exists (a local folder always wins, so a folder
named ``ckpt@v2`` keeps working) and it reads ``REPO_ID`` or ``REPO_ID@REVISION``: the repository id is
``owner/name`` and the revision a branch, tag or commit (``main``, ``v1.0``, ``refs/pr/3``, a 40-digit
hash), as in mergekit's ``model@revision``. The Hub itself names models by id only, so the model card
lists ids without their revision; merge.json records the commit each revision resolved to, read from the
Hugging Face cache's layout (``.../snapshots/<commit>/``). No torch here: the config checks use it too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}$")  # the Hub's names: at most 96 characters each
_REVISION = re.compile(r"^[\w.-]+(?:/[\w.-]+)*$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


@dataclass(frozen=True)
class HubRef:
    """A Hub repository and, optionally, the revision to fetch (None: the default branch)."""

    repo_id: str
    revision: str | None = None

    def __str__(self) -> str:
        return self.repo_id if self.revision is None else f"{self.repo_id}@{self.revision}"


def split_revision(ref: str) -> HubRef | None:
    """``org/name[@rev]`` -> ``HubRef`` by its shape alone (None when it is not shaped like one)."""
    repo, at, rev = str(ref).partition("@")
    if not HUB_ID.match(repo):
        return None
    if not at:
        return HubRef(repo)
    return HubRef(repo, rev) if _REVISION.match(rev) and ".." not in rev else None


def parse_hub_ref(ref: str | Path) -> HubRef | None:
    """The Hub reference ``ref`` names, or None when it is a local path (existing ones win) or no hub id."""
    try:
        if Path(ref).expanduser().exists():
            return None
    except (OSError, ValueError):  # too long for a file name, or a NUL: no local path, and no hub id either
        return None
    return split_revision(str(ref))


def is_hub_ref(ref: str | Path) -> bool:
    """Whether ``ref`` names a Hub repository (``org/name`` or ``org/name@rev``) and no local path."""
    return parse_hub_ref(ref) is not None


def hub_repo_id(ref: str | Path) -> str | None:
    """The repository id of a Hub reference, without its revision (what the Hub's ``base_model`` takes)."""
    hub = parse_hub_ref(ref)
    return None if hub is None else hub.repo_id


def snapshot_commit(folder: Path) -> str | None:
    """The commit a Hugging Face cache snapshot folder holds (``snapshots/<40 hex digits>``), else None."""
    if folder.parent.name == "snapshots" and _COMMIT.match(folder.name):
        return folder.name
    return None
