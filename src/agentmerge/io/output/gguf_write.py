"""A model folder (anything ``formats.open.open_weights`` reads) written as one GGUF file llama.cpp loads.

Streamed and atomic: every tensor's GGUF name, shape, type and byte size are known up front (the header
and tensor table are written first), then each tensor is read whole, converted and appended, one at a
time, into a hidden sibling of the output that replaces it in one rename when complete (nothing is left
behind on failure). Types: ``F32``, ``F16``, ``BF16``, ``Q8_0``, ``Q5_1``, ``Q5_0``, ``Q4_1``, ``Q4_0``
(``gguf.quants.quantize``, bit-exact with llama.cpp) and ``Q6_K`` (``gguf_kquant``). As llama.cpp's converter
does, 1-D tensors (norms, biases) stay F32 and a matrix whose rows do not split into the type's blocks
is written F16.

Metadata: the architecture's hyper-parameters from config.json (llama, mistral as llama with its q/k
rows interleaved, qwen2, qwen3); the tokenizer as a byte-level BPE (``tokenizer.ggml.model = gpt2``: tokens,
types, merges), its special token ids, ``add_bos``/``add_eos`` and the chat template (``gguf.SpecialVocab``).
With ``tokenizer_gguf`` every ``tokenizer.*`` field is copied from that GGUF instead (what a merge of GGUF
inputs does: llama.cpp's pre-tokenizer name survives).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agentmerge.errors import CheckpointError, ConfigError
from agentmerge.io.formats.checkpoint import Readable
from agentmerge.io.formats.gguf_names import GGUF_ARCH, gguf_name, name_map, permute_rows, permuted_heads, require_gguf
from agentmerge.io.guards import jsontext
from agentmerge.io.guards.safety import write_report_with
from agentmerge.io.output.gguf_kquant import quantize_q6_k

OUT_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_1", "Q5_0", "Q4_1", "Q4_0")
FILE_TYPE = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q6_K": 18, "BF16": 32}
PRE_TOKENIZER = {"qwen2": "qwen2", "qwen3": "qwen2"}  # llama.cpp's pre-tokenizer names by model_type


def check_out_type(name: str, flag: str = "--type") -> str:
    """``name`` upper-cased if it is a type agentmerge writes, else one line listing them."""
    if name.upper() in OUT_TYPES:
        return name.upper()
    raise ConfigError(f"{flag}: GGUF type {name!r} is not written; use one of {', '.join(OUT_TYPES)}")


@dataclass(frozen=True)
class _Plan:
    """One output tensor: HF name, GGUF name, shape (numpy order), type and q/k head interleave."""

    hf: str
    name: str
    shape: tuple[int, ...]
    qtype: str
    heads: int | None


def export_gguf(model: Readable, out: Path, qtype: str, *, tokenizer_gguf: Path | None = None) -> int:
    """Write ``model`` as GGUF ``out`` (atomically); returns the number of tensors written."""
    gguf = require_gguf(str(out))
    qtype = check_out_type(qtype)
    if out.suffix.lower() != ".gguf":
        raise ConfigError(f"{out}: the output file of a GGUF export must end in .gguf")
    if out.expanduser().resolve() in {f.resolve() for f in model.weight_files}:
        raise CheckpointError(f"{out}: is an input of this export; write the GGUF elsewhere")
    config = _config(model.folder)
    arch = GGUF_ARCH.get(str(config.get("model_type")))
    if arch is None:
        raise CheckpointError(
            f"{model.folder}: model_type {config.get('model_type')!r} is not written as GGUF "
            f"(writes {', '.join(GGUF_ARCH)})"
        )
    plans = _plans(model, config, arch, qtype)
    write_report_with(out, "GGUF", lambda tmp: _write(gguf, tmp, model, config, arch, plans, qtype, tokenizer_gguf))
    return len(plans)


def _config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{folder}: no config.json; a GGUF export needs the model's config")
    data = json.loads(path.read_text())
    rope = data.get("rope_parameters") or data.get("rope_scaling") or {}
    kind = rope.get("rope_type") or rope.get("type") or "default"
    if kind != "default":
        raise CheckpointError(f"{path}: rope type {kind!r} is not written as GGUF yet (only the default rope)")
    return dict(data)


def _plans(model: Readable, config: dict[str, Any], arch: str, qtype: str) -> list[_Plan]:
    table = name_map(arch, int(config["num_hidden_layers"]))
    plans = []
    for hf, info in model.tensors.items():
        name = gguf_name(table, hf)
        if name is None:
            raise CheckpointError(f"{model.folder}: tensor {hf!r} has no GGUF name for {arch}; refusing to drop it")
        if config.get("tie_word_embeddings") and name == "output.weight":
            continue  # llama.cpp ties the head to token_embd when output.weight is absent
        plans.append(_Plan(hf, name, info.shape, _tensor_type(info.shape, qtype), permuted_heads(arch, name, config)))
    return plans


def _tensor_type(shape: tuple[int, ...], qtype: str) -> str:
    if len(shape) < 2:
        return "F32"
    gguf = require_gguf(qtype)
    block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]][0]
    return qtype if shape[-1] % block == 0 else "F16"


def _nbytes(gguf: Any, shape: tuple[int, ...], qtype: str) -> int:
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    return int(math.prod(shape) // block * size)


def _write(
    gguf: Any,
    path: Path,
    model: Readable,
    config: dict[str, Any],
    arch: str,
    plans: list[_Plan],
    qtype: str,
    tokenizer_gguf: Path | None,
) -> None:
    writer = gguf.GGUFWriter(path, arch)
    try:
        _hyper(writer, config, arch, qtype)
        if tokenizer_gguf is not None:
            copy_tokenizer_fields(gguf, writer, tokenizer_gguf)
        else:
            _tokenizer(gguf, writer, model.folder, config)
        for p in plans:
            t = gguf.GGMLQuantizationType[p.qtype]
            writer.add_tensor_info(p.name, p.shape, np.dtype(np.float32), _nbytes(gguf, p.shape, p.qtype), t)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for p in plans:
            writer.write_tensor_data(_encode(gguf, model, p))
    finally:
        writer.close()


def _encode(gguf: Any, model: Readable, p: _Plan) -> np.ndarray:
    values = model.read(p.hf).float().numpy().reshape(p.shape)
    if p.heads is not None:
        values = permute_rows(values.reshape(p.shape[0], -1), p.heads).reshape(p.shape)
    if p.qtype == "F32":
        return np.ascontiguousarray(values, dtype=np.float32)
    if p.qtype == "F16":
        return values.astype(np.float16)
    if p.qtype == "Q6_K":
        return quantize_q6_k(values)
    return np.asarray(gguf.quants.quantize(values, gguf.GGMLQuantizationType[p.qtype]))


def _hyper(writer: Any, config: dict[str, Any], arch: str, qtype: str) -> None:
    """The hyper-parameters llama.cpp reads for llama / qwen2 / qwen3."""
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or config["hidden_size"] // heads)
    rope = config.get("rope_parameters") or {}
    writer.add_name(str(config.get("_name_or_path") or arch))
    writer.add_context_length(int(config.get("max_position_embeddings", 4096)))
    writer.add_embedding_length(int(config["hidden_size"]))
    writer.add_block_count(int(config["num_hidden_layers"]))
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_head_count(heads)
    writer.add_head_count_kv(int(config.get("num_key_value_heads") or heads))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))
    writer.add_rope_freq_base(float(rope.get("rope_theta") or config.get("rope_theta") or 10000.0))
    writer.add_rope_dimension_count(head_dim)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_vocab_size(int(config["vocab_size"]))
    writer.add_file_type(FILE_TYPE[qtype])
    if qtype not in ("F32", "F16", "BF16"):
        writer.add_quantization_version(2)


def _tokenizer(gguf: Any, writer: Any, folder: Path, config: dict[str, Any]) -> None:
    """A byte-level BPE tokenizer.json as ``tokenizer.ggml.*`` (tokens padded to ``vocab_size``)."""
    path = folder / "tokenizer.json"
    data = json.loads(path.read_text()) if path.is_file() else {}
    model = data.get("model") or {}
    if model.get("type") != "BPE" or "ByteLevel" not in jsontext.dumps(data.get("pre_tokenizer")):
        raise CheckpointError(
            f"{folder}: GGUF export writes byte-level BPE tokenizers (tokenizer.json); this one is not "
            "(pass a GGUF of the same model to copy its tokenizer from)"
        )
    vocab: dict[int, str] = {int(i): t for t, i in model["vocab"].items()}
    kinds: dict[int, int] = {}
    for added in data.get("added_tokens", []):
        vocab[int(added["id"])] = added["content"]
        kinds[int(added["id"])] = gguf.TokenType.CONTROL if added.get("special") else gguf.TokenType.USER_DEFINED
    size = max(int(config["vocab_size"]), max(vocab) + 1)
    tokens = [vocab.get(i, f"[PAD{i}]") for i in range(size)]
    types = [kinds.get(i, gguf.TokenType.NORMAL if i in vocab else gguf.TokenType.UNUSED) for i in range(size)]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre_tokenizer(data, config))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    gguf.SpecialVocab(folder, load_merges=True, n_vocab=size).add_to_gguf(writer, quiet=True)


def pre_tokenizer(tokenizer: dict[str, Any], config: dict[str, Any]) -> str:
    """llama.cpp's name for the text splitting before BPE: GPT-2's regex for a bare ``ByteLevel`` (what
    ``use_regex`` applies), Qwen's for qwen2 / qwen3, else ``default``."""
    pre = tokenizer.get("pre_tokenizer") or {}
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
        return "gpt-2"
    return PRE_TOKENIZER.get(str(config.get("model_type")), "default")


def copy_tokenizer_fields(gguf: Any, writer: Any, source: Path) -> None:
    """Every ``tokenizer.*`` metadata field of GGUF ``source``, as stored."""
    reader = gguf.GGUFReader(source, "r")
    for key, entry in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        kind = entry.types[0]
        sub = entry.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, entry.contents(), kind, sub_type=sub)


def export_with(
    open_model: Callable[[str], Readable], source: str, out: Path, qtype: str, tokenizer_gguf: Path | None = None
) -> int:
    """``export_gguf`` of the model ``open_model(source)`` opens, closed afterwards."""
    model = open_model(source)
    try:
        return export_gguf(model, out, qtype, tokenizer_gguf=tokenizer_gguf)
    finally:
        model.close()
