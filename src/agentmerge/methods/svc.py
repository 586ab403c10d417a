"""SVC, singular value calibration (arXiv 2602.05536, fusion_bench's only implementation): a post step.

After any method, for each 2-D merged delta ``D = W_merge - W_0`` (``poststeps.SVC``; embeddings and LM head
unless ``svd_embeddings`` is false), with the task vectors ``tau_i`` and ``alpha = svc_floor``:

    D = U diag(S) V^T                                  (thin SVD, r = 1 .. k)
    a_r = u_r^T D = S_r v_r^T,   a_r^i = u_r^T tau_i   (the responses of the merge and of task i in direction r)
    s_r^i = <a_r, a_r^i> / max(|a_r^i|^2, 1e-12)       (NaN and -inf -> alpha, as fusion_bench's default code)
    gamma_r = N / sum_i max(alpha, s_r^i)
    D' = U diag(gamma * S) V^T

A direction where the merge holds what each task holds (``s_r^i = 1``) keeps its size; one where it holds
N times what each task holds is scaled back by 1/N: N identical task vectors summed at scale 1 (``s_r^i = N``)
come back to one of them. Other tensors keep the method's delta.

The SVD runs in float32 (like every SVD here), the projections ``u_r^T tau_i`` in float32, and their products
and sums in float64: squaring a response in float32 overflows once task vectors pass ~1e19 (``|a|^2`` beyond
3.4e38), which made every ``s_r^i`` zero and ``gamma = 1 / alpha``.
After Iso-C or Iso-CTS every singular value of ``D`` is the same, so ``U`` is any orthonormal basis and the
calibration is not unique (in the reference too): the merge warns (``warn_flat``).
"""

from __future__ import annotations

import torch

from agentmerge.methods.linalg import rank_of, svd
from agentmerge.methods.params import MethodParams
from agentmerge.methods.spec import Chunk

FLAT = 1e-4  # singular values within this fraction of the largest count as one repeated value


def svc(c: Chunk, delta: torch.Tensor) -> torch.Tensor:
    """``delta`` (the method's merged delta of a whole 2-D tensor) calibrated; the driver calls it when on."""
    if not c.whole or len(c.shape) != 2:
        raise RuntimeError(f"tensor {c.name!r}: SVC was given part of it (the plan makes it one chunk)")
    n_models = c.tau.shape[0]
    taus = c.tau.view(n_models, *c.shape)
    alpha = MethodParams.of(c.params).svc_floor  # the record of the tensor (its method's default)
    u, s, vh = svd(delta.view(c.shape))
    warn_flat(c, s)
    coef = torch.empty(s.numel(), n_models, dtype=torch.float64)
    vh64 = vh.double()
    for i in range(n_models):
        response = (u.T @ taus[i]).double()  # [k, n]: a_r^i; its squares in float64 (module docstring)
        num = (vh64 * response).sum(1) * s.double()
        den = response.square().sum(1).clamp_min(1e-12)
        coef[:, i] = num / den
        del response
    coef = torch.nan_to_num(coef, nan=alpha, neginf=alpha)  # as fusion_bench's accelerated version
    gamma = n_models / coef.clamp_min(alpha).sum(1)
    return ((u * (gamma * s.double()).float()) @ vh).view(-1)


def warn_flat(c: Chunk, s: torch.Tensor) -> None:
    """Warn when the merged delta's non-zero singular values are all one value (Iso-C, Iso-CTS): its singular
    vectors are then any orthonormal basis, so the calibration depends on the one LAPACK returns."""
    live = s[: rank_of(s, c.shape)]
    if live.numel() > 1 and float(live[0] - live[-1]) <= FLAT * float(live[0]) and c.warn is not None:
        c.warn(
            "svc: the merged delta's singular values are all equal (as Iso-C and Iso-CTS make them), so its "
            "singular vectors, and the calibration, are whichever basis the SVD returns: not unique"
        )
