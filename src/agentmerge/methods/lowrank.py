"""A weight delta as LoRA factors: the truncated SVD, at a fixed rank or the smallest rank keeping an energy share.

For one module's ``Delta W`` ``[out, in]`` (float32), with the thin SVD ``Delta W = U diag(s) V^T``,
``s_1 >= s_2 >= ... >= s_n``, ``n = min(out, in)``:

    rank R given:         r = min(R, n)
    energy E given:       r = the smallest r with  sum_{i<=r} s_i^2  >=  E * sum_i s_i^2      (E = 1: r = n)
    A = diag(sqrt(s_r)) V_r^T    [r, in]          B = U_r diag(sqrt(s_r))    [out, r]          B @ A = Delta W_r

(the singular values are split evenly between the factors, so neither is much larger than the other). By
Eckart-Young, ``Delta W_r`` is the best rank-r approximation in Frobenius norm, and its error is the spectrum
it drops:

    ||Delta W - B A||_F^2 = sum_{i>r} s_i^2          relative error = sqrt(sum_{i>r} s_i^2 / sum_i s_i^2)

At ``r = n`` (``--energy 1.0``, or a rank at least ``n``) the factors give ``Delta W`` back, up to float32 rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Factors:
    """``B @ A`` approximates a delta: the factors, their rank, and what the truncation keeps of the delta."""

    a: torch.Tensor  # [r, in] float32
    b: torch.Tensor  # [out, r] float32
    rank: int
    max_rank: int  # min(out, in)
    energy: float  # sum_{i<=r} s_i^2 / sum_i s_i^2
    error: float  # relative Frobenius error of B A from the spectrum: sqrt(1 - energy)


def choose_rank(s: torch.Tensor, rank: int | None = None, energy: float | None = None) -> int:
    """The rank to keep of singular values ``s`` (descending): ``min(rank, n)``, or the smallest keeping ``energy``."""
    n = s.numel()
    if rank is not None:
        return max(1, min(rank, n))
    if energy is None:
        raise ValueError("give a rank or an energy share")
    if energy >= 1.0 or n == 0:
        return n
    power = s.double().square()
    cumulative = torch.cumsum(power, 0)
    wanted = energy * float(cumulative[-1])
    return max(1, min(n, int(torch.searchsorted(cumulative, torch.tensor([wanted], dtype=torch.float64))[0]) + 1))


def factorize(delta: torch.Tensor, rank: int | None = None, energy: float | None = None) -> Factors:
    """The truncated SVD of a 2-D float32 ``delta`` as LoRA factors (module docstring)."""
    u, s, vh = torch.linalg.svd(delta, full_matrices=False)
    r = choose_rank(s, rank, energy)
    root = s[:r].sqrt()
    a = (root[:, None] * vh[:r]).contiguous()
    b = (u[:, :r] * root[None, :]).contiguous()
    power = s.double().square()
    total = float(power.sum())
    kept = float(power[:r].sum()) / total if total > 0 else 1.0
    dropped = float(power[r:].sum()) / total if total > 0 else 0.0
    return Factors(a, b, r, s.numel(), min(kept, 1.0), math.sqrt(max(dropped, 0.0)))


def relative_error(delta: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> float:
    """``||delta - b @ a||_F / ||delta||_F`` in float32, for factors as stored (after any rounding to their dtype).

    Both norms are taken of the values divided by ``max |delta|`` (the ratio does not change), so their squares
    cannot overflow float32 whatever the weights' size (1e30 weights gave inf / inf = NaN).
    """
    peak = float(delta.abs().max()) if delta.numel() else 0.0
    if peak == 0.0 or not math.isfinite(peak):
        return 0.0 if peak == 0.0 else math.nan
    norm = float(torch.linalg.vector_norm(delta / peak))
    return float(torch.linalg.vector_norm(delta / peak - (b.float() @ a.float()) / peak)) / norm
