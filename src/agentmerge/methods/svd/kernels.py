"""SVD merge methods as kernels: TSV-M, Iso-C, Iso-CTS, CART (ResMerge: ``resmerge.py``; SVC: ``methods.svc``).

One parameter name at a time; ``tau_i`` the task vectors (``m x n`` when 2-D, ``k = min(m, n)``), N models,
``P(A) = U_A V_A^T`` the polar factor of ``A = U_A S_A V_A^T``. Which tensors are decomposed is in
``rules.py`` (2-D ones, by name for CART); every other tensor gets the rule written after "else".
A decomposed tensor is always one whole chunk (the plan makes it so, ``hooks.WholeTensor``).

TSV-M (Gargiulo et al., arXiv 2412.00081), ``r = int(k * (1/N))`` as the reference computes it:

    tau_i = U_i S_i V_i^T;  U^ = [U_1[:, :r] .. U_N[:, :r]],  s^ = [s_1[:r] .. s_N[:r]],  V^ likewise
    delta = alpha * P(U^) diag(s^) P(V^T)                          else alpha * mean_i tau_i

(the reference pads U^ with zero columns to k; their directions meet zero singular values, so P of the
``N r`` filled columns gives the same delta.)

Iso-C (Marczak et al., arXiv 2502.04959): ``U S V^T = svd(sum_i tau_i)``,
``delta = alpha * mean(S) * U V^T``, else ``alpha * mean_i tau_i``. A sum of rank below k (low-rank agents,
LoRA) leaves null directions that get mean(S) although nothing chose them: the merge warns.

Iso-CTS (same paper), ``f = common_space_fraction``, sizes ``c`` and ``d`` by ``rules.cts_sizes``:
the top ``c`` triplets ``U_c, s_c, V_c`` of ``sum_i tau_i``; for each i the top ``d`` of
``tau_i - U_c U_c^T tau_i``; blocks ``[task 1 .. task N, common]`` side by side in U^, s^, V^, then
``delta = alpha * mean(s^) * P(U^) P(V^T)``, else ``alpha * mean_i tau_i``.

CART (Choi et al., arXiv 2412.12153): ``c_i = tau_i - mean_j tau_j`` (the deviation from the average),
``r = max(1, int(rank_ratio * k))``, ``delta = mean_j tau_j + prior * sum_i lowrank_r(c_i)``; on the tensors
it does not decompose (and with rank_ratio 0 or 1, where ``sum_i c_i = 0``) the plain average ``mean_j tau_j``.

Every SVD runs in float32 on the matrix's tall orientation (``svd``; LAPACK is several times faster there
than on the wide one), with torch's threads as the driver sets them (all of them for a tensor merged alone).
"""

from __future__ import annotations

import torch

from agentmerge.methods.deltas import sum_agents
from agentmerge.methods.linalg import rank_of, svd
from agentmerge.methods.matrices import is_matrix
from agentmerge.methods.spec import Chunk
from agentmerge.methods.svd import CartParams, IsoCParams, IsoCtsParams, TsvParams
from agentmerge.methods.svd.rules import cart_wanted, cts_sizes


def polar(a: torch.Tensor) -> torch.Tensor:
    """The orthogonal polar factor ``U V^T`` of ``a = U S V^T``."""
    u, _, vh = svd(a)
    return u @ vh


def mean_tau(c: Chunk) -> torch.Tensor:
    """``[E]``: the mean of the task vectors (agents added in order)."""
    return sum_agents(c.tau) / c.tau.shape[0]


def matrices(c: Chunk) -> torch.Tensor:
    """``[N, m, n]``: the task vectors of a whole 2-D tensor (a view)."""
    if not c.whole or len(c.shape) != 2:
        raise RuntimeError(f"tensor {c.name!r}: an SVD method was given part of it (the plan makes it one chunk)")
    return c.tau.view(c.tau.shape[0], *c.shape)


def warn_rank(c: Chunk, s: torch.Tensor, what: str) -> None:
    """Warn (``ChunkSpec.warn``) when ``s`` has zero directions but is not all zero: the flattening is not unique."""
    rank = rank_of(s, c.shape)
    if 0 < rank < s.numel() and c.warn is not None:
        c.warn(
            f"{what} of rank below min(m, n): its null directions get the mean singular value although no task "
            "chose them, so the result is not unique (low-rank agents such as LoRA?); tsv, cart or "
            "task_arithmetic do not do this"
        )


class Stack:
    """Singular triplets placed side by side: ``U^ [m, R]``, ``s^ [R]``, ``V^ [R, n]``, filled block by block."""

    def __init__(self, m: int, n: int, width: int) -> None:
        self.u, self.s, self.v = torch.zeros(m, width), torch.zeros(width), torch.zeros(width, n)

    def put(self, at: int, u: torch.Tensor, s: torch.Tensor, vh: torch.Tensor) -> None:
        """The triplets ``(u [m, r], s [r], vh [r, n])`` at columns ``at:at + r``."""
        r = s.numel()
        self.u[:, at : at + r], self.s[at : at + r], self.v[at : at + r] = u, s, vh

    def product(self, scale: torch.Tensor | float) -> torch.Tensor:
        """``P(U^) diag(scale) P(V^T)`` (``scale``: s^ itself, or one number), as ``[m * n]``."""
        left = polar(self.u).mul_(scale)
        self.u = torch.empty(0)  # frees U^ before the second polar factor
        return (left @ polar(self.v)).view(-1)


# --------------------------------------------------------------------------- TSV-M


def tsv(c: Chunk) -> torch.Tensor:
    alpha = TsvParams.of(c.params).scale
    if not is_matrix(c.name, c.shape, c.params):
        return alpha * mean_tau(c)
    taus = matrices(c)
    n_models, m, n = taus.shape
    r = int(min(m, n) * (1.0 / n_models))  # the reference's int(k * sv_reduction), not k // N
    if r == 0:
        if c.warn is not None:
            c.warn(
                "tsv: min(m, n) is below the number of models, so no model keeps a direction (as in the reference): "
                "the tensor stays at the base"
            )
        return torch.zeros(m * n)
    stack = Stack(m, n, n_models * r)
    for i in range(n_models):
        u, s, vh = svd(taus[i])
        stack.put(i * r, u[:, :r], s[:r], vh[:r])
        del u, s, vh
    return stack.product(stack.s).mul_(alpha)


# --------------------------------------------------------------------------- Iso-C, Iso-CTS


def iso_c(c: Chunk) -> torch.Tensor:
    alpha = IsoCParams.of(c.params).scale
    if not is_matrix(c.name, c.shape, c.params):
        return alpha * mean_tau(c)
    total = sum_agents(c.tau).view(c.shape)
    u, s, vh = svd(total)
    del total
    warn_rank(c, s, "iso_c: the sum of the task vectors is")
    return (u @ vh).mul_(alpha * float(s.mean())).view(-1)


def iso_cts(c: Chunk) -> torch.Tensor:
    p = IsoCtsParams.of(c.params)
    alpha = p.scale
    if not is_matrix(c.name, c.shape, c.params):
        return alpha * mean_tau(c)
    taus = matrices(c)
    n_models, m, n = taus.shape
    k = min(m, n)
    common, d = cts_sizes(k, n_models, p.common_space_fraction)
    u, s, vh = svd(sum_agents(c.tau).view(m, n))
    stack = Stack(m, n, k)
    stack.put(n_models * d, u[:, :common], s[:common], vh[:common])
    uc = stack.u[:, n_models * d :]
    del u, s, vh
    for i in range(n_models):
        own = taus[i] - uc @ (uc.T @ taus[i])  # tau_i outside the common space
        u, s, vh = svd(own)
        stack.put(i * d, u[:, :d], s[:d], vh[:d])
        del own, u, s, vh
    warn_rank(c, stack.s, "iso_cts: the common and task-specific singular values are")
    return stack.product(float(stack.s.mean())).mul_(alpha)


# --------------------------------------------------------------------------- CART


def cart(c: Chunk) -> torch.Tensor:
    p = CartParams.of(c.params)
    mean = mean_tau(c)
    if not cart_wanted(c.name, c.shape, c.params):
        return mean
    taus = matrices(c)
    n_models, m, n = taus.shape
    r = max(1, int(p.rank_ratio * min(m, n)))
    average = mean.view(m, n)
    low = torch.zeros(m, n)
    for i in range(n_models):
        u, s, vh = svd(taus[i] - average)
        low.addmm_(u[:, :r] * s[:r], vh[:r])
        del u, s, vh
    return mean.add_(low.view(-1), alpha=p.prior)
