"""The cache folder's stores: keyed by the files' identities, best effort, off on request; thresholds kept exactly."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from agentmerge.io.cache.store import InputSetStore, cache_dir
from agentmerge.methods.masks import Levels, levels_from_json, levels_to_json


@pytest.fixture
def inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[list[Path]]:
    monkeypatch.setenv("AGENTMERGE_CACHE", str(tmp_path / "cache"))
    files = []
    for name in ("base", "a"):
        (tmp_path / name).write_bytes(name.encode())
        files.append([tmp_path / name])
    return files


def test_store_round_trip_and_identity(inputs: list[list[Path]]) -> None:
    store = InputSetStore("levels", inputs)
    assert store.path is not None and store.path.parent == cache_dir() / "levels"
    assert store.get(["x"]) == {}
    store.put({"x": [1.5, 2.0], "y": {"k": True}})
    store.put({"z": 3})  # a second put adds to the first
    again = InputSetStore("levels", inputs)
    assert again.get(["x", "y", "z", "w"]) == {"x": [1.5, 2.0], "y": {"k": True}, "z": 3}
    assert InputSetStore("stats", inputs).get(["x"]) == {}  # kinds are apart
    assert InputSetStore("levels", inputs[::-1]).get(["x"]) == {}  # so is another order of the inputs
    st = inputs[1][0].stat()
    os.utime(inputs[1][0], ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert InputSetStore("levels", inputs).get(["x"]) == {}  # a touched file is another input set


def test_store_off_or_broken(inputs: list[list[Path]], monkeypatch: pytest.MonkeyPatch) -> None:
    store = InputSetStore("levels", inputs)
    store.put({"x": 1})
    assert store.path is not None
    store.path.write_text("[not a store")
    assert store.get(["x"]) == {}
    store.put({"x": 2})  # a broken store is replaced
    assert store.get(["x"]) == {"x": 2}
    monkeypatch.setenv("AGENTMERGE_NO_CACHE", "1")
    off = InputSetStore("levels", inputs)
    off.put({"x": 3})
    assert off.path is None and off.get(["x"]) == {}
    assert store.get(["x"]) == {"x": 2}  # and it wrote nothing


def test_levels_json_is_exact() -> None:
    g = torch.Generator().manual_seed(3)
    odd = [1e-45, 1.17549435e-38, 3.4028235e38, 0.0, 1e-5, 0.1]  # subnormal, least normal, largest, zero, ...
    values = torch.cat([torch.tensor(odd), torch.rand(200, generator=g) * 10.0 ** torch.randint(-30, 3, (200,))])
    levels = Levels(values.float(), tuple(bool(i % 3) for i in range(values.numel())))
    back = levels_from_json(json.loads(json.dumps(levels_to_json(levels))), values.numel())
    assert back is not None and back.fallback == levels.fallback
    assert torch.equal(back.values.view(torch.int32), levels.values.view(torch.int32))  # bit for bit


@pytest.mark.parametrize(
    "entry",
    [
        None,
        [1.0, 2.0],
        {"values": [1.0, 2.0], "fallback": [False]},  # lengths differ
        {"values": [1.0], "fallback": [False]},  # another number of agents
        {"values": [1.0, "x"], "fallback": [False, False]},
        {"values": [1.0, 2.0], "fallback": [0, 1]},
        {"values": [1.0, 2.0]},
    ],
)
def test_levels_json_refuses_what_is_not_an_entry(entry: object) -> None:
    assert levels_from_json(entry, 2) is None


def test_an_edited_entry_reads_as_missing(inputs: list[list[Path]]) -> None:
    store = InputSetStore("stats", inputs)
    store.put({"x": [[1, 2], [3, 4]], "y": [0.5]})
    assert store.path is not None
    data = json.loads(store.path.read_text())
    data["x"]["value"][0][0] = 9  # a damaged entry: its checksum no longer matches
    data["y"] = [0.5]  # an entry without its seal (an older format, or written by hand)
    store.path.write_text(json.dumps(data))
    assert store.get(["x", "y"]) == {}
    store.put({"x": [[1, 2], [3, 4]]})  # recomputed, and replaced
    assert store.get(["x"]) == {"x": [[1, 2], [3, 4]]}
