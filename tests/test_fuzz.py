"""Fuzzing the parsers with hypothesis: only AgentMergeError subclasses may escape; never a crash, a hang
or a large allocation. Bounded: about 200 examples per test, no deadline."""

from __future__ import annotations

import contextlib
import json
import os
import struct
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentmerge.config.mergekit import from_mergekit
from agentmerge.config.schema import config_from_dict, load_config
from agentmerge.errors import AgentMergeError
from agentmerge.io.formats.tensorfile import read_safetensors_header

EXAMPLES = int(os.environ.get("AGENTMERGE_FUZZ_EXAMPLES", "200"))  # raise it for a long local fuzzing run
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["ram", "ram_plus", "linear", "ties", "tensor", "global", "5GB", "bfloat16", "../x", "1e-5"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
CONFIG_KEYS = [
    "method",
    "base",
    "models",
    "params",
    "overrides",
    "dtype",
    "max_shard_size",
    "include",
    "exclude",
    "seed",
    "tokenizer_source",
    "threads",
    "max_memory",
    "chunk_size",
    "path",
    "weight",
    "pattern",
]
keys = st.one_of(st.sampled_from(CONFIG_KEYS), st.text(max_size=8))
model_entry = st.one_of(
    st.text(max_size=8),
    st.fixed_dictionaries({"path": st.text(max_size=8)}, optional={"weight": scalars, "params": values}),
    values,
)
config_dicts = st.fixed_dictionaries(
    {"method": st.one_of(st.sampled_from(["ram", "ram_plus", "linear", "task_arithmetic", "ties"]), scalars)},
    optional={
        "base": scalars,
        "models": st.one_of(st.lists(model_entry, max_size=3), values),
        "params": st.one_of(
            st.dictionaries(st.sampled_from(["r", "alpha", "epsilon", "scope", "lambda", "form"]), scalars, max_size=3),
            values,
        ),
        "overrides": values,
        "dtype": scalars,
        "max_shard_size": scalars,
        "seed": scalars,
        "threads": scalars,
        "chunk_size": scalars,
        "include": values,
    },
) | st.dictionaries(keys, values, max_size=6)


@FUZZ
@given(config_dicts)
def test_config_from_dict_only_raises_our_errors(data: dict[str, Any]) -> None:
    with contextlib.suppress(AgentMergeError):
        config_from_dict(data)


@FUZZ
@given(st.one_of(config_dicts.map(lambda d: yaml.safe_dump(d)), st.text(max_size=200)))
def test_load_config_only_raises_our_errors(tmp_path: Path, text: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with contextlib.suppress(AgentMergeError):
        config_from_dict(load_config(f))


mergekit_docs = st.fixed_dictionaries(
    {
        "merge_method": st.one_of(
            st.sampled_from(
                ["ram", "ramplus_tl", "linear", "task_arithmetic", "ties", "dare_ties", "della", "slerp", "model_stock"]
            ),
            scalars,
        )
    },
    optional={
        "base_model": st.one_of(st.just("B"), scalars, values),
        "models": st.one_of(
            st.lists(
                st.fixed_dictionaries(
                    {"model": st.one_of(st.sampled_from(["a", "b", "B"]), values)}, optional={"parameters": values}
                ),
                max_size=3,
            ),
            values,
        ),
        "parameters": values,
        "dtype": scalars,
        "out_dtype": scalars,
        "tokenizer_source": values,
        "tokenizer": values,
    },
)


@FUZZ
@given(mergekit_docs)
def test_mergekit_translation_only_raises_our_errors(data: dict[str, Any]) -> None:
    with contextlib.suppress(AgentMergeError):
        config_from_dict(from_mergekit(data).config)


dtypes = st.sampled_from(["F32", "F16", "BF16", "I64", "U8", "BOOL", "F8_E4M3", "X", 3])
entries = st.one_of(
    st.fixed_dictionaries(
        {
            "dtype": dtypes,
            "shape": st.one_of(st.lists(st.integers(min_value=-2, max_value=2**40), max_size=4), values),
            "data_offsets": st.one_of(st.lists(st.integers(min_value=-2, max_value=2**62), max_size=3), values),
        }
    ),
    values,
)
headers = st.one_of(st.dictionaries(st.text(max_size=6), entries, max_size=4), values)


@FUZZ
@given(headers, st.binary(max_size=64), st.one_of(st.none(), st.integers(min_value=0, max_value=2**64 - 1)))
def test_header_parser_only_raises_our_errors(tmp_path: Path, header: Any, data: bytes, length: int | None) -> None:
    raw = json.dumps(header).encode()
    f = tmp_path / "model.safetensors"
    f.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    tracemalloc.start()
    try:
        with contextlib.suppress(AgentMergeError):
            read_safetensors_header(f)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < 8 * 1024 * 1024


@FUZZ
@given(st.binary(max_size=300))
def test_header_parser_on_random_bytes(tmp_path: Path, blob: bytes) -> None:
    f = tmp_path / "model.safetensors"
    f.write_bytes(blob)
    with contextlib.suppress(AgentMergeError):
        read_safetensors_header(f)


@pytest.mark.parametrize("blob", [b"", b"\x00" * 8, struct.pack("<Q", 2) + b"{}", struct.pack("<Q", 4) + b"null"])
def test_header_parser_edge_cases(tmp_path: Path, blob: bytes) -> None:
    f = tmp_path / "model.safetensors"
    f.write_bytes(blob)
    with contextlib.suppress(AgentMergeError):
        read_safetensors_header(f)
