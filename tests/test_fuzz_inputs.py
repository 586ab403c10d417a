"""Fuzzing the readers of issue 23's inputs with hypothesis: adapter configs, DCP metadata, verl rank file
names, task files, sweep results and cache entries. Only AgentMergeError subclasses may escape; what is
accepted must be right (a DCP tensor read back is exactly the state dict's; a cache entry read back is the
one stored). ``AGENTMERGE_FUZZ_EXAMPLES`` raises the number of examples (default 100 per test)."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import string
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.hostile import model_folder
from tests.test_hostile_adapters import adapter

from agentmerge.errors import AgentMergeError
from agentmerge.evaluation.taskfile import first_json, load_tasks
from agentmerge.io.cache.store import InputSetStore
from agentmerge.io.formats.checkpoint import Checkpoint
from agentmerge.io.formats.dcp import DcpCheckpoint
from agentmerge.io.formats.lora import LoraModel
from agentmerge.io.formats.verl import VerlCheckpoint
from agentmerge.sweep.results import read_records

EXAMPLES = int(os.environ.get("AGENTMERGE_FUZZ_EXAMPLES", "100"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.sampled_from(["q_proj", "(", "[a-", "(.|.)*\\d\\d", ".*", "LORA", "ok", "failed", "ffffffffffffffff"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
nested = st.integers(min_value=1, max_value=3000).map(lambda n: "[" * n + "]" * n)


@pytest.fixture(scope="module")
def lora_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return model_folder(tmp_path_factory.mktemp("fuzzlora") / "base", 0)


ADAPTER_KEYS = ["r", "lora_alpha", "rank_pattern", "alpha_pattern", "use_rslora", "fan_in_fan_out", "peft_type",
                "use_dora", "base_model_name_or_path", "layer_replication"]  # fmt: skip


@FUZZ
@given(st.dictionaries(st.sampled_from(ADAPTER_KEYS), values, max_size=4))
def test_adapter_configs_only_raise_our_errors(
    lora_base: Path, tmp_path_factory: pytest.TempPathFactory, cfg: Any
) -> None:
    folder = tmp_path_factory.mktemp("a") / "adapter"
    adapter(folder, lora_base, **cfg)
    with Checkpoint(lora_base) as host, contextlib.suppress(AgentMergeError), LoraModel(folder, host) as m:
        for name in m.tensors:
            m.read(name)
    shutil.rmtree(folder.parent)


STATE = {"w": (6, 3), "v": (5,)}


@pytest.fixture(scope="module")
def dcp_template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    import torch.distributed.checkpoint as dcp

    g = torch.Generator().manual_seed(0)
    state = {n: torch.randn(s, generator=g) for n, s in STATE.items()}
    folder = tmp_path_factory.mktemp("fuzzdcp") / "dcp"
    dcp.save(dict(state), checkpoint_id=folder, no_dist=True)
    return folder, state


sizes = st.lists(st.integers(min_value=-2, max_value=9), min_size=0, max_size=3)
chunk_changes = st.lists(st.tuples(st.sampled_from(sorted(STATE)), sizes, sizes), max_size=3)


@FUZZ
@given(
    chunk_changes,
    st.one_of(st.none(), st.sampled_from(["w", "v"])),
    st.one_of(st.none(), sizes),
    st.sampled_from([None, "float32", torch.int8, torch.complex64]),
)
def test_dcp_metadata_is_read_exactly_or_refused(
    dcp_template: tuple[Path, dict[str, torch.Tensor]],
    tmp_path_factory: pytest.TempPathFactory,
    chunks: list[tuple[str, list[int], list[int]]],
    resized: str | None,
    size: list[int] | None,
    dtype: Any,
) -> None:
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    template, state = dcp_template
    folder = tmp_path_factory.mktemp("d") / "dcp"
    shutil.copytree(template, folder)
    with open(folder / ".metadata", "rb") as f:
        md = pickle.load(f)  # the test's own file
    for key, offsets, extent in chunks:
        md.state_dict_metadata[key].chunks.append(ChunkStorageMetadata(offsets, extent))  # type: ignore[arg-type]
    if resized is not None and size is not None:
        md.state_dict_metadata[resized].size = size
    if dtype is not None:
        md.state_dict_metadata["w"].properties.dtype = dtype
    (folder / ".metadata").write_bytes(pickle.dumps(md))
    with contextlib.suppress(AgentMergeError), DcpCheckpoint(folder) as ckpt:
        for name, t in state.items():  # accepted: then exactly the state dict
            assert torch.equal(ckpt.read(name).view(t.shape), t), name
    shutil.rmtree(folder.parent)


name_part = st.one_of(
    st.integers(min_value=0, max_value=10**30).map(str), st.text(string.digits + "0٠١x_ ", max_size=5)
)


@FUZZ
@given(st.lists(st.tuples(name_part, name_part), min_size=1, max_size=4))
def test_verl_rank_file_names_only_raise_our_errors(tmp_path_factory: pytest.TempPathFactory, names: Any) -> None:
    actor = tmp_path_factory.mktemp("v") / "actor"
    actor.mkdir()
    for w, r in names:
        with contextlib.suppress(OSError):
            torch.save({"x": torch.ones(2)}, actor / f"model_world_size_{w}_rank_{r}.pt")
    with contextlib.suppress(AgentMergeError), VerlCheckpoint(actor) as ckpt:
        assert ckpt.read("x").numel() == 2 * len(ckpt.files)
    shutil.rmtree(actor.parent)


task_rows = st.one_of(
    nested,
    values.map(json.dumps),
    st.fixed_dictionaries(
        {"prompt": scalars, "reference": values},
        optional={"match": st.sampled_from(["exact", "regex", "json", "numeric", "x"]), "task": scalars},
    ).map(json.dumps),
    st.text(max_size=30),
)


@FUZZ
@given(st.lists(task_rows, min_size=0, max_size=4))
def test_task_files_only_raise_our_errors(tmp_path_factory: pytest.TempPathFactory, rows: list[str]) -> None:
    path = tmp_path_factory.mktemp("t") / "tasks.jsonl"
    path.write_text("\n".join(rows) + "\n")
    with contextlib.suppress(AgentMergeError):
        for ex in load_tasks(path):
            ex.score("7 [1, 2] {" + '"a": 1}')
    shutil.rmtree(path.parent)


@FUZZ
@given(st.one_of(nested, st.text(max_size=40), values.map(json.dumps)))
def test_model_outputs_never_break_the_json_rule(text: str) -> None:
    ok, _ = first_json(text)
    assert ok in (True, False)


RECORD = {"trial": "f" * 16, "method": "ram", "params": {}, "models": ["a"], "seed": 0, "status": "ok",
          "metrics": {"score": 1.0}}  # fmt: skip


RECORDS = st.dictionaries(st.sampled_from([*sorted(RECORD), "name", "error", "seconds"]), values).map(
    lambda d: json.dumps({**RECORD, **d})
)


@FUZZ
@given(st.lists(st.one_of(RECORDS, nested, st.text(max_size=20)), max_size=3))
def test_sweep_results_are_checked_field_by_field(tmp_path_factory: pytest.TempPathFactory, lines: list[str]) -> None:
    path = tmp_path_factory.mktemp("r") / "results.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with contextlib.suppress(AgentMergeError):
        for rec in read_records(path):
            assert set(RECORD) <= set(rec) and "/" not in rec["trial"] and "/" not in rec.get("name", "")
    shutil.rmtree(path.parent)


@FUZZ
@given(st.one_of(values.map(json.dumps), nested, st.text(max_size=40)))
def test_cache_entries_are_used_only_when_intact(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    root = tmp_path_factory.mktemp("c")
    monkeypatch.setenv("AGENTMERGE_CACHE", str(root / "cache"))
    (root / "f").write_bytes(b"x")
    store = InputSetStore("stats", [[root / "f"]])
    store.put({"k": [[1, 2], [3, 4]]})
    assert store.path is not None
    data = json.loads(store.path.read_text())
    store.path.write_text(text)  # the whole store replaced by something else
    assert store.get(["k"]) in ({}, {"k": [[1, 2], [3, 4]]})
    store.path.write_text(json.dumps({"k": data["k"] | {"value": text}}))  # the entry's value changed
    assert store.get(["k"]) in ({}, {"k": [[1, 2], [3, 4]]})
    shutil.rmtree(root)
