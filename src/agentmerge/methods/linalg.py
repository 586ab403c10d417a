"""Linear algebra shared by the SVD methods, the SVC post-step and the dry run's cost model: one thin SVD routine.

Every SVD runs in float32 on the matrix's tall orientation (LAPACK is several times faster there than on the wide
one), retried in float64 when LAPACK does not converge; ``rank_of`` is numpy's numerical rank rule.
"""

from __future__ import annotations

import torch

F32_EPS = float(torch.finfo(torch.float32).eps)


LINALG_ERROR: type[Exception] = torch.linalg.LinAlgError  # type: ignore[attr-defined]  # (not in torch's stubs)


def svd(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Thin SVD ``a = U diag(S) Vh`` of a float32 matrix, computed on its tall orientation."""
    if a.shape[0] >= a.shape[1]:
        return tall_svd(a)
    u, s, vh = tall_svd(a.T)
    return vh.T, s, u.T


def tall_svd(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """LAPACK's float32 SVD, retried in float64 when it fails to converge.

    Divide and conquer (gesdd) occasionally gives up on a matrix whose singular values cluster, such as the
    side-by-side orthonormal blocks Iso-CTS and TSV-M orthogonalise (seen on a 896 x 896 one of Qwen2.5-0.5B's
    shapes, on one thread; the float64 run of the same matrix converges). Then the factors are the float64
    ones, rounded to float32.
    """
    try:
        u, s, vh = torch.linalg.svd(a, full_matrices=False)
    except LINALG_ERROR:
        u, s, vh = (x.float() for x in torch.linalg.svd(a.double(), full_matrices=False))
    return u, s, vh


def rank_of(s: torch.Tensor, shape: tuple[int, ...]) -> int:
    """Numerical rank from singular values, numpy's rule: ``s > max(m, n) * eps_float32 * s_max``."""
    if s.numel() == 0:
        return 0
    return int((s > max(shape) * F32_EPS * s.max()).sum())
