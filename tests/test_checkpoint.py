"""Checkpoint I/O: header parsing, chunk reads, shard planning, writing, atomic output folders."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from agentmerge.errors import CheckpointError
from agentmerge.io.formats.checkpoint import Checkpoint
from agentmerge.io.formats.tensorfile import read_safetensors_header
from agentmerge.io.guards.units import parse_size
from agentmerge.io.output import writer as writer_module
from agentmerge.io.output.atomic import atomic_output_dir
from agentmerge.io.output.shards import PlannedTensor, plan_shards
from agentmerge.io.output.writer import ShardWriter


def tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "a": torch.randn(5, 7, generator=g).bfloat16(),
        "b": torch.randn(11, generator=g),
        "c": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "d": torch.randn(3, 3, generator=g).half(),
    }


def test_header_matches_safetensors(tmp_path: Path) -> None:
    t = tensors()
    save_file(t, tmp_path / "m.safetensors")
    infos = read_safetensors_header(tmp_path / "m.safetensors")
    assert {n: (i.dtype, i.shape) for n, i in infos.items()} == {n: (v.dtype, tuple(v.shape)) for n, v in t.items()}


@pytest.mark.parametrize("start,stop", [(0, None), (3, 17), (34, 35), (0, 0)])
def test_chunk_reads(tmp_path: Path, start: int, stop: int | None) -> None:
    t = tensors()
    save_file(t, tmp_path / "model.safetensors")
    with Checkpoint(tmp_path) as ckpt:
        for name, v in t.items():
            end = v.numel() if stop is None else min(stop, v.numel())
            s = min(start, end)
            assert torch.equal(ckpt.read(name, s, end), v.reshape(-1)[s:end])


def test_sharded_and_bin_inputs(tmp_path: Path) -> None:
    t = tensors()
    (tmp_path / "s").mkdir()
    save_file({"a": t["a"], "b": t["b"]}, tmp_path / "s" / "x-1.safetensors")
    save_file({"c": t["c"], "d": t["d"]}, tmp_path / "s" / "x-2.safetensors")
    index = {
        "weight_map": {"a": "x-1.safetensors", "b": "x-1.safetensors", "c": "x-2.safetensors", "d": "x-2.safetensors"}
    }
    (tmp_path / "s" / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "p").mkdir()
    torch.save(t, tmp_path / "p" / "pytorch_model.bin")
    for folder in ("s", "p"):
        with Checkpoint(tmp_path / folder) as ckpt:
            assert set(ckpt.tensors) == set(t)
            for name, v in t.items():
                assert torch.equal(ckpt.read(name).reshape(v.shape), v)


def test_parse_size() -> None:
    assert parse_size("2GB") == 2 * 10**9
    assert parse_size("512MiB") == 512 * 2**20
    assert parse_size("1.5kb") == 1500
    assert parse_size(77) == 77
    with pytest.raises(ValueError, match="5GB"):
        parse_size("lots")


def planned() -> list[PlannedTensor]:
    return [PlannedTensor(f"t{i}", torch.bfloat16, (10 * (i + 1),)) for i in range(6)] + [
        PlannedTensor("big", torch.float32, (100,))
    ]


@pytest.mark.parametrize("limit", [1, 50, 120, 400, 10**9])
def test_plan_shards_respects_limit_and_order(limit: int) -> None:
    plans = plan_shards(planned(), limit)
    names = [n for p in plans for n in sorted(p.offsets, key=lambda n: int(n[1:]) if n[1:].isdigit() else 99)]
    assert sorted(names) == sorted(t.name for t in planned())
    sizes = {t.name: t.nbytes for t in planned()}
    for p in plans:
        data = sum(sizes[n] for n in p.offsets)
        assert data <= limit or len(p.offsets) == 1
        assert p.size == len(p.header) + data
        for _n, off in p.offsets.items():
            assert off % 2 == 0 and off >= len(p.header)
    if len(plans) == 1:
        assert plans[0].file_name == "model.safetensors"
    else:
        assert plans[-1].file_name == f"model-{len(plans):05d}-of-{len(plans):05d}.safetensors"


@pytest.mark.parametrize("early_writeback", [False, True])
def test_writer_chunks_in_any_order_load_with_safetensors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, early_writeback: bool
) -> None:
    want = {t.name: torch.randn(t.shape).to(t.dtype) for t in planned()}
    plans = plan_shards(planned(), 120)
    started: list[int] = []
    if early_writeback:  # writeback asked for every 20 bytes written (Linux: sync_file_range)
        monkeypatch.setattr(writer_module, "WRITEBACK_BYTES", 20)
        real = writer_module._writeback_starter()
        assert real is not None or sys.platform != "linux"
        monkeypatch.setattr(
            writer_module, "_writeback_starter", lambda: lambda fd: (started.append(fd), real and real(fd))
        )
    writer = ShardWriter(tmp_path, plans, planned())
    for name, v in reversed(list(want.items())):
        flat = v.reshape(-1)
        for s in reversed(range(0, flat.numel(), 7)):
            writer.write(name, s, flat[s : s + 7])
    writer.close()
    got: dict[str, torch.Tensor] = {}
    for p in plans:
        got.update(load_file(tmp_path / p.file_name))
    assert all(torch.equal(got[n], v) for n, v in want.items())
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(want)
    assert len(set(started)) == (len(plans) if early_writeback else 0)


def test_atomic_output_dir_cleans_up_on_failure(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(RuntimeError), atomic_output_dir(out) as tmp:
        (tmp / "half.bin").write_bytes(b"x")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    with atomic_output_dir(out) as tmp:
        (tmp / "done").write_text("ok")
    assert (out / "done").read_text() == "ok" and [p.name for p in tmp_path.iterdir()] == ["out"]


def test_stale_temporary_folders_are_removed(tmp_path: Path) -> None:
    stale = tmp_path / ".out.tmp-999999999-abcd"
    stale.mkdir()
    with atomic_output_dir(tmp_path / "out"):
        pass
    assert not stale.exists()


def test_hub_id_offline_names_the_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointError, match="some-org/some-model"):
        Checkpoint("some-org/some-model")


def test_missing_local_path_is_not_treated_as_hub_id(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no such file or folder"):
        Checkpoint(tmp_path / "nowhere" / "model")
