"""What GGUF reading and writing share: the ``gguf`` package, the architectures, names and the q/k row order.

**Names.** llama.cpp names a tensor ``blk.N.attn_q.weight`` where the Hugging Face checkpoint says
``model.layers.N.self_attn.q_proj.weight``; the ``gguf`` package's ``TensorNameMap`` maps the second to the
first (``gguf_name``), and a reader inverts it over the names a model of the config has.

**Row order.** For Llama-family weights llama.cpp's converter reorders the rows of ``q_proj`` and ``k_proj``
inside each head: with head size ``d``, HF row ``h·d + j·d/2 + i`` (``j`` in {0, 1}, ``i < d/2``, the halves
rotary embedding pairs up) is stored at row ``h·d + 2i + j`` (interleaved pairs). ``permute_rows`` applies
that order and ``unpermute_rows`` undoes it, per whole head, so a range of heads can be converted alone.
``k_proj`` uses the number of key/value heads.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from agentmerge.errors import CheckpointError

READ_ARCHS = ("llama", "qwen2", "qwen3")  # GGUF general.architecture values read and written
PERMUTED_ARCHS = ("llama",)  # whose q/k rows llama.cpp interleaves
GGUF_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}  # HF model_type -> GGUF


def require_gguf(what: str) -> ModuleType:
    """The ``gguf`` package, or one line saying how to install it."""
    try:
        import gguf
    except ImportError:
        raise CheckpointError(
            f"{what}: GGUF files need the gguf package; pip install 'agentmerge[gguf]' (or pip install gguf)"
        ) from None
    return gguf


def name_map(arch: str, layers: int) -> Any:
    """The ``gguf`` package's HF -> GGUF name table for ``arch`` (a GGUF architecture name) and ``layers`` blocks."""
    gguf = require_gguf(arch)
    key = next((k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), None)
    if key is None:
        raise CheckpointError(f"architecture {arch!r} is unknown to the installed gguf package (upgrade it)")
    return gguf.get_tensor_name_map(key, layers)


def gguf_name(table: Any, hf_name: str) -> str | None:
    """``model.layers.0.self_attn.q_proj.weight`` -> ``blk.0.attn_q.weight`` (None when the table has no name)."""
    stem, _, suffix = hf_name.rpartition(".")
    if suffix in ("weight", "bias"):
        found = table.get_name(stem)
        return None if found is None else f"{found}.{suffix}"
    found = table.get_name(hf_name)
    return None if found is None else str(found)


def permuted_heads(arch: str, gguf_tensor: str, config: dict[str, Any]) -> int | None:
    """How many heads the rows of ``gguf_tensor`` are interleaved in (None when they are stored as in HF)."""
    if arch not in PERMUTED_ARCHS:
        return None
    heads = int(config["num_attention_heads"])
    if ".attn_q." in gguf_tensor:
        return heads
    if ".attn_k." in gguf_tensor:
        return int(config.get("num_key_value_heads") or heads)
    return None


def unpermute_rows(rows: np.ndarray, heads: int) -> np.ndarray:
    """GGUF row order -> HF row order for ``rows`` spanning ``heads`` whole heads (``[heads·d, cols]``)."""
    d = rows.shape[0] // heads
    return rows.reshape(heads, d // 2, 2, -1).swapaxes(1, 2).reshape(rows.shape)


def permute_rows(rows: np.ndarray, heads: int) -> np.ndarray:
    """HF row order -> GGUF row order (the inverse of ``unpermute_rows``)."""
    d = rows.shape[0] // heads
    return rows.reshape(heads, 2, d // 2, -1).swapaxes(1, 2).reshape(rows.shape)
