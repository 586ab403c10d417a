"""Hostile or damaged cache entries, and digests taken from names (issue 23).

Each case failed before its fix: the statistics cache keyed without ``adapter_config.json`` (an edited
``lora_alpha`` reused old histograms), edited or NaN entries in ``stats/`` and ``levels/`` used as they were
(NaN thresholds turn a merge into the base), a deeply nested digest store that killed the digest thread
(null digests, no ``hash_errors``), a store that is ``/dev/zero``, and ``--hash sha256`` recording a Hub
blob's *name* as a verified digest.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from tests.hostile import bounded_python, model_folder
from tests.test_hostile_adapters import adapter

from agentmerge import MergeConfig, ModelSpec, merge, probe
from agentmerge.io.cache import digests
from agentmerge.io.cache.digests import InputDigests
from agentmerge.io.cache.store import cache_dir


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AGENTMERGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("AGENTMERGE_NO_CACHE", raising=False)
    return tmp_path / "cache"


def densities(base: Path, models: list[Path]) -> list[float]:
    return [a.density for a in probe(str(base), [str(m) for m in models], quiet=True).agents]


def test_editing_an_adapters_config_is_never_served_from_the_cache(cache: Path, tmp_path: Path) -> None:
    base = model_folder(tmp_path / "base", 0)
    small = adapter(tmp_path / "a", base, lora_alpha=1e-4)  # its update is below epsilon: it moved nothing
    other = model_folder(tmp_path / "b", 1)
    before = densities(base, [small, other])
    config = json.loads((small / "adapter_config.json").read_text())
    (small / "adapter_config.json").write_text(json.dumps({**config, "lora_alpha": 8}))
    after = densities(base, [small, other])
    assert before[0] == 0.0 and after[0] > 0.0  # counted again, not read from the cache


def _damage(value: Any, how: str) -> Any:
    """Every number in a cache file changed (its structure kept), whatever the entry format."""
    if isinstance(value, dict):
        return {k: _damage(v, how) for k, v in value.items()}
    if isinstance(value, list):
        return [_damage(v, how) for v in value]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    return math.nan if how == "nan" else -1 if how == "negative" else value * 7 + 1


@pytest.mark.parametrize("how", ["nan", "negative", "edited"])
def test_damaged_statistics_entries_are_recomputed_never_used(cache: Path, tmp_path: Path, how: str) -> None:
    base = model_folder(tmp_path / "base", 0)
    agents = [model_folder(tmp_path / f"a{i}", i + 1) for i in range(2)]
    cfg = MergeConfig(
        method="ram_plus",
        base=str(base),
        models=[ModelSpec(path=str(a)) for a in agents],
        params={"epsilon_rule": "percentile", "epsilon_q": 50.0},
    )
    first = merge(cfg, tmp_path / "one", quiet=True)
    for f in [*(cache / "stats").glob("*.json"), *(cache / "levels").glob("*.json")]:
        f.write_text(json.dumps(_damage(json.loads(f.read_text()), how)))
    second = merge(cfg, tmp_path / "two", quiet=True)
    a, b = (load_file(str(tmp_path / d / "model.safetensors")) for d in ("one", "two"))
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert [x.density for x in first.agents() or []] == [x.density for x in second.agents() or []]


@pytest.mark.parametrize("store", ["sha256.json", "stats"])
def test_a_deeply_nested_cache_store_is_read_as_empty(cache: Path, tmp_path: Path, store: str) -> None:
    base = model_folder(tmp_path / "base", 0)
    agents = [model_folder(tmp_path / f"a{i}", i + 1) for i in range(2)]
    cfg = MergeConfig(method="ram_plus", base=str(base), models=[ModelSpec(path=str(a)) for a in agents])
    merge(cfg, tmp_path / "one", quiet=True, hashing="sha256")
    targets = [cache / store] if store.endswith(".json") else list((cache / store).glob("*.json"))
    assert targets
    for f in targets:
        f.write_text("[" * 100_000 + "]" * 100_000)
    merge(cfg, tmp_path / "two", quiet=True, hashing="sha256")
    record = json.loads((tmp_path / "two" / "merge.json").read_text())
    files = [f for group in record["inputs"].values() for f in group]
    assert all(f["sha256"] for f in files) and "hash_errors" not in record


def test_a_cache_store_that_is_a_device_is_not_read(cache: Path, tmp_path: Path) -> None:
    base = model_folder(tmp_path / "base", 0)
    cache.mkdir()
    (cache / "sha256.json").symlink_to("/dev/zero")
    out = bounded_python(
        "from agentmerge.io.cache.digests import InputDigests\n"
        f"d = InputDigests([__import__('pathlib').Path({str(base / 'model.safetensors')!r})], 'sha256')\n"
        "print('digests:', list(d.result().values()), d.errors)\n",
        timeout=120,
        env={"AGENTMERGE_CACHE": str(cache)},
    )
    assert "digests: [Digest(sha256='" in out, out


def _hub_blob(tmp_path: Path, data: bytes, name: str) -> Path:
    (tmp_path / "blobs").mkdir()
    (tmp_path / "blobs" / name).write_bytes(data)
    (tmp_path / "snap").mkdir()
    link = tmp_path / "snap" / "model.safetensors"
    link.symlink_to(Path("..") / "blobs" / name)
    return link


def test_hash_sha256_verifies_a_hub_blob_instead_of_trusting_its_name(cache: Path, tmp_path: Path) -> None:
    data = b"weights"
    wrong = hashlib.sha256(b"other bytes").hexdigest()
    link = _hub_blob(tmp_path, data, wrong)
    hashes = InputDigests([link], "sha256")
    got = hashes.result()[str(link)]
    assert got.sha256 == hashlib.sha256(data).hexdigest() and got.fields()["sha256"] != wrong
    assert any("blob name" in e for e in hashes.errors)


def test_fast_mode_says_a_digest_was_read_from_a_blob_name(cache: Path, tmp_path: Path) -> None:
    data = b"weights"
    link = _hub_blob(tmp_path, data, hashlib.sha256(data).hexdigest())
    fields = InputDigests([link], "fast").result()[str(link)].fields()
    assert fields["sha256"] == hashlib.sha256(data).hexdigest() and fields.get("sha256_from") == "hub blob name"
    assert digests.hub_blob_digest(link) == hashlib.sha256(data).hexdigest()
    assert cache_dir() == cache
