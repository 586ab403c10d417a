"""A ``.gguf`` file (or a folder holding exactly one) read as a model: HF names, rows dequantized on demand.

The file is opened with the ``gguf`` package's memory-mapped ``GGUFReader``; nothing is read until a range of a
tensor is asked for. A read of elements ``[start, stop)`` of a tensor with ``c`` columns dequantizes rows
``⌊start/c⌋ .. ⌈stop/c⌉`` only (GGUF quantizes each row in blocks of 32 or 256 values, so a row range is a
byte range), widened to whole heads for the Llama q/k rows llama.cpp reorders (``gguf_names``): memory holds
one chunk's rows, never a whole model or a whole tensor. Values are as llama.cpp computes them:
``gguf.quants.dequantize`` (F32, F16 and BF16 exactly; quantized types as float32).

config.json and the tokenizer are recovered from the metadata with transformers' GGUF support (its public
``AutoConfig`` / ``AutoTokenizer`` ``gguf_file=`` loaders) into a side folder in agentmerge's cache, keyed by the
file's identity (``cache.file_key``), which ``folder`` points to: the engine finds config.json, the tokenizer
and the chat template there as it does in a model folder. The tensor names are those of the model
transformers builds from that config (on the meta device, no memory), mapped through ``gguf_names``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentmerge.errors import CheckpointError
from agentmerge.io.cache.store import cache_dir, file_key
from agentmerge.io.formats.gguf_names import (
    READ_ARCHS,
    gguf_name,
    name_map,
    permuted_heads,
    require_gguf,
    unpermute_rows,
)
from agentmerge.io.formats.tensorfile import BIN_FILE, INDEX_FILE, SINGLE_FILE, TensorInfo

SIDE_VERSION = "1"  # bump when what the side folder holds changes
SKIPPED = frozenset({"rope_freqs.weight"})  # computed from config.json by transformers: no HF tensor
EXACT = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}  # stored dtype; others read as float32


def is_gguf(path: Path) -> bool:
    """A ``.gguf`` file, or a folder with a ``.gguf`` file and no safetensors / pytorch weights."""
    try:
        if path.is_file():
            return path.suffix.lower() == ".gguf"
        if not path.is_dir() or any((path / n).exists() for n in (SINGLE_FILE, INDEX_FILE, BIN_FILE)):
            return False
        return any(path.glob("*.gguf"))
    except OSError:
        return False


def gguf_file(path: Path) -> Path:
    """The ``.gguf`` file ``path`` names: itself, or the only one in the folder."""
    if path.is_file():
        return path
    found = sorted(path.glob("*.gguf"))
    if len(found) != 1:
        names = ", ".join(p.name for p in found[:4])
        raise CheckpointError(f"{path}: holds {len(found)} .gguf files ({names}); pass the one you mean as a file")
    return found[0]


class _Entry:
    """One GGUF tensor: its memory-mapped rows, quantization type and head interleave."""

    def __init__(self, tensor: Any, heads: int | None) -> None:
        self.tensor, self.heads = tensor, heads
        self.qtype = tensor.tensor_type
        self.cols = int(tensor.shape[0])  # GGUF lists dimensions innermost first
        self.rows = int(tensor.n_elements) // max(self.cols, 1)


class GgufCheckpoint:
    """A GGUF file read like a ``Checkpoint``: HF tensor names and shapes, element-range reads."""

    def __init__(self, ref: str | Path) -> None:
        self.ref = str(ref)
        self.path = gguf_file(Path(ref).expanduser())
        gguf = require_gguf(str(self.path))
        self.reader = open_reader(gguf, self.path)
        self.arch = str(field(self.reader, "general.architecture", self.path))
        if self.arch not in READ_ARCHS:
            raise CheckpointError(
                f"{self.path}: GGUF architecture {self.arch!r} is not read yet (reads {', '.join(READ_ARCHS)}); "
                "convert it to safetensors with transformers (from_pretrained(..., gguf_file=...)) and pass that folder"
            )
        check_types(gguf, self.path, self.reader)
        self.folder = self._side_folder()
        self.metadata: dict[Path, dict[str, str]] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self.entries: dict[str, _Entry] = {}
        self.quant_types: dict[str, str] = {}  # HF name -> GGUF type name, every tensor
        self._index()

    def __enter__(self) -> GgufCheckpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Nothing to release: the memory map closes with the reader."""

    @property
    def weight_files(self) -> list[Path]:
        return [self.path]

    def read(self, name: str, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Elements ``[start, stop)`` of tensor ``name``, flattened, in the stored dtype (float32 when quantized)."""
        info = self.tensors[name]
        stop = info.numel if stop is None else stop
        if not 0 <= start <= stop <= info.numel:
            raise IndexError(f"{name}: elements {start}:{stop} out of range (it has {info.numel})")
        e = self.entries[name]
        r0, r1 = start // e.cols, -(-stop // e.cols)
        rows = self.hf_rows(name, r0, r1)
        flat = torch.from_numpy(np.require(rows, np.float32, ["C", "W"])).reshape(-1)[
            start - r0 * e.cols : stop - r0 * e.cols
        ]
        return flat.to(info.dtype)

    def read_into(self, name: str, start: int, out: torch.Tensor) -> torch.Tensor:
        return out.copy_(self.read(name, start, start + out.numel()))

    def hf_rows(self, name: str, r0: int, r1: int) -> np.ndarray:
        """Rows ``r0:r1`` of ``name`` in HF order, float32 ``[r1 - r0, cols]``."""
        e = self.entries[name]
        if e.heads is None:
            return self._gguf_rows(e, r0, r1)
        per = e.rows // e.heads
        h0, h1 = r0 // per, -(-r1 // per)
        rows = unpermute_rows(self._gguf_rows(e, h0 * per, h1 * per), h1 - h0)
        return rows[r0 - h0 * per : r1 - h0 * per]

    def _gguf_rows(self, e: _Entry, r0: int, r1: int) -> np.ndarray:
        gguf = require_gguf(str(self.path))
        raw = e.tensor.data.reshape(e.rows, -1)[r0:r1]
        try:
            values = gguf.quants.dequantize(np.asarray(raw), e.qtype)
        except Exception as err:  # a short mapping (file changed on disk) or a block the type cannot decode
            raise CheckpointError(
                f"{self.path}: cannot dequantize tensor {e.tensor.name!r} ({type(err).__name__}: {err}); "
                "the file is corrupt or changed on disk"
            ) from None
        return np.asarray(values, dtype=np.float32).reshape(r1 - r0, e.cols)

    def _index(self) -> None:
        config = json.loads((self.folder / "config.json").read_text())
        by_gguf = {t.name: t for t in self.reader.tensors}
        table = name_map(self.arch, int(config["num_hidden_layers"]))
        used: set[str] = set()
        for hf, shape in hf_shapes(self.folder).items():
            g = gguf_name(table, hf)
            if g is None or g not in by_gguf:
                if config.get("tie_word_embeddings") and g == "output.weight":
                    continue  # a tied head: the embedding is the only copy, as in a safetensors checkpoint
                raise CheckpointError(
                    f"{self.path}: no GGUF tensor for {hf!r} (expected {g!r}); the file is incomplete"
                )
            self._add(hf, shape, by_gguf[g], config)
            used.add(g)
        extra = sorted(set(by_gguf) - used - SKIPPED)
        if extra:
            raise CheckpointError(
                f"{self.path}: GGUF tensor {extra[0]!r} has no Hugging Face name for {self.arch} ({len(extra)} such); "
                "refusing to drop it"
            )

    def _add(self, hf: str, shape: tuple[int, ...], tensor: Any, config: dict[str, Any]) -> None:
        gshape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        if gshape != shape:
            raise CheckpointError(
                f"{self.path}: tensor {tensor.name!r} has shape {list(gshape)}, but {hf!r} of its config.json has "
                f"{list(shape)}; the metadata and the tensors disagree (corrupt file?)"
            )
        qname = tensor.tensor_type.name
        dtype = EXACT.get(qname, torch.float32)
        self.tensors[hf] = TensorInfo(hf, dtype, shape, self.path, int(tensor.data_offset))
        self.entries[hf] = _Entry(tensor, permuted_heads(self.arch, tensor.name, config))
        self.quant_types[hf] = qname

    def _side_folder(self) -> Path:
        """config.json and tokenizer files recovered from the metadata, kept by the file's identity in the cache
        (in the system's temporary folder when the cache cannot be written)."""
        digest = hashlib.blake2b(f"{SIDE_VERSION}|{file_key(self.path)}".encode(), digest_size=12).hexdigest()
        for root in (cache_dir() / "gguf", Path(tempfile.gettempdir()) / "agentmerge-gguf"):
            folder = root / digest
            if (folder / "config.json").is_file():
                return folder
            try:
                root.mkdir(parents=True, exist_ok=True)
                tmp = Path(tempfile.mkdtemp(prefix=f".{digest}.tmp-", dir=root))
            except OSError:
                continue
            try:
                recover_model_files(self.path, tmp, self._head_dim())
                with contextlib.suppress(OSError):  # another process may have published it first: either is fine
                    os.rename(tmp, folder)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            if (folder / "config.json").is_file():
                return folder
        raise CheckpointError(
            f"{self.path}: cannot write the config.json and tokenizer recovered from it (in {cache_dir()} or the "
            "temporary folder); set AGENTMERGE_CACHE to a writable folder"
        )

    def _head_dim(self) -> int | None:
        """``attention.key_length`` when the file states it (transformers' config loader ignores it)."""
        entry = self.reader.fields.get(f"{self.arch}.attention.key_length")
        return None if entry is None else int(entry.contents())


def open_reader(gguf: Any, path: Path) -> Any:
    """``GGUFReader`` over ``path`` (memory-mapped, read-only), or one line saying what is wrong with the file."""
    try:
        return gguf.GGUFReader(path, "r")
    except ValueError as e:
        if "GGMLQuantizationType" in str(e):
            raise CheckpointError(
                f"{path}: a tensor has a quantization type the gguf package does not know ({e}); "
                "upgrade gguf, or requantize the file to a common type (Q8_0, Q4_K, F16)"
            ) from None
        raise _corrupt(path, e) from None
    except Exception as e:
        raise _corrupt(path, e) from None


def _corrupt(path: Path, e: Exception) -> CheckpointError:
    why = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
    return CheckpointError(f"{path}: not a readable GGUF file ({why}); it is truncated or corrupt, fetch it again")


def check_types(gguf: Any, path: Path, reader: Any) -> None:
    """Every quantization type in the file can be dequantized by the installed gguf package (one block tried)."""
    for qtype in {t.tensor_type for t in reader.tensors}:
        size = gguf.GGML_QUANT_SIZES[qtype][1]
        try:
            gguf.quants.dequantize(np.zeros((1, size), dtype=np.uint8), qtype)
        except NotImplementedError:
            raise CheckpointError(
                f"{path}: tensors of type {qtype.name} cannot be dequantized by the installed gguf package; "
                "requantize the file to a common type (Q8_0, Q4_K, F16)"
            ) from None


def field(reader: Any, key: str, path: Path) -> Any:
    """The value of metadata ``key``, or one line naming it."""
    entry = reader.fields.get(key)
    if entry is None:
        raise CheckpointError(f"{path}: GGUF metadata lacks {key!r}; not a model file")
    return entry.contents()


def recover_model_files(path: Path, folder: Path, head_dim: int | None = None) -> None:
    """config.json (with ``architectures``, and ``head_dim`` when given) and the tokenizer files of GGUF ``path``,
    written into ``folder``."""
    try:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise CheckpointError(
            f"{path}: recovering config.json and the tokenizer from a GGUF file needs transformers "
            "(pip install 'agentmerge[hf]')"
        ) from None
    quiet = logging.getLogger("transformers")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
        if head_dim is not None and hasattr(config, "head_dim"):
            config.head_dim = head_dim
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
        config.architectures = [type(model).__name__]
        config.save_pretrained(folder)
        AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name).save_pretrained(folder)
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(
            f"{path}: cannot recover config.json and the tokenizer from its metadata "
            f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})"
        ) from None
    finally:
        quiet.setLevel(level)


def hf_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """``{name: shape}`` of the checkpoint transformers would save for ``folder/config.json`` (built on meta)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(folder))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}
