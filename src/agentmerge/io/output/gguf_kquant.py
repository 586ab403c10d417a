"""Q6_K quantization (the ``gguf`` package only dequantizes K-quants), written from the block layout.

A Q6_K block holds 256 values in 210 bytes: ``ql`` (128 bytes, the low 4 bits of each 6-bit code), ``qh``
(64 bytes, the high 2 bits), ``scales`` (16 signed bytes, one per 16 values) and ``d`` (float16). Value ``p``
of the block is ``d · scales[p // 16] · (q_p - 32)`` with ``q_p`` in 0..63. Position ``p = 128h + 64s + b``
(``h, s`` in {0, 1}, ``b < 64``) keeps its low bits in nibble ``s`` of ``ql[64h + b]``; position
``p = 128h + 32t + j`` (``t < 4``, ``j < 32``) keeps its high bits in bits ``2t, 2t + 1`` of ``qh[32h + j]``.

Scales: each 16-value group gets step ``σ_g = max|x| / 31`` (codes -31..31 never clip), stored as
``sc_g = ⌈σ_g / d⌉`` with ``d = max_g σ_g / 127`` (rounded to float16 first, so ``sc_g <= 127``). This is a
plain round-to-nearest quantizer, not llama.cpp's error-minimizing search: valid Q6_K, slightly coarser.
"""

from __future__ import annotations

import numpy as np

BLOCK = 256
BLOCK_BYTES = 210


def quantize_q6_k(rows: np.ndarray) -> np.ndarray:
    """``[..., n·256]`` float32 -> ``[..., n·210]`` uint8 Q6_K blocks."""
    shape = rows.shape
    blocks = np.asarray(rows, dtype=np.float32).reshape(-1, BLOCK)
    n = blocks.shape[0]
    groups = blocks.reshape(n, 16, 16)
    sigma = np.abs(groups).max(axis=2) / 31.0
    d16 = (sigma.max(axis=1) / 127.0).astype(np.float16)
    d = d16.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] > 0, np.ceil(sigma / d[:, None]), 0.0)
        sc = np.clip(sc, 0, 127).astype(np.int8)
        step = d[:, None] * sc.astype(np.float32)
        codes = np.where(step[:, :, None] > 0, np.rint(groups / step[:, :, None]), 0.0)
    q = (np.clip(codes, -32, 31).astype(np.int16) + 32).astype(np.uint8).reshape(n, BLOCK)
    low = (q & 0x0F).reshape(n, 2, 2, 64)
    ql = low[:, :, 0, :] | (low[:, :, 1, :] << 4)
    high = (q >> 4).reshape(n, 2, 4, 32)
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    packed = np.concatenate(
        [ql.reshape(n, 128), qh.reshape(n, 64), sc.view(np.uint8), d16.reshape(n, 1).view(np.uint8)], axis=1
    )
    return packed.reshape(*shape[:-1], shape[-1] // BLOCK * BLOCK_BYTES)
