"""Input digests for merge.json: the three modes, the caches, Hub blobs, duplicate warnings, failures."""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import xxhash

from agentmerge import MergeConfig, ModelSpec, merge
from agentmerge.cli import main
from agentmerge.engine.provenance import duplicate_inputs, input_warnings
from agentmerge.errors import ConfigError
from agentmerge.io.cache import digests
from agentmerge.io.cache.digests import Digest, InputDigests, hash_mode

SMALL_WINDOW = mmap.ALLOCATIONGRANULARITY  # so that a small file spans several mapped windows


@pytest.fixture(autouse=True)
def _clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTMERGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("AGENTMERGE_HASH", raising=False)
    monkeypatch.delenv("AGENTMERGE_NO_HASH", raising=False)


def _files(tmp_path: Path, sizes: tuple[int, ...] = (0, 1, 3 * SMALL_WINDOW + 17)) -> list[Path]:
    rng = random.Random(0)
    out = []
    for i, n in enumerate(sizes):
        p = tmp_path / f"f{i}.bin"
        p.write_bytes(rng.randbytes(n))
        out.append(p)
    return out


def _no_reads(monkeypatch: pytest.MonkeyPatch, why: str) -> None:
    monkeypatch.setattr(digests, "_feed", lambda *a: pytest.fail(why))


def test_each_mode_gives_the_digests_of_the_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(digests, "WINDOW", SMALL_WINDOW)
    files = _files(tmp_path)
    fast = InputDigests(files, "fast").result()
    assert fast == {str(f): Digest(xxh3_128=xxhash.xxh3_128(f.read_bytes()).hexdigest()) for f in files}
    full = InputDigests(files, "sha256", background=True).result()
    assert full == {str(f): Digest(sha256=hashlib.sha256(f.read_bytes()).hexdigest()) for f in files}
    _no_reads(monkeypatch, "mode none read a file")
    assert InputDigests(files, "none", background=True).result() == {str(f): Digest() for f in files}
    assert Digest(xxh3_128="ab").fields() == {"sha256": None, "xxh3_128": "ab"}
    assert Digest(sha256="cd").fields() == {"sha256": "cd"} and Digest().fields() == {"sha256": None}


def test_mode_from_argument_then_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert hash_mode() == "fast"
    monkeypatch.setenv("AGENTMERGE_NO_HASH", "1")
    assert hash_mode() == "none" and hash_mode("sha256") == "sha256"
    monkeypatch.setenv("AGENTMERGE_HASH", "sha256")
    assert hash_mode() == "sha256" and hash_mode("fast") == "fast"
    monkeypatch.setenv("AGENTMERGE_HASH", "md5")
    with pytest.raises(ConfigError, match="AGENTMERGE_HASH='md5' is not a hashing mode: use one of fast, sha256, none"):
        hash_mode()
    with pytest.raises(ConfigError, match="hashing='xx'"):
        hash_mode("xx")


def test_cache_hits_misses_and_a_changed_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = _files(tmp_path, (100, 200))
    first = InputDigests(files, "fast").result()
    full = InputDigests(files, "sha256").result()
    stores = {a: json.loads((tmp_path / "cache" / f"{a}.json").read_text()) for a in ("xxh3_128", "sha256")}
    values = {a: sorted(e["value"] for e in stores[a].values()) for a in stores}  # entries sealed with a checksum
    assert values["xxh3_128"] == sorted(d.xxh3_128 for d in first.values())
    assert values["sha256"] == sorted(d.sha256 for d in full.values())
    calls: list[Path] = []
    monkeypatch.setattr(digests, "_feed", lambda p, update, stop: calls.append(p))
    # a sha256 already known is free: fast mode reports it rather than an xxh3_128
    assert InputDigests(files, "fast", background=True).result() == full and calls == []
    (tmp_path / "cache" / "sha256.json").write_text("not json")  # a broken store reads as empty
    assert InputDigests(files, "fast").result() == first and calls == []
    st = files[0].stat()
    time.sleep(0.05)  # past the file system's timestamp granularity, so the rewrite gets a new ctime
    files[0].write_bytes(b"y" * 100)  # same size, and the mtime put back: still a changed file
    os.utime(files[0], ns=(st.st_atime_ns, st.st_mtime_ns))
    monkeypatch.undo()
    monkeypatch.setenv("AGENTMERGE_CACHE", str(tmp_path / "cache"))
    again = InputDigests(files, "fast").result()
    assert again[str(files[0])] == Digest(xxh3_128=xxhash.xxh3_128(b"y" * 100).hexdigest())
    assert again[str(files[1])] == first[str(files[1])]


def test_hub_blob_gives_its_sha256_without_reading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fast: the blob's name, marked as such; sha256: the bytes, always read (issue 23)."""
    data = b"weights"
    digest = hashlib.sha256(data).hexdigest()
    (tmp_path / "blobs").mkdir()
    (tmp_path / "blobs" / digest).write_bytes(data)
    (tmp_path / "snap").mkdir()
    link = tmp_path / "snap" / "model.safetensors"
    link.symlink_to(Path("..") / "blobs" / digest)
    assert InputDigests([link], "sha256").result() == {str(link): Digest(sha256=digest)}
    (tmp_path / "cache" / "sha256.json").unlink()  # forget the bytes read: the name alone is left
    _no_reads(monkeypatch, "hashed a file the Hub already named")
    named = InputDigests([link], "fast").result()[str(link)]
    assert named == Digest(sha256=digest, from_name=True)
    assert named.fields() == {"sha256": digest, "sha256_from": "hub blob name"}
    (tmp_path / "blobs" / "not-a-digest").write_bytes(data)
    assert digests.hub_blob_digest(tmp_path / "blobs" / "not-a-digest") is None


def test_cancel_stops_within_one_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(digests, "WINDOW", SMALL_WINDOW)
    (big,) = _files(tmp_path, (10 * SMALL_WINDOW,))
    stop = threading.Event()
    seen: list[int] = []

    def update(window: Any) -> None:
        seen.append(len(window))
        stop.set()

    with pytest.raises(digests._Cancelled):
        digests._feed(big, update, stop)
    assert seen == [SMALL_WINDOW]
    hashes = InputDigests([big])
    hashes.cancel()
    assert hashes.result() == {str(big): Digest()} and "the merge stopped first" in hashes.errors[0]


def _cfg(family: tuple[Path, list[Path]]) -> MergeConfig:
    base, agents = family
    return MergeConfig(method="linear", base=str(base), models=[ModelSpec(path=str(a)) for a in agents])


def _entries(out: Path) -> tuple[dict[str, Any], list[tuple[bytes, dict[str, Any]]]]:
    record = json.loads((out / "merge.json").read_text())
    return record, [((Path(d) / e["file"]).read_bytes(), e) for d, fs in record["inputs"].items() for e in fs]


def test_merge_json_per_mode(tiny_family: tuple[Path, list[Path]], tmp_path: Path) -> None:
    record, entries = _entries(merge(_cfg(tiny_family), tmp_path / "fast", quiet=True).out_dir)
    assert record["hashing"] == "fast" and "hash_errors" not in record and len(entries) == 4
    for data, e in entries:
        assert e == {
            "file": e["file"],
            "bytes": len(data),
            "sha256": None,
            "xxh3_128": xxhash.xxh3_128(data).hexdigest(),
        }
    record, entries = _entries(merge(_cfg(tiny_family), tmp_path / "sha", quiet=True, hashing="sha256").out_dir)
    assert record["hashing"] == "sha256"
    assert all(e == {"file": e["file"], "bytes": len(d), "sha256": hashlib.sha256(d).hexdigest()} for d, e in entries)
    record, entries = _entries(merge(_cfg(tiny_family), tmp_path / "none", quiet=True, hashing="none").out_dir)
    assert record["hashing"] == "none" and all(
        e == {"file": e["file"], "bytes": len(d), "sha256": None} for d, e in entries
    )


def test_cli_hash_flag_overrides_the_environment(
    tiny_family: tuple[Path, list[Path]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, agents = tiny_family
    argv = ["merge", "--method", "linear", "--base", str(base), *[x for a in agents for x in ("--model", str(a))]]
    monkeypatch.setenv("AGENTMERGE_NO_HASH", "1")
    assert main([*argv, "-o", str(tmp_path / "a"), "--quiet", "--hash", "sha256"]) == 0
    record, entries = _entries(tmp_path / "a")
    assert record["hashing"] == "sha256" and all(e["sha256"] == hashlib.sha256(d).hexdigest() for d, e in entries)
    assert main([*argv, "-o", str(tmp_path / "b"), "--quiet"]) == 0
    assert _entries(tmp_path / "b")[0]["hashing"] == "none"
    with pytest.raises(SystemExit):
        main([*argv, "-o", str(tmp_path / "c"), "--hash", "md5"])


def _record(**inputs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"inputs": {str(Path(k).resolve()): v for k, v in inputs.items()}}


def test_duplicate_warning_names_the_digest_compared() -> None:
    cfg = MergeConfig(method="ram", base="b", models=[ModelSpec(path=p) for p in ("m1", "m2", "m3", "m4")])
    x = [{"file": "w", "sha256": None, "xxh3_128": "1" * 32}]
    s = [{"file": "w", "sha256": "2" * 64}]
    record = _record(b=x, m1=x, m2=s, m3=s, m4=[{"file": "w", "sha256": "2" * 64, "xxh3_128": "1" * 32}])
    assert duplicate_inputs(cfg, record) == [
        "m1 holds the base's weights (same xxh3_128)",
        "m3 holds the same weights as m2 (same sha256)",
        "m4 holds the same weights as m2 (same sha256)",
    ]
    # an xxh3_128 and a sha256 say nothing about each other; an input with an unhashed file is not compared
    mixed = _record(b=s, m1=x, m2=[*x, {"file": "v", "sha256": None}], m3=x[:0], m4=[])
    assert duplicate_inputs(cfg, mixed) == []
    assert input_warnings(cfg, {**mixed, "hash_errors": ["w: could not hash it"]}) == [
        "no digest in merge.json for w: could not hash it"
    ]


def test_a_failing_hash_does_not_break_the_merge(
    tiny_family: tuple[Path, list[Path]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def broken(path: Path, stop: threading.Event | None = None) -> str:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(digests, "xxh3_file", broken)
    base, agents = tiny_family
    argv = ["merge", "--method", "linear", "--base", str(base), *[x for a in agents for x in ("--model", str(a))]]
    assert main([*argv, "-o", str(tmp_path / "o")]) == 0
    record, entries = _entries(tmp_path / "o")
    assert all(e["sha256"] is None and "xxh3_128" not in e for _, e in entries) and len(record["hash_errors"]) == 4
    err = capsys.readouterr().err
    assert f"warning: no digest in merge.json for {base / 'model.safetensors'}: could not hash it (OSError:" in err


def test_failed_merge_cancels_hashing(
    tiny_family: tuple[Path, list[Path]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentmerge.errors import CheckpointError
    from agentmerge.io.guards.safety import output_lock

    cancelled: list[bool] = []
    monkeypatch.setattr(InputDigests, "cancel", lambda self: cancelled.append(True))
    with output_lock(tmp_path / "o"), pytest.raises(CheckpointError):  # another run holds the output: this one fails
        merge(_cfg(tiny_family), tmp_path / "o", quiet=True)
    assert cancelled == [True]
