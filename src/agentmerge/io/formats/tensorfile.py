"""One safetensors file: its header parsed and validated before any large allocation, and dtype names.

Layout: ``u64 little-endian N | N bytes of JSON header | data``, where each header entry is
``{"dtype": "BF16", "shape": [...], "data_offsets": [begin, end]}`` relative to the data start.
The file names a model folder keeps its weights under are here too.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentmerge.errors import CheckpointError
from agentmerge.io.guards.strict_json import loads_strict

SAFE_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in SAFE_DTYPES.items()}
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors library's own limit
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
BIN_FILE = "pytorch_model.bin"
BIN_INDEX_FILE = "pytorch_model.bin.index.json"


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: file, absolute byte offset of its data, dtype and shape."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    file: Path
    offset: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


def dtype_from_name(name: str) -> torch.dtype:
    """``"bfloat16"``/``"bf16"``/``"BF16"`` -> ``torch.bfloat16`` (and likewise for float16/32)."""
    table = {
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
        "half": torch.float16,
        "float32": torch.float32,
        "fp32": torch.float32,
        "float": torch.float32,
        "float64": torch.float64,
    }
    key = name.lower().removeprefix("torch.")
    if key in table:
        return table[key]
    if name.upper() in SAFE_DTYPES:
        return SAFE_DTYPES[name.upper()]
    raise ValueError(f"unknown dtype {name!r}; use one of bfloat16, float16, float32")


def torch_dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (the spelling config.json uses)."""
    return str(dtype).removeprefix("torch.")


def read_safetensors_header(path: Path) -> dict[str, TensorInfo]:
    """Parse and validate a safetensors header without reading tensor data.

    Rejects (``CheckpointError``) a truncated file, an oversized or malformed header, unknown dtypes,
    negative or non-integer shapes, byte ranges that disagree with dtype x shape, ranges out of the
    file's bounds and ranges that overlap; and, as the safetensors library does, a header that is not
    UTF-8, repeats a name or has a non-string ``__metadata__``, and data bytes no tensor covers.
    """
    return read_safetensors_file(path)[0]


def read_safetensors_file(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """``(tensors, __metadata__)`` of a safetensors file, validated as ``read_safetensors_header`` says."""
    if path.is_dir():
        raise CheckpointError(f"{path}: is a folder, not a safetensors file; remove or rename it")
    size = _file_size(path)
    if size < 8:
        raise CheckpointError(f"{path}: {size} bytes is too short for a safetensors file (truncated?)")
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > MAX_HEADER_BYTES or n > size - 8:
            raise CheckpointError(
                f"{path}: header length {n} is larger than the file or the {MAX_HEADER_BYTES}-byte limit "
                "(corrupt or truncated file)"
            )
        raw = f.read(n)
    header = _parse_header_json(path, raw)
    metadata = _header_metadata(path, header.pop("__metadata__", None))
    data_start, data_len = 8 + n, size - 8 - n
    infos = {name: _parse_entry(path, name, entry, data_start) for name, entry in header.items()}
    _check_ranges(path, infos, data_start, data_len)
    _check_data_covered(path, infos, data_start, data_len)
    return infos, metadata


def _parse_entry(path: Path, name: object, entry: object, data_start: int) -> TensorInfo:
    if not isinstance(name, str) or not isinstance(entry, dict):
        raise CheckpointError(f"{path}: malformed header entry {name!r}")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in SAFE_DTYPES:
        raise CheckpointError(f"{path}: tensor {name!r} has unsupported dtype {dtype!r}")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise CheckpointError(f"{path}: tensor {name!r} has an invalid shape {shape!r}")
    ok_offsets = isinstance(offsets, list) and len(offsets) == 2
    if not ok_offsets or not all(type(o) is int and o >= 0 for o in offsets):  # type: ignore[union-attr]
        raise CheckpointError(f"{path}: tensor {name!r} has invalid data_offsets {offsets!r}")
    begin, end = offsets  # type: ignore[misc]
    info = TensorInfo(name, SAFE_DTYPES[dtype], tuple(shape), path, data_start + begin)
    if end - begin != info.nbytes:
        raise CheckpointError(
            f"{path}: tensor {name!r} covers {end - begin} bytes but {dtype} x {shape} needs {info.nbytes}"
        )
    return info


def _check_ranges(path: Path, infos: dict[str, TensorInfo], data_start: int, data_len: int) -> None:
    spans = sorted((i.offset - data_start, i.offset - data_start + i.nbytes, i.name) for i in infos.values())
    prev_end, prev_name = 0, ""
    for begin, end, name in spans:
        if end > data_len:
            raise CheckpointError(
                f"{path}: tensor {name!r} ends at byte {end} but the file holds {data_len} data bytes "
                "(truncated download? fetch the file again)"
            )
        if begin < prev_end:
            raise CheckpointError(f"{path}: tensors {prev_name!r} and {name!r} overlap in the file")
        prev_end, prev_name = max(prev_end, end), name


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror})") from None


def _parse_header_json(path: Path, raw: bytes) -> dict[str, Any]:
    """The header object of a safetensors file, as strict as the safetensors library."""
    header = loads_strict(raw, f"{path}: safetensors header")
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: the safetensors header is not a JSON object")
    if not raw.startswith(b"{"):  # the safetensors library refuses leading whitespace too
        raise CheckpointError(
            f"{path}: the safetensors header is not valid JSON for safetensors (must start with '{{')"
        )
    return header


def _header_metadata(path: Path, meta: object) -> dict[str, str]:
    """``__metadata__``: absent, null or a mapping of strings to strings (else refused, as the library does)."""
    if meta is None:
        return {}
    if not isinstance(meta, Mapping) or not all(isinstance(v, str) for v in meta.values()):
        raise CheckpointError(f"{path}: __metadata__ must map strings to strings (got {str(meta)[:80]}); re-export it")
    return dict(meta)


def _check_data_covered(path: Path, infos: Mapping[str, TensorInfo], data_start: int, data_len: int) -> None:
    """The tensors must cover the data bytes exactly, from 0 to the end of the file (no gaps, no trailing bytes)."""
    spans = sorted((i.offset - data_start, i.offset - data_start + i.nbytes, i.name) for i in infos.values())
    pos = 0
    for begin, end, name in spans:
        if begin != pos:
            raise CheckpointError(
                f"{path}: bytes {pos}:{begin} before tensor {name!r} belong to no tensor (corrupt file)"
            )
        pos = end
    if pos != data_len:
        raise CheckpointError(
            f"{path}: {data_len - pos} trailing bytes after the last tensor belong to no tensor (corrupt file)"
        )
