"""The TIES family as chunk kernels (the reference path: readable torch, bit-exact).

Every kernel gets one ``Chunk`` (elements ``start:stop`` of one tensor, the ``[N, E]`` stack of task
vectors ``tau_i``) and returns the merged task vector ``tau*`` for those elements. Notation: ``w_i``
model weights, ``lambda`` the scaling coefficient (the parameter ``scale``), ``d`` a tensor's element count,
``sgn`` the sign.

TIES (trim, elect, disjoint merge), per tensor and agent, with ``k_i = floor(density_i * d)``:

    t_i      = k_i-th largest |tau_i| over the whole tensor            (+inf when k_i = 0)
    trim_i   = tau_i * [|tau_i| >= t_i]                                (ties at t_i are all kept)
    s[p]     = sgn(sum_i w_i trim_i[p])                                 (elected sign: total mass)
    A_i[p]   = [trim_i[p] != 0 and sgn(trim_i[p]) = s[p]]
    tau*[p]  = lambda * sum_i A_i w_i trim_i[p] / sum_i A_i w_i         (0 where no agent agrees)

DARE: ``tau_i' = tau_i * [u_i >= p_i] / (1 - p_i)`` with ``u_i[p]`` seeded uniform draws
(``deltas.seeded_uniform``, independent of chunking); then task arithmetic (``dare_linear``:
``lambda * sum_i w_i tau_i'``) or TIES (``dare_ties``, trimming ``tau'`` with ``density``, default 1).

Breadcrumbs: per tensor and agent drop the ``g_i = floor(gamma_i d)`` largest and keep the next
``k_i = floor(density_i d)`` magnitudes: ``lo_i <= |tau_i| <= hi_i`` with ``hi_i`` the ``(d - g_i)``-th
and ``lo_i`` the ``(d - g_i - k_i + 1)``-th smallest magnitude (ties at either bound are kept); then
task arithmetic.

DELLA (MAGPRUNE): in each row (last dimension, length L; 1-D tensors are one row) rank magnitudes
``r = 0 .. L-1`` (smallest first, ties by position); drop element p with probability
``p_i(r) = p + eps/2 - eps * r / (L - 1)`` (smallest magnitudes most likely dropped), rescale survivors
by ``1 / (1 - p_i(r))``; then TIES sign election and disjoint mean, times ``lambda``.

RAM-TIES (the RAM authors' "arm-ties"): RAM's regions by ``m_i = |tau_i| > eps`` (or the tensor's mask
rule), ``c = sum_i m_i``;
unique elements (c = 1) keep the agent's delta whole, untouched ones (c = 0) stay 0; on the shared
elements (c >= 2, D of them in the tensor) TIES without weights or lambda: with
``r_i = floor(D * (1 - keep_i))``, keep ``m_i tau_i`` where ``|m_i tau_i| >= `` its ``r_i``-th smallest
value over the shared elements (all when r_i = 0), then sign election and disjoint mean.

Sums over agents use ``deltas.sum_agents`` (agents added in order), never ``x.sum(0)``, whose order
depends on an element's position in the chunk for five or more agents.

Whole-tensor statistics (exact k-th magnitudes, dot products) come from ``agentmerge.methods.stats``: the
driver runs a method's ``prepare`` over a multi-chunk tensor first; a one-chunk tensor's kernel computes
them from the chunk itself. The registry (``agentmerge.methods.registry``) lists these kernels with their
parameters.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from agentmerge.methods.deltas import HasParams, PerAgent, disjoint_merge, overlap_count, seeded_uniform, sum_agents
from agentmerge.methods.deltas import zero_unless as _zero_unless
from agentmerge.methods.masks import chunk_mask
from agentmerge.methods.spec import Chunk, TensorSource
from agentmerge.methods.stats import RankFn, magnitude_thresholds, tensor_thresholds
from agentmerge.methods.ties import (
    BreadcrumbsParams,
    DareLinearParams,
    DareTiesParams,
    DellaParams,
    DropParams,
    RamTiesParams,
    TiesParams,
)

# --------------------------------------------------------------------------- per-agent parameters


def _density(q: TiesParams | DareTiesParams | BreadcrumbsParams) -> float:
    return q.density


def _drop_p(q: DropParams) -> float:
    return q.p


# --------------------------------------------------------------------------- shared pieces


SLICE = 1 << 18  # elements per slice of the float64 temporaries of DARE and DELLA (bounds their memory)


def dare_drop(c: Chunk) -> torch.Tensor:
    """``[N, E]``: each tau_i element kept with probability 1 - p_i (seeded), survivors divided by 1 - p_i."""
    u = seeded_uniform(c.seed, c.name, c.start, c.stop, c.tau.shape[0])
    out = torch.empty_like(c.tau)
    for i, p in enumerate(PerAgent.of(DropParams, c, _drop_p).values(c.tau.shape[0]).tolist()):
        _rescale(c.tau[i], 1.0 - p, out[i])
        _zero_unless(out[i], u[i] >= f32_at_least(p))  # kept where u_i >= p_i
    return out


def _rescale(tau: torch.Tensor, q: float, out: torch.Tensor) -> None:
    """``[E]`` float32 -> ``out = float32(tau / q)``, the quotient taken in float64 and rounded once.

    When ``q`` is a power of two (p = 0, 0.5, 0.75, ...) the quotient is exact, so a float32 multiply by
    ``1 / q`` gives the same bits (overflow to inf included); otherwise float64 slices of SLICE elements.
    """
    if math.frexp(q)[0] == 0.5 and q >= 2.0**-100:
        torch.mul(tau, 1.0 / q, out=out)
        return
    for s in range(0, tau.numel(), SLICE):
        out[s : s + SLICE] = tau[s : s + SLICE].double().div_(q)


def f32_at_least(p: float) -> torch.Tensor:
    """The smallest float32 ``>= p`` (0-d): for float32 draws ``u``, ``u >= p`` iff ``u >= f32_at_least(p)``."""
    f = torch.tensor(p, dtype=torch.float32)
    if float(f) < p:
        f = torch.nextafter(f, torch.tensor(math.inf))
    return f


def top_ranks(densities: PerAgent) -> RankFn:
    """Ranks of the TIES threshold: the ``floor(density_i d)``-th largest = ``(d - k_i + 1)``-th smallest."""

    def ranks(d: int, n: int) -> torch.Tensor:
        density = densities.values(n).tolist()
        k = torch.tensor([int(x * d) for x in density], dtype=torch.int64)
        return torch.where(k > 0, d - k + 1, d + 1)[:, None]

    return ranks


def _trim(tau: torch.Tensor, thresholds: torch.Tensor, magnitudes: torch.Tensor | None = None) -> torch.Tensor:
    """``[N, E]``, ``[N, 1]`` -> tau where ``|tau| >= threshold``, else 0 (NaN magnitudes are dropped too).

    ``magnitudes`` is ``tau.abs()`` when the caller has it already.
    """
    magnitudes = tau.abs() if magnitudes is None else magnitudes
    return _zero_unless(tau.clone(), magnitudes >= thresholds)


def ties_band(where: HasParams) -> RankFn | None:
    """TIES's trim: the rank of each agent's threshold, or None when no agent keeps less than all (``density``)."""
    return _top_band(PerAgent.of(TiesParams, where, _density))


def dare_ties_band(where: HasParams) -> RankFn | None:
    """DARE-TIES's trim after the drop (its own ``density``, default 1: none)."""
    return _top_band(PerAgent.of(DareTiesParams, where, _density))


def _top_band(densities: PerAgent) -> RankFn | None:
    return top_ranks(densities) if any(x < 1.0 for x in densities.every()) else None


# --------------------------------------------------------------------------- TIES and DARE

Band = Callable[[HasParams], RankFn | None]  # a tensor's trim: the ranks of its thresholds, None for no trim


def _ties_core(c: Chunk, tau: Callable[[Chunk], torch.Tensor], band: Band, lam: float) -> torch.Tensor:
    values = tau(c)
    ranks = band(c)
    if ranks is not None:
        mag = values.abs()
        t = tensor_thresholds(c, lambda ch: tau(ch).abs(), ranks, mag)
        values = _trim(values, t, mag)
    return lam * disjoint_merge(values, c.weights)


def _ties_prepare(tau: Callable[[Chunk], torch.Tensor], band: Band) -> Callable[[TensorSource], torch.Tensor | None]:
    def prepare(source: TensorSource) -> torch.Tensor | None:
        ranks = band(source)
        if ranks is None:
            return None
        return magnitude_thresholds(source, lambda ch: tau(ch).abs(), ranks)

    return prepare


def _raw_tau(c: Chunk) -> torch.Tensor:
    return c.tau


def ties(c: Chunk) -> torch.Tensor:
    return _ties_core(c, _raw_tau, ties_band, TiesParams.of(c.params).scale)


def dare_ties(c: Chunk) -> torch.Tensor:
    return _ties_core(c, dare_drop, dare_ties_band, DareTiesParams.of(c.params).scale)


def dare_linear(c: Chunk) -> torch.Tensor:
    return DareLinearParams.of(c.params).scale * sum_agents(dare_drop(c) * c.weights[:, None])


# --------------------------------------------------------------------------- Breadcrumbs


def crumb_ranks(where: HasParams) -> RankFn:
    """``[N, 2]`` ranks (lower, upper bound) of the kept magnitude band."""
    densities = PerAgent.of(BreadcrumbsParams, where, _density)
    gammas = PerAgent.of(BreadcrumbsParams, where, lambda q: q.gamma)

    def ranks(d: int, n: int) -> torch.Tensor:
        density = densities.values(n).tolist()
        gamma = gammas.values(n).tolist()
        out = []
        for dens, gam in zip(density, gamma, strict=True):
            k, g = int(dens * d), int(gam * d)
            out.append([max(1, d - g - k + 1) if k > 0 else d + 1, d - g])
        return torch.tensor(out, dtype=torch.int64)

    return ranks


def _abs_tau(c: Chunk) -> torch.Tensor:
    return c.tau.abs()


def breadcrumbs(c: Chunk) -> torch.Tensor:
    mag = c.tau.abs()
    bounds = tensor_thresholds(c, _abs_tau, crumb_ranks(c), mag)
    keep = (mag >= bounds[:, :1]) & (mag <= bounds[:, 1:])
    return BreadcrumbsParams.of(c.params).scale * sum_agents(_zero_unless(c.tau.clone(), keep).mul_(c.weights[:, None]))


def breadcrumbs_prepare(source: TensorSource) -> torch.Tensor:
    return magnitude_thresholds(source, _abs_tau, crumb_ranks(source))


# --------------------------------------------------------------------------- DELLA


def row_length(shape: tuple[int, ...]) -> int:
    """DELLA's ranking unit: the last dimension of a matrix, the whole of a vector."""
    return max(1, shape[-1] if len(shape) >= 2 else math.prod(shape))


def della(c: Chunk) -> torch.Tensor:
    n, e = c.tau.shape
    length = row_length(c.shape) if c.shape else e
    if e % length or c.start % length:
        raise RuntimeError(f"{c.name}: della needs chunks of whole rows of {length} (got {c.start}:{c.stop})")
    p = PerAgent.of(DellaParams, c, lambda q: q.p).values(n)[:, None, None]
    eps = PerAgent.of(DellaParams, c, lambda q: q.eps).values(n)[:, None, None]
    u = seeded_uniform(c.seed, c.name, c.start, c.stop, n)
    kept = torch.empty_like(c.tau)
    step = max(1, SLICE // length) * length  # whole rows per slice
    for s in range(0, e, step):
        part = slice(s, s + step)
        kept[:, part] = _magprune(c.tau[:, part].reshape(n, -1, length), u[:, part], p, eps).reshape(n, -1)
    return DellaParams.of(c.params).scale * disjoint_merge(kept, c.weights)


def _magprune(tau: torch.Tensor, u: torch.Tensor, p: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """``[N, rows, L]`` task vectors, ``[N, rows * L]`` draws, ``[N, 1, 1]`` p and eps -> kept and rescaled."""
    n, _, length = tau.shape
    order = torch.argsort(tau.abs(), dim=2, stable=True)
    rank = torch.empty_like(order).scatter_(2, order, torch.arange(length).expand_as(order))
    frac = rank.double() / (length - 1) if length > 1 else torch.full(rank.shape, 0.5, dtype=torch.float64)
    drop = p + eps / 2 - eps * frac  # [N, rows, L] float64: smallest magnitude -> p + eps/2
    kept = torch.where(u.double().view(n, -1, length) >= drop, tau.double() / (1.0 - drop), 0.0)
    return kept.float()


# --------------------------------------------------------------------------- Model Stock, SLERP


# --------------------------------------------------------------------------- RAM-TIES


def _shared(c: Chunk) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Update mask ``[N, E]`` (the tensor's rule), overlap count ``[E]`` and the shared-region values ``[N, D]``."""
    mask = chunk_mask(c)
    count = overlap_count(mask)
    return mask, count, torch.where(mask, c.tau.abs(), 0.0)[:, count >= 2]


def keep_ranks(where: HasParams) -> RankFn:
    """Ranks of the RAM-TIES threshold: the ``floor(D (1 - keep_i))``-th smallest (0: keep all)."""
    keeps = PerAgent.of(RamTiesParams, where, lambda q: q.keep)

    def ranks(d: int, n: int) -> torch.Tensor:
        keep = keeps.values(n).tolist()
        return torch.tensor([[int(d * (1.0 - k))] for k in keep], dtype=torch.int64)

    return ranks


def ram_ties(c: Chunk) -> torch.Tensor:
    mask, count, shared_values = _shared(c)
    active = _zero_unless(c.tau.clone(), mask)
    rank_fn = keep_ranks(c)
    t = tensor_thresholds(c, lambda ch: _shared(ch)[2], rank_fn, shared_values)
    shared = count >= 2
    trimmed = _trim(active, t)
    ones = torch.ones(c.tau.shape[0])
    return torch.where(shared, disjoint_merge(trimmed, ones), sum_agents(active))


def ram_ties_prepare(source: TensorSource) -> torch.Tensor:
    return magnitude_thresholds(source, lambda ch: _shared(ch)[2], keep_ranks(source))


# --------------------------------------------------------------------------- Fisher


# --------------------------------------------------------------------------- parameter checks


# --------------------------------------------------------------------------- prepare hooks of the multi-chunk tensors

ties_prepare = _ties_prepare(_raw_tau, ties_band)
dare_ties_prepare = _ties_prepare(dare_drop, dare_ties_band)
