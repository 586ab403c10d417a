"""Element-wise merges of the field: MagMax, Consensus TA (TALL masks) and mergekit's SCE.

Per element p of one tensor, with tau_i = theta_i - theta_0 (i = 1..N, agents in order):

MagMax (Marczak et al., ECCV 2024; the authors' ``merge_max_abs``): the task vector of largest magnitude,
folded in task order with ``>=`` (on an exact tie the later agent wins)::

    sel[p]  = tau_{t*}[p],   t* = argmax_t |tau_t[p]|
    tau*[p] = lambda * sel[p]                                            (lambda = 0.5)

Consensus TA with TALL masks (Wang et al., ICML 2024; ``nik-dim/tall_masks``), with the data-free
defaults of the spec (the authors tune lambda_t and the scale on validation data)::

    tau_MTL[p] = sum_i tau_i[p]
    m_t[p]     = |tau_t[p]| > lambda_t * |tau_MTL[p] - tau_t[p]|           (TALL mask of agent t, strict)
    keep[p]    = sum_t m_t[p] >= k                                        (k = 2: drop selfish and unused weights)
    tau*[p]    = lambda * tau_MTL[p] * keep[p]                            (lambda_t = 0.6, lambda = 0.3)

SCE (FuseChat, arXiv 2408.07990; mergekit ``sce``): with ``d`` elements in the tensor,

    select (only when select_topk < 1): var[p] = population variance of tau_1..N[p]; keep the positions
        whose var is at least the k-th largest, k = int(nnz(var) * select_topk) (no position when k = 0;
        all positions tied at the k-th value are kept, where torch.topk would pick among them); the same
        positions for every agent: tau_i <- tau_i * sel. A tensor with no variance anywhere (one agent, or agents
        that agree on it exactly) has nothing to select by: the step is skipped and the agents' consensus kept,
        where mergekit keeps nothing (k = 0) and silently returns the base (docs/methods.md)
    calculate: w_i = mean_p tau_i[p]^2 / sum_j mean_p tau_j[p]^2 over the whole tensor (1/N each when the sum
        is below 1e-6)
    erase: e_i[p] = [sign(tau_i[p]) == s[p]],  s[p] = +1 if sum_i tau_i[p] >= 0 else -1 (zeros always erased)
    tau*[p] = sum_i w_i e_i tau_i[p] / max(sum_i w_i e_i, 1e-6)

SCE's weights and selection threshold are whole-tensor statistics: a one-chunk tensor's kernel computes
them from its chunk, a multi-chunk tensor's come from ``sce_prepare`` (or, compiled, from chunk-parallel
rounds): the sums of squares are fixed-block float64 sums added exactly (``exactsum``; chunks start on a
block) and the k-th variance is the exact streamed value of ``agentmerge.stats``, so results do not depend
on chunking.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction

import torch

from agentmerge.methods.deltas import PerAgent, sum_agents
from agentmerge.methods.exactsum import product_parts, value
from agentmerge.methods.field import ConsensusParams, MagMaxParams
from agentmerge.methods.spec import Chunk, TensorSource
from agentmerge.methods.stats import kth_direct, kth_streamed

# --------------------------------------------------------------------------- MagMax


def magmax(c: Chunk) -> torch.Tensor:
    """``lambda * tau_{t*}``, ``t*`` the agent of largest ``|tau|`` (the later one on a tie)."""
    sel = c.tau[0].clone()
    best = sel.abs()
    for row in c.tau[1:]:
        mag = row.abs()
        wins = mag >= best
        sel = torch.where(wins, row, sel)
        best = torch.where(wins, mag, best)
    return sel.mul_(MagMaxParams.of(c.params).scale)


# --------------------------------------------------------------------------- Consensus TA (TALL masks)


def tall_masks(tau: torch.Tensor, total: torch.Tensor, lambdas: torch.Tensor) -> torch.Tensor:
    """``[N, E]`` task vectors, ``[E]`` their sum, ``[N]`` lambda_t -> ``[N, E]`` bool TALL masks."""
    out = torch.empty(tau.shape, dtype=torch.bool)
    for t, lam in enumerate(lambdas.tolist()):
        out[t] = tau[t].abs() > (total - tau[t]).abs().mul_(lam)
    return out


def tall_lambda_of(q: ConsensusParams) -> float:
    return q.tall_lambda


def consensus(c: Chunk) -> torch.Tensor:
    """``lambda * tau_MTL`` where at least ``k`` agents' TALL masks hold, 0 elsewhere."""
    total = sum_agents(c.tau)
    tall = PerAgent.of(ConsensusParams, c, tall_lambda_of).values(c.tau.shape[0])
    count = tall_masks(c.tau, total, tall.float()).sum(0, dtype=torch.int32)
    keep = count >= int(c.params["k"])
    return torch.where(keep, total, 0.0).mul_(ConsensusParams.of(c.params).scale)


# --------------------------------------------------------------------------- SCE


SCE_MIN_TOTAL = 1e-6  # mergekit: below this sum of mean squares, the weights are uniform
SCE_MIN_DENOM = 1e-6  # mergekit: clamp of the erased weights' sum


@dataclass(frozen=True)
class SceStats:
    """SCE's whole-tensor statistics: the selection threshold on the variance and the agents' weights."""

    threshold: float | None  # keep positions with var >= threshold; None: no selection step
    weights: torch.Tensor  # [N] float32 w_i


def sce_variance(tau: torch.Tensor) -> torch.Tensor:
    """``[N, E]`` -> ``[E]`` float32 population variance over the agents: ``sum_i (tau_i - mean)^2 / N``.

    Taken of ``tau_i - tau_1`` (the same variance): exactly 0 where the agents agree, which ``mean`` in float32
    (``(a + a + a) / 3`` need not be ``a``) would turn into rounding noise that the selection then ranks.
    """
    n = tau.shape[0]
    shifted = tau - tau[0]
    mean = sum_agents(shifted).div_(n)
    return sum_agents(shifted.sub_(mean).square_()).div_(n)


def _select_rank(nonzero: int, topk: float) -> int:
    """mergekit's ``k = int(nnz(var) * select_topk)``."""
    return int(nonzero * topk)


def _var_threshold_whole(var: torch.Tensor, topk: float) -> float | None:
    """The selection threshold from a whole tensor's variance (``None`` when nothing is selected away)."""
    if topk >= 1.0:
        return None
    d, nonzero = var.numel(), int(torch.count_nonzero(var))
    if nonzero == 0 and topk > 0:
        return None  # no variance to select by: keep the agents' consensus (module docstring)
    k = _select_rank(nonzero, topk) if topk > 0 else 0
    if k == 0:
        return math.inf
    return float(kth_direct(var[None, :], torch.tensor([[d - k + 1]]))[0, 0])


def _var_threshold_streamed(source: TensorSource, topk: float) -> float | None:
    """The selection threshold over a multi-chunk tensor (exact k-th value, one chunk in memory at a time)."""
    if topk >= 1.0:
        return None
    if topk <= 0:
        return math.inf
    nonzero = [0]

    def batches() -> Iterator[torch.Tensor]:
        nonzero[0] = 0
        for ch in source():
            var = sce_variance(ch.tau)
            nonzero[0] += int(torch.count_nonzero(var))
            yield var[None, :]

    def ranks(d: int, n: int) -> torch.Tensor:
        k = _select_rank(nonzero[0], topk)
        return torch.tensor([[d - k + 1 if k > 0 else d + 1]])

    threshold = float(kth_streamed(batches, ranks)[0, 0])
    return None if nonzero[0] == 0 else threshold  # no variance to select by: the consensus (module docstring)


def sce_selected(tau: torch.Tensor, threshold: float | None) -> torch.Tensor:
    """``[N, E]`` task vectors with the unselected positions zeroed (``tau`` itself without a selection)."""
    if threshold is None:
        return tau
    keep = sce_variance(tau) >= threshold
    return torch.where(keep, tau, 0.0)


def square_parts(tau: torch.Tensor, start: int) -> torch.Tensor:
    """``[N, E]`` float32 from element ``start`` (a block boundary) -> ``[N, BUCKETS, 2]`` int64: the bucketed
    block sums of each ``tau_i^2`` (``exactsum``; any chunking, order or thread count adds up the same)."""
    return product_parts(tau, [(i, i) for i in range(tau.shape[0])], start)


def sce_weights(parts: torch.Tensor, d: int) -> torch.Tensor:
    """Summed ``square_parts`` of ``d`` elements -> ``[N]`` float32 weights, mergekit's ``sce_weight``: the mean
    squares over their sum, uniform when that sum is below 1e-6 (exact sums, rounded once)."""
    sums = [value(row) for row in parts]
    total = sum(sums, Fraction(0))
    n = len(sums)
    if total / max(d, 1) < SCE_MIN_TOTAL:
        return torch.full((n,), 1.0 / n, dtype=torch.float32)
    return torch.tensor([float(s / total) for s in sums], dtype=torch.float64).float()


def sce_prepare(source: TensorSource) -> SceStats:
    """SCE's statistics of a multi-chunk tensor: the variance threshold (its own passes), then the weights."""
    topk = float(source.params["select_topk"])
    threshold = _var_threshold_streamed(source, topk)
    parts = sum(
        (square_parts(sce_selected(ch.tau, threshold), ch.start) for ch in source()), torch.zeros((), dtype=torch.int64)
    )
    return SceStats(threshold, sce_weights(parts, math.prod(source.shape)))


def _sce_stats(c: Chunk) -> SceStats:
    if c.stats.prepared is not None:
        assert isinstance(c.stats.prepared, SceStats)
        return c.stats.prepared
    if not c.whole:
        raise RuntimeError(f"{c.name}: SCE's tensor statistics missing for a partial chunk (prepare was not run)")
    threshold = _var_threshold_whole(sce_variance(c.tau), float(c.params["select_topk"]))
    return SceStats(threshold, sce_weights(square_parts(sce_selected(c.tau, threshold), c.start), c.tau.shape[1]))


def sce(c: Chunk) -> torch.Tensor:
    stats = _sce_stats(c)
    tau = sce_selected(c.tau, stats.threshold)
    elected = torch.where(sum_agents(tau) >= 0, 1.0, -1.0)  # +1 where the sum is >= 0
    num = torch.zeros(tau.shape[1])
    den = torch.zeros(tau.shape[1])
    for row, w in zip(tau, stats.weights.tolist(), strict=True):
        erased = (row * elected > 0).float().mul_(w)  # w_i e_i: w_i where sign(tau_i) is the elected one, else 0
        num += row * erased  # an erased agent adds a zero
        den += erased
    return num.div_(den.clamp_(min=SCE_MIN_DENOM))
