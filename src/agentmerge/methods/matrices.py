"""Which tensors count as matrices for an SVD, and what an SVD costs (no torch).

Shared by the SVD methods (``methods.svd``), the SVC post-step (``poststeps``) and the dry run's estimate
(``engine.svdcost``). A thin SVD of an ``m x n`` matrix, ``m >= n``, costs ``4 m n^2 + 8 n^3`` flops (LAPACK gesdd).
"""

from __future__ import annotations

from collections.abc import Callable

from agentmerge.methods.groups import module_type
from agentmerge.methods.hooks import WholeTensor
from agentmerge.methods.params import Params

Shape = tuple[int, ...]


Svds = tuple[tuple[int, int], ...]


def is_vocab(name: str) -> bool:
    """An embedding or LM head, by name (``model.embed_tokens.weight``, ``lm_head.weight``; ``groups.module_type``)."""
    return module_type(name) == "embedding"


def is_matrix(name: str, shape: Shape, params: Params) -> bool:
    """A tensor TSV, Iso-C, Iso-CTS and SVC decompose: 2-D and not empty; a vocabulary one if ``svd_embeddings``."""
    if len(shape) != 2 or min(shape) == 0:
        return False
    return bool(params.get("svd_embeddings", True)) or not is_vocab(name)


def one_svd(shape: Shape, params: Params, n: int) -> Svds:
    return ((shape[0], shape[1]),)


def svd_flops(m: int, n: int) -> float:
    """A thin SVD's work in flops (LAPACK gesdd on the tall orientation): 4 m n^2 + 8 n^3 with m >= n."""
    big, small = max(m, n), min(m, n)
    return 4.0 * big * small * small + 8.0 * small**3


def held(copies: float) -> Callable[[int], float]:
    """``WholeTensor.copies`` of a kernel that holds ``copies`` float32 copies beyond its inputs, for any N."""
    return lambda n: copies


SVC_WHOLE = WholeTensor(is_matrix, one_svd, held(6.0))  # the SVC post-step (``poststeps.SVC``)
