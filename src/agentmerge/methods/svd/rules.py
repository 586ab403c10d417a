"""Which tensors the SVD methods decompose, what each holds and which SVDs it runs (no torch).

Read from the reference code (``../shared/field-methods.md`` names the files and commits):

- ``tsv``, ``iso_c``, ``iso_cts`` and the SVC calibration decompose every 2-D tensor; embeddings and the LM
  head (``groups.module_type`` "embedding") too, as the references do, unless ``svd_embeddings`` is false, which
  gives them the method's rule for other tensors (the mean of the task vectors; SVC leaves them alone).
- ``cart`` decomposes the "low-rank keys": names with ``attn`` or ``mlp`` and without ``ln`` or ``bias``, and
  (unlike the reference, which would crash on Qwen3's 1-D ``q_norm``) only 2-D ones; ``rank_ratio`` 0 or 1 needs
  no SVD at all (CART is then the plain average).
- ``resmerge`` decomposes every 2-D tensor whose name (lower-cased) names no embedding / LM head
  (``embed_tokens``, ``wte``, ``lm_head``, ``word_embeddings``) and no norm (``norm``, ``ln_``, ``layernorm``).
  It refuses tensors that are not 1-D or 2-D, as the reference does.

``svds`` lists the ``(rows, cols)`` of each SVD a kernel runs on one tensor of shape ``m x n`` with
``k = min(m, n)`` and N models: TSV N of ``m x n`` and the two polar factors (``m x N r``, ``N r x n``), Iso-C
one, Iso-CTS N + 1 and two polar factors, CART and ResMerge N, SVC one. The ``*_WHOLE`` constants are the
registry's ``Needs.whole`` (``*_check`` its ``Needs.check_tensor``); their ``copies`` (how many float32 copies
of the tensor a kernel holds at once beyond the N + 1 inputs, LAPACK's work space included) are the largest
that ``benchmarks/svd_speed.py --memory`` measured over tall, square and wide matrices (a square one costs the
most: its U and V^T are each as large as the matrix), rounded up.
"""

from __future__ import annotations

from agentmerge.methods.hooks import WholeTensor
from agentmerge.methods.matrices import Shape, Svds, held, is_matrix
from agentmerge.methods.params import Params

# --------------------------------------------------------------------------- CART


def cart_key(name: str) -> bool:
    """CART's low-rank key rule, exactly as the reference writes it (case-sensitive substrings)."""
    return ("attn" in name or "mlp" in name) and not ("ln" in name or "bias" in name)


def cart_wanted(name: str, shape: Shape, params: Params) -> bool:
    ratio = float(params.get("rank_ratio", 0.12))
    return len(shape) == 2 and min(shape) > 0 and cart_key(name) and 0.0 < ratio < 1.0


def cart_check(name: str, shape: Shape, params: Params, n: int) -> None:
    if len(shape) > 2 and cart_key(name):
        raise ValueError(
            f"cart: tensor {name!r} has shape {list(shape)}; CART's low-rank step needs 2-D matrices "
            "(exclude it, e.g. exclude: ['*experts*'], to copy it from the base)"
        )


# --------------------------------------------------------------------------- ResMerge

_ATTENTION = ("self_attn", ".attn.", "attention", "q_proj", "k_proj", "v_proj", "o_proj")
_FFN = ("mlp", "ffn", "feed_forward", "gate_proj", "up_proj", "down_proj")
_NORM = ("norm", "ln_", "layernorm")
_EMBEDDING = ("embed_tokens", "wte", "lm_head", "word_embeddings")


def _has(name: str, parts: tuple[str, ...]) -> bool:
    text = name.lower()
    return any(p in text for p in parts)


def resmerge_family(name: str) -> bool:
    """Whether the name is attention or FFN (ResMerge's residual score counts only there)."""
    return _has(name, _ATTENTION) or _has(name, _FFN)


def resmerge_wanted(name: str, shape: Shape, params: Params) -> bool:
    """ResMerge mode: 2-D, not an embedding, LM head or norm (those get the mean of the experts)."""
    return len(shape) == 2 and min(shape) > 0 and not _has(name, _EMBEDDING) and not _has(name, _NORM)


def resmerge_check(name: str, shape: Shape, params: Params, n: int) -> None:
    if len(shape) not in (1, 2):
        raise ValueError(
            f"resmerge: tensor {name!r} has shape {list(shape)}; ResMerge merges 1-D and 2-D tensors only "
            "(exclude it to copy it from the base)"
        )


# --------------------------------------------------------------------------- Iso-CTS


def cts_sizes(k: int, n: int, fraction: float) -> tuple[int, int]:
    """Iso-CTS's common size c and per-task size d for ``k = min(m, n)`` and n models, as the reference rounds."""
    common = int(k * fraction)
    task_total = round((k - common) / n) * n  # Python's round: halves to even, as the reference
    common = k - task_total
    return common, int((k - common) / n)


def cts_check(name: str, shape: Shape, params: Params, n: int) -> None:
    if is_matrix(name, shape, params) and cts_sizes(min(shape), n, float(params["common_space_fraction"]))[0] < 0:
        raise ValueError(
            f"iso_cts: tensor {name!r} ({list(shape)}) with {n} models and common_space_fraction "
            f"{params['common_space_fraction']} leaves a negative common space; raise common_space_fraction"
        )


# --------------------------------------------------------------------------- the SVDs each kernel runs


def _mn(shape: Shape) -> tuple[int, int, int]:
    m, n = shape
    return m, n, min(m, n)


def tsv_svds(shape: Shape, params: Params, n: int) -> Svds:
    m, cols, k = _mn(shape)
    p = int(k * (1.0 / n)) * n
    return ((m, cols),) * n + ((m, p), (p, cols))


def iso_c_svds(shape: Shape, params: Params, n: int) -> Svds:
    return (_mn(shape)[:2],)


def iso_cts_svds(shape: Shape, params: Params, n: int) -> Svds:
    m, cols, k = _mn(shape)
    return ((m, cols),) * (n + 1) + ((m, k), (k, cols))


def per_model_svds(shape: Shape, params: Params, n: int) -> Svds:
    return (_mn(shape)[:2],) * n


# --------------------------------------------------------------------------- the registry's entries (``Needs.whole``)

# copies: the most ``benchmarks/svd_speed.py --memory`` measured (a square matrix), rounded up
TSV_WHOLE = WholeTensor(is_matrix, tsv_svds, held(7.0))
ISO_C_WHOLE = WholeTensor(is_matrix, iso_c_svds, held(5.0))
ISO_CTS_WHOLE = WholeTensor(is_matrix, iso_cts_svds, held(12.0))
CART_WHOLE = WholeTensor(cart_wanted, per_model_svds, held(9.0))
RESMERGE_WHOLE = WholeTensor(resmerge_wanted, per_model_svds, held(10.0))
