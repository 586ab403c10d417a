"""Hostile trainer folders (issue 23): verl rank files and torch distributed checkpoints.

Each case failed before its fix: a silent wrong read (duplicate or stray rank files, DCP metadata whose
pieces leave a gap or overlap: uninitialised memory in the output), a hang or side effect (a world size of
1e11 looped over, a rank file that is ``/dev/zero`` or a FIFO, a pickle that builds a ``DeviceMesh`` and so
starts ``init_process_group``), or a traceback (offsets past the end, sizes that overflow, a dtype given as a
string, ``chunks: None``, an empty ``.distcp``).
"""

from __future__ import annotations

import os
import pickle
import shutil
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.hostile import bounded_python, model_folder, not_a_file, one_line_error, within

from agentmerge.errors import CheckpointError
from agentmerge.io.formats.checkpoint import Checkpoint
from agentmerge.io.formats.dcp import DcpCheckpoint
from agentmerge.io.formats.open import open_weights
from agentmerge.io.formats.verl import VerlCheckpoint

STATE = {"model.embed_tokens.weight": (8, 4), "model.norm.weight": (4,)}


def state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g) for n, s in STATE.items()}


def _piece(t: torch.Tensor, world: int, rank: int) -> torch.Tensor:
    """FSDP's dim-0 piece of ``rank``: ``torch.chunk``, empty for the ranks past the rows."""
    pieces = t.chunk(world, 0)
    return pieces[rank].clone() if rank < len(pieces) else t.new_empty((0, *t.shape[1:]))


def verl_folder(root: Path, world: int = 2, names: dict[int, str] | None = None) -> Path:
    """An actor folder of plain-tensor rank files (``names`` renames some ranks' files)."""
    actor = root / "actor"
    actor.mkdir(parents=True)
    for rank in range(world):
        shard = {k: _piece(v, world, rank) for k, v in state().items()}
        name = (names or {}).get(rank, f"model_world_size_{world}_rank_{rank}.pt")
        torch.save(shard, actor / name)
    return actor


# --------------------------------------------------------------------------- verl


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ("model_world_size_2_rank_01.pt", ["rank_01", "leading zero"]),  # rank_1 twice, under two names
        ("model_world_size_02_rank_1.pt", ["world_size_02", "leading zero"]),
        ("model_world_size_2_rank_\u0661.pt", ["rank_\u0661", "digits"]),  # an Arabic-Indic one: int() reads 1
        ("model_world_size_2_rank_2.pt", ["rank 2", "0..1"]),  # a rank outside 0..W-1
        ("model_world_size_2_rank_7.pt", ["rank 7", "0..1"]),
    ],
)
def test_verl_stray_or_duplicate_rank_files_are_refused(tmp_path: Path, extra: str, words: list[str]) -> None:
    actor = verl_folder(tmp_path)
    shutil.copy(actor / "model_world_size_2_rank_1.pt", actor / extra)
    with pytest.raises(CheckpointError) as e:
        VerlCheckpoint(actor)
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize("world", [99_999_999_999, 10**200])
def test_verl_huge_world_size_is_refused_at_once(tmp_path: Path, world: int) -> None:
    actor = tmp_path / "actor"
    actor.mkdir()
    torch.save(state(), actor / f"model_world_size_{world}_rank_0.pt")
    with within(10), pytest.raises(CheckpointError, match="world size"):
        VerlCheckpoint(actor)


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "folder"])
def test_verl_rank_file_that_is_not_a_regular_file_is_refused_without_reading(tmp_path: Path, kind: str) -> None:
    actor = tmp_path / "actor"
    actor.mkdir()
    not_a_file(actor / "model_world_size_1_rank_0.pt", kind)
    out = bounded_python(
        "from agentmerge.io.formats.open import open_weights\n"
        "from agentmerge.errors import CheckpointError\n"
        f"try:\n    open_weights({str(actor)!r})\nexcept CheckpointError as e:\n    print('refused:', e)\n",
        timeout=120,
    )
    assert "refused:" in out and "not a regular file" in out, out


class _BuildsAMesh:
    """Pickles as ``DeviceMesh("cpu", [0, 1])``: a constructor call, which would start a process group."""

    def __reduce__(self) -> tuple[Any, ...]:
        from torch.distributed.device_mesh import DeviceMesh

        return (DeviceMesh, ("cpu", [0, 1]))


def test_the_loaded_device_mesh_is_always_the_inert_one() -> None:
    """torch's own allowlist maps DeviceMesh's name to the real class too; during our loads only ours counts
    (checked in a fresh interpreter too: there the first load imports torch.distributed.tensor, which adds it)."""
    out = bounded_python(
        "from torch import _weights_only_unpickler as unpickler\n"
        "from agentmerge.io.formats import verl\n"
        "with verl._only_dtensor_globals():\n"
        "    mapped = unpickler._get_user_allowed_globals()['torch.distributed.device_mesh.DeviceMesh']\n"
        "print('inert:', mapped is verl._saved_mesh())\n"
    )
    assert "inert: True" in out, out
    import torch.distributed.tensor  # adds the real DeviceMesh to torch's process-wide allowlist
    from torch import _weights_only_unpickler as unpickler

    from agentmerge.io.formats import verl

    before = torch.serialization.get_safe_globals()
    for _ in range(20):  # the set order that decided it changed from run to run
        with verl._only_dtensor_globals():
            mapped = unpickler._get_user_allowed_globals()["torch.distributed.device_mesh.DeviceMesh"]
            assert mapped is verl._saved_mesh()
    after = torch.serialization.get_safe_globals()
    assert len(after) == len(before) and all(g in after for g in before)  # put back as it was


def test_a_pickle_that_builds_a_device_mesh_never_starts_a_process_group(tmp_path: Path) -> None:
    actor = tmp_path / "actor"
    actor.mkdir()
    torch.save({"model.norm.weight": torch.ones(4), "mesh": _BuildsAMesh()}, actor / "model_world_size_1_rank_0.pt")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}
    out = bounded_python(
        "import torch.distributed as dist\n"
        "from agentmerge.io.formats.open import open_weights\n"
        "from agentmerge.errors import CheckpointError\n"
        f"try:\n    open_weights({str(actor)!r})\nexcept CheckpointError as e:\n    print('refused:', e)\n"
        "print('initialized:', dist.is_initialized())\n",
        timeout=120,
        env=env,
    )
    assert "refused:" in out and "DeviceMesh" in out and "initialized: False" in out, out


# --------------------------------------------------------------------------- DCP


def dcp_folder(root: Path) -> Path:
    import torch.distributed.checkpoint as dcp

    folder = root / "dcp"
    dcp.save(state(), checkpoint_id=folder, no_dist=True)
    return folder


def edit_metadata(folder: Path, change: Callable[[Any], None]) -> Path:
    """Rewrite ``.metadata`` after ``change(metadata)`` (the test's own pickle, read back by ours)."""
    with open(folder / ".metadata", "rb") as f:
        md = pickle.load(f)  # our own file, just written by dcp.save
    change(md)
    with open(folder / ".metadata", "wb") as f:
        pickle.dump(md, f)
    return folder


EMBED = "model.embed_tokens.weight"


def _tensor(md: Any) -> Any:
    return md.state_dict_metadata[EMBED]


def _grow(md: Any) -> None:
    """The tensor said to have 12 rows; its one piece covers 8: rows 8..11 would be left unwritten."""
    _tensor(md).size = torch.Size([12, 4])


def _overlap_and_gap(md: Any) -> None:
    """Pieces rows 0..7 and 4..11 of a 16-row tensor: 64 elements as it needs, rows 4..7 twice, 12..15 never."""
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex

    t = _tensor(md)
    t.size = torch.Size([16, 4])
    t.chunks = [
        ChunkStorageMetadata(torch.Size([0, 0]), torch.Size([8, 4])),
        ChunkStorageMetadata(torch.Size([4, 0]), torch.Size([8, 4])),
    ]
    item = md.storage_data[MetadataIndex(EMBED, torch.Size([0, 0]))]
    md.storage_data[MetadataIndex(EMBED, torch.Size([4, 0]))] = item


def _chunk(offsets: Any, sizes: Any) -> Callable[[Any], None]:
    def change(md: Any) -> None:
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

        _tensor(md).chunks = [ChunkStorageMetadata(offsets, sizes)]

    return change


def _set(what: str, value: Any) -> Callable[[Any], None]:
    def change(md: Any) -> None:
        if what == "dtype":
            _tensor(md).properties.dtype = value
        elif what == "size":
            _tensor(md).size = value
        elif what == "chunks":
            _tensor(md).chunks = value
        else:
            for item in md.storage_data.values():
                setattr(item, what, value)

    return change


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (_grow, ["cover", "rows"]),
        (_overlap_and_gap, ["twice"]),
        (_chunk(torch.Size([6, 0]), torch.Size([8, 4])), ["past"]),  # a piece past the end of the tensor
        (_chunk(torch.Size([0, 0]), torch.Size([8])), ["dimensions"]),
        (_chunk([0, -1], [8, 4]), ["offsets"]),
        (_chunk([0.0, 0.0], [8, 4]), ["offsets"]),
        (_set("size", torch.Size([2**62, 2**62])), ["size"]),  # overflows int64 once multiplied
        (_set("size", torch.Size([2**40, 4])), ["size"]),
        (_set("dtype", "float32"), ["dtype"]),
        (_set("dtype", torch.complex64), ["dtype"]),
        (_set("chunks", None), ["chunks"]),
        (_set("chunks", []), ["cover"]),
        (_set("offset", 10**9), ["past the end"]),  # a piece's bytes past the end of its .distcp file
        (_set("length", -5), ["length"]),
        (_set("relative_path", 7), ["data file"]),
        (_set("relative_path", "nope.distcp"), ["nope.distcp"]),
    ],
)
def test_dcp_metadata_that_does_not_prove_exact_coverage_is_refused_before_any_read(
    tmp_path: Path, change: Callable[[Any], None], words: list[str]
) -> None:
    folder = edit_metadata(dcp_folder(tmp_path), change)
    with pytest.raises(CheckpointError) as e, DcpCheckpoint(folder) as ckpt:
        for name in ckpt.tensors:
            ckpt.read(name)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_dcp_gap_is_not_converted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = edit_metadata(dcp_folder(tmp_path), _overlap_and_gap)
    out = tmp_path / "out"
    one_line_error(["convert", str(folder), str(out)], capsys, str(folder))
    assert not out.exists()


@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage"])
def test_damaged_distcp_is_one_line(tmp_path: Path, damage: str, capsys: pytest.CaptureFixture[str]) -> None:
    folder = dcp_folder(tmp_path)
    data = folder / "__0_0.distcp"
    raw = data.read_bytes()
    data.write_bytes(
        b"" if damage == "empty" else raw[: len(raw) // 2] if damage == "truncated" else b"\x00" * len(raw)
    )
    out = tmp_path / "out"
    one_line_error(["convert", str(folder), str(out)], capsys, "distcp")
    assert not out.exists()


@pytest.mark.parametrize("name", [".metadata", "__0_0.distcp"])
def test_dcp_files_that_are_fifos_are_refused_without_hanging(tmp_path: Path, name: str) -> None:
    folder = dcp_folder(tmp_path)
    (folder / name).unlink()
    os.mkfifo(folder / name)
    out = bounded_python(
        "from agentmerge.io.formats.dcp import DcpCheckpoint\n"
        "from agentmerge.errors import CheckpointError\n"
        f"try:\n    c = DcpCheckpoint({str(folder)!r})\n    [c.read(n) for n in c.tensors]\n"
        "except CheckpointError as e:\n    print('refused:', e)\n",
        timeout=120,
    )
    assert "refused:" in out and "not a regular file" in out, out


def test_good_trainer_folders_still_read_exactly(tmp_path: Path) -> None:
    want = state()
    for ckpt in (VerlCheckpoint(verl_folder(tmp_path / "v", world=3)), DcpCheckpoint(dcp_folder(tmp_path))):
        with ckpt:
            assert set(ckpt.tensors) == set(want)
            for name, t in want.items():
                assert torch.equal(ckpt.read(name).view(t.shape), t)


def test_a_plain_folder_is_not_taken_for_a_trainer_folder(tmp_path: Path) -> None:
    folder = model_folder(tmp_path / "m", 0)
    assert isinstance(open_weights(folder), Checkpoint)
