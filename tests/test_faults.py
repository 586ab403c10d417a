"""Faults and hostile input: kills at random moments, full disks, code-carrying pickles, hostile headers,
escaping links and names, and bit-identical output whatever the threads, shards and chunks."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import random
import resource
import shutil
import signal
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from agentmerge import MergeConfig, ModelSpec, merge
from agentmerge.errors import CheckpointError
from agentmerge.io.formats.checkpoint import Checkpoint
from agentmerge.io.formats.tensorfile import read_safetensors_header
from agentmerge.io.output.shards import PlannedTensor, plan_shards
from agentmerge.io.output.writer import copy_aux_files

SRC = Path(__file__).resolve().parents[1] / "src" / "agentmerge"


@pytest.fixture(autouse=True)
def _private_hash_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Input hashes are cached under the test's folder, not in the home directory."""
    monkeypatch.setenv("AGENTMERGE_CACHE", str(tmp_path / "hash-cache"))


def digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


def weights(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def in_child(fn: Callable[[], None]) -> int:
    """Run ``fn`` in a forked child; return its pid (exit 0 on success, 3 on an exception)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            fn()
        except BaseException:
            code = 3
        os._exit(code)
    return pid


# --------------------------------------------------------------------------- interruption


@pytest.fixture(scope="module")
def medium_family(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    """A base and three sparse agents, 24 tensors of 16K elements each (written directly: fast)."""
    root = tmp_path_factory.mktemp("medium")
    g = torch.Generator().manual_seed(1)
    base = {f"model.layers.{i}.w{j}.weight": torch.randn(128, 128, generator=g) for i in range(8) for j in range(3)}
    folders = []
    for k, density in enumerate([None, 0.05, 0.4, 0.5]):
        folder = root / ("base" if density is None else f"agent{k - 1}")
        folder.mkdir()
        tensors = {}
        for name, t in base.items():
            if density is not None:
                t = t + torch.where(
                    torch.rand(t.shape, generator=g) < density, 0.01 * torch.randn(t.shape, generator=g), 0
                )
            tensors[name] = t.bfloat16()
        save_file(tensors, folder / "model.safetensors")
        (folder / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
        folders.append(folder)
    return folders[0], folders[1:]


def test_sigkill_at_random_moments_leaves_absent_or_complete(
    medium_family: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    base, agents = medium_family
    inputs_before = {str(p): digest(p) for p in [base, *agents]}
    cfg = MergeConfig(
        method="ram_plus",
        base=str(base),
        models=[ModelSpec(path=str(a)) for a in agents],
        chunk_size=1024,
        threads=2,
        max_shard_size="200KB",
    )
    ref = tmp_path / "reference"
    merge(cfg, ref, quiet=True)
    expected = weights(ref)
    out = tmp_path / "out"
    t0 = time.perf_counter()
    pid = in_child(lambda: merge(cfg, out, quiet=True))
    os.waitpid(pid, 0)
    full = time.perf_counter() - t0
    shutil.rmtree(out)
    rng = random.Random(1234)
    outcomes = {"absent": 0, "complete": 0, "replacing": 0}
    for i in range(int(os.environ.get("AGENTMERGE_FAULT_KILLS", "20"))):
        replacing = out.exists()  # odd rounds keep a complete output, so --force replacement gets killed too
        pid = in_child(lambda: merge(cfg, out, quiet=True, force=True))
        time.sleep(rng.uniform(0.0, full * 1.1))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        if out.exists():
            assert (out / "merge.json").exists() and (out / "README.md").exists()
            got = weights(out)
            assert got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in got)
            outcomes["complete"] += 1
            if i % 2 == 0:
                shutil.rmtree(out)
        else:
            outcomes["absent"] += 1
        outcomes["replacing"] += replacing
    shutil.rmtree(out, ignore_errors=True)
    merge(cfg, out, quiet=True)  # a later run succeeds and sweeps the killed runs' temporary folders
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.")]
    assert {str(p): digest(p) for p in [base, *agents]} == inputs_before
    assert outcomes["absent"] > 0  # the kills did land mid-merge
    print(f"kills: {outcomes}, uninterrupted merge {full:.2f} s")


# --------------------------------------------------------------------------- full disk


def _tiny_cfg(family: tuple[Path, list[Path]]) -> MergeConfig:
    base, agents = family
    return MergeConfig(method="ram", base=str(base), models=[ModelSpec(path=str(a)) for a in agents])


def _no_trace(out: Path) -> None:
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]


def test_full_disk_at_reservation(
    tiny_family: tuple[Path, list[Path]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_space(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    with pytest.raises(CheckpointError, match="not enough disk space"):
        merge(_tiny_cfg(tiny_family), tmp_path / "out", quiet=True)
    _no_trace(tmp_path / "out")


def test_full_disk_while_writing(
    tiny_family: tuple[Path, list[Path]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """File systems without fallocate: the shard is sparse and a later write hits ENOSPC."""
    calls = {"n": 0}
    real_pwrite = os.pwrite

    def pwrite(fd: int, data: object, offset: int) -> int:
        calls["n"] += 1
        if calls["n"] > 5:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, offset)  # type: ignore[arg-type]

    def unsupported(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    monkeypatch.setattr(os, "pwrite", pwrite)
    with pytest.raises(CheckpointError, match="disk"):
        merge(_tiny_cfg(tiny_family), tmp_path / "out", quiet=True)
    _no_trace(tmp_path / "out")


def test_file_size_limit_in_a_child(tiny_family: tuple[Path, list[Path]], tmp_path: Path) -> None:
    """RLIMIT_FSIZE: the kernel refuses to grow files past a limit, as a full quota would."""
    out = tmp_path / "out"
    result = tmp_path / "result.txt"

    def child() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
        try:
            merge(_tiny_cfg(tiny_family), out, quiet=True)
            outcome = "no error"
        except CheckpointError as e:
            outcome = f"CheckpointError: {e}"
        except BaseException as e:
            outcome = f"other: {type(e).__name__}: {e}"
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        result.write_text(outcome)

    pid = in_child(child)
    os.waitpid(pid, 0)
    text = result.read_text()
    assert text.startswith("CheckpointError") and "disk" in text, text
    _no_trace(out)


# --------------------------------------------------------------------------- hostile input


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[..., object], tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_pickle_with_code_is_refused(tiny_family: tuple[Path, list[Path]], tmp_path: Path) -> None:
    base, agents = tiny_family
    evil = tmp_path / "evil"
    evil.mkdir()
    marker = tmp_path / "pwned"
    with open(evil / "pytorch_model.bin", "wb") as f:
        pickle.dump({"model.embed_tokens.weight": _Evil(marker)}, f)
    with pytest.raises(CheckpointError, match="weights_only=True") as e:
        Checkpoint(evil)
    assert "refused to load" in str(e.value)
    cfg = MergeConfig(method="ram", base=str(base), models=[ModelSpec(path=str(agents[0])), ModelSpec(path=str(evil))])
    with pytest.raises(CheckpointError):
        merge(cfg, tmp_path / "out", quiet=True)
    assert not marker.exists()
    _no_trace(tmp_path / "out")


def _raw_safetensors(path: Path, header: object, data: bytes = b"", *, length: int | None = None) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


@pytest.mark.parametrize(
    ("header", "data", "length", "needle"),
    [
        ({}, b"", 2**63, "header length"),  # oversized length field
        ({}, b"", 200 * 1024 * 1024, "header length"),  # over the limit and the file
        ("not an object", b"", None, "not a JSON object"),
        ({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4, None, "ends at byte"),
        (
            {
                "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
            },
            b"\0" * 12,
            None,
            "overlap",
        ),
        ({"t": {"dtype": "F32", "shape": [2**40, 2**40], "data_offsets": [0, 8]}}, b"\0" * 8, None, "needs"),
        ({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 8]}}, b"\0" * 8, None, "invalid shape"),
        ({"t": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}}, b"\0" * 8, None, "invalid shape"),
        ({"t": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, b"\0" * 8, None, "covers"),
        ({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0]}}, b"\0" * 8, None, "invalid data_offsets"),
        ({"t": {"dtype": "PY_OBJECT", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, None, "unsupported dtype"),
        ({"t": "nope"}, b"", None, "malformed"),
        ({"t": {"dtype": ["F32"], "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, None, "unsupported dtype"),
    ],
)
def test_hostile_headers_rejected_before_allocation(
    tmp_path: Path, header: object, data: bytes, length: int | None, needle: str
) -> None:
    f = _raw_safetensors(tmp_path / "model.safetensors", header, data, length=length)
    import tracemalloc

    tracemalloc.start()
    with pytest.raises(CheckpointError, match=None) as e:
        read_safetensors_header(f)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert needle in str(e.value), str(e.value)
    assert peak < 4 * 1024 * 1024


def test_tokenizer_link_outside_the_model_is_refused(tmp_path: Path) -> None:
    src, dest = tmp_path / "model", tmp_path / "dest"
    src.mkdir()
    dest.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("do not copy")
    (src / "tokenizer.json").symlink_to(secret)
    with pytest.raises(CheckpointError, match="links outside"):
        copy_aux_files(src, dest, ["tokenizer.json"])
    assert not (dest / "tokenizer.json").exists()
    (src / "vocab.json").write_text("{}")
    (src / "merges.txt").symlink_to(src / "vocab.json")  # a link inside the folder is fine
    assert copy_aux_files(src, dest, ["vocab.json", "merges.txt"]) == ["vocab.json", "merges.txt"]


def test_absolute_shard_name_in_index_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    save_file({"a": torch.zeros(2)}, tmp_path / "elsewhere.safetensors")
    weight_map = {"a": str(tmp_path / "elsewhere.safetensors")}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(CheckpointError, match="points outside"):
        Checkpoint(folder)


@pytest.mark.parametrize("n", [1, 3, 120])
def test_output_shard_names_are_plain(n: int) -> None:
    tensors = [PlannedTensor(f"../../t{i}/x", torch.float32, (4,)) for i in range(n)]
    for plan in plan_shards(tensors, 16):
        assert "/" not in plan.file_name and ".." not in plan.file_name and plan.file_name.endswith(".safetensors")


def test_remote_code_is_never_trusted() -> None:
    for f in SRC.rglob("*.py"):
        text = f.read_text().replace(" ", "")
        assert "trust_remote_code=True" not in text, f
        assert '"trust_remote_code":True' not in text, f


# --------------------------------------------------------------------------- determinism


@pytest.mark.parametrize("method", ["ram_plus", "dare_ties"])
def test_bit_identical_across_threads_shards_and_chunks(
    tiny_family: tuple[Path, list[Path]], tmp_path: Path, method: str
) -> None:
    from agentmerge.methods.registry import METHODS

    if method not in METHODS:
        pytest.skip(f"{method} not available")
    base, agents = tiny_family
    results = []
    for i, (threads, shard, chunk) in enumerate(
        [(1, "5GB", None), (3, "20KB", 1000), (2, "8KB", 4096), (1, "5GB", None)]
    ):
        cfg = MergeConfig(
            method=method,
            base=str(base),
            models=[ModelSpec(path=str(a)) for a in agents],
            threads=threads,
            max_shard_size=shard,
            chunk_size=chunk,
            seed=7,
        )
        merge(cfg, tmp_path / f"o{i}", quiet=True)
        results.append(weights(tmp_path / f"o{i}"))
    assert len(list((tmp_path / "o2").glob("*.safetensors"))) > 1
    for r in results[1:]:
        assert r.keys() == results[0].keys() and all(torch.equal(r[k], results[0][k]) for k in r)
    assert (tmp_path / "o0" / "model.safetensors").read_bytes() == (tmp_path / "o3" / "model.safetensors").read_bytes()


def test_hugging_face_cache_layout_is_accepted(tmp_path: Path) -> None:
    """Hub snapshots hold links to ``../../blobs/HASH``: not an escape, and shard names stay as indexed."""
    repo = tmp_path / "models--org--m"
    blobs, snap = repo / "blobs", repo / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    parts = {"model-00001-of-00002.safetensors": "a", "model-00002-of-00002.safetensors": "b"}
    for i, (shard, tensor) in enumerate(parts.items()):
        save_file({tensor: torch.randn(4, generator=g)}, blobs / f"blob{i}")
        (snap / shard).symlink_to(Path("../../blobs") / f"blob{i}")
    (blobs / "idx").write_text(json.dumps({"weight_map": {t: s for s, t in parts.items()}}))
    (snap / "model.safetensors.index.json").symlink_to("../../blobs/idx")
    (blobs / "tok").write_text("{}")
    (snap / "tokenizer.json").symlink_to("../../blobs/tok")
    with Checkpoint(snap) as c:
        assert sorted(c.tensors) == ["a", "b"]
        assert sorted(f.name for f in c.weight_files) == sorted(parts)
    dest = tmp_path / "dest"
    dest.mkdir()
    assert copy_aux_files(snap, dest, ["tokenizer.json"]) == ["tokenizer.json"]
    (snap / "vocab.json").symlink_to(tmp_path / "dest" / "tokenizer.json")  # outside the repo: refused
    with pytest.raises(CheckpointError, match="links outside"):
        copy_aux_files(snap, dest, ["vocab.json"])


def test_shard_link_outside_the_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    save_file({"a": torch.zeros(2)}, tmp_path / "elsewhere.safetensors")
    (folder / "model-00001-of-00001.safetensors").symlink_to(tmp_path / "elsewhere.safetensors")
    weight_map = {"a": "model-00001-of-00001.safetensors"}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(CheckpointError, match="links outside"):
        Checkpoint(folder)


def test_fifo_posing_as_a_tokenizer_file_is_refused(tmp_path: Path) -> None:
    src, dest = tmp_path / "model", tmp_path / "dest"
    src.mkdir()
    dest.mkdir()
    os.mkfifo(src / "tokenizer.json")
    with pytest.raises(CheckpointError, match="not a regular file"):
        copy_aux_files(src, dest, ["tokenizer.json"])


def test_yaml_with_python_tags_runs_no_code(tmp_path: Path) -> None:
    from agentmerge.config.schema import load_config
    from agentmerge.errors import ConfigError

    marker = tmp_path / "pwned"
    (tmp_path / "c.yaml").write_text(f"method: !!python/object/apply:os.system ['touch {marker}']\nmodels: [a]\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "c.yaml")
    assert not marker.exists()
