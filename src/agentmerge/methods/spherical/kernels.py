"""Spherical averages of whole tensors, as mergekit defines them: Karcher mean, Multi-SLERP, NuSLERP.

Each flattens a tensor into one vector per model, x_i, and returns a point of the span of the x_i, so the
merged tensor is ``sum_j k_j x_j`` with N coefficients ``k_j`` that depend on the x_i only through their
Gram matrix ``G[i, j] = <x_i, x_j>``. Every step below is mergekit's, written on coefficients (float64)
instead of on the vectors: a unit vector ``x_i / |x_i|`` is ``e_i / sqrt(G[i, i])``, ``<a, b> = a^T G b``.
G is fixed-block float64 dot products added exactly and rounded once (``exactsum``), so a multi-chunk tensor
(its G from ``prepare`` or the compiled rounds, one chunk in memory at a time) merges bit for bit like a
one-chunk tensor, whatever the chunks; ``compiled.py`` is the compiled twin.

Karcher (mergekit ``karcher``; on the raw weights x_i = theta_i, equal weights a_i = 1/N, any base ignored):
  n_i = |x_i|; the inputs with n_i > tol count, their weights renormalised (a'_i); u = normalised
  sum_i a'_i x_i/n_i (the first unit vector when that sum is below tol); up to max_iter times:
  theta_i = arccos(clamp(<u, x_i/n_i>)), T = sum_{theta_i >= tol} a'_i theta_i/sin(theta_i) (x_i/n_i - cos(theta_i) u),
  stop when |T| < tol, else u <- cos|T| u + sin|T| T/|T|, renormalised (when its norm exceeds tol).
  Result: (sum_i a_i n_i) u. One model: that model. Each "< tol" also holds at exactly 0, so ``tol: 0`` (in its
  range) divides by no zero: an input at theta_i = 0 adds nothing to T (theta/sin(theta) -> 1 times a zero
  vector), |T| = 0 is converged, a zero mean starts from the first unit vector.

Multi-SLERP (mergekit ``multislerp``; x_i = tau_i with a base, theta_i without; model weights w_i, divided
by their sum when normalize_weights):
  u_i = x_i/(n_i + eps), m = sum_i w_i u_i normalised, T = sum_i w_i (u_i - <u_i, m> m),
  r = m cos(|T| + eps) + T sin(|T| + eps)/(|T| + eps), result r sum_i w_i n_i (+ theta_0 with a base).
  When |sum_i w_i u_i| < eps: two models are interpolated linearly, three or more are refused.

NuSLERP (mergekit ``nuslerp``; exactly two models; t = w_1/(w_0 + w_1), 0.5 when that sum is below 1e-6):
  with v = tau (with a base) or theta (without), theta = arccos(clamp(<v_0, v_1>/(|v_0|' |v_1|'))) with
  |v|' = max(|v|, 1e-7); result (sin((1-t) theta) v_0 + sin(t theta) v_1)/sin(theta), or (1-t) v_0 + t v_1 when
  1 - cos(theta)^2 <= 1e-16 (mergekit 0.1.5; its earlier code tested |sin(theta)| < 1e-8).
  ``nuslerp_flatten`` (default) takes the whole tensor as one vector; otherwise each row (the last
  dimension) is one, or with ``nuslerp_row_wise`` each column (vectors along dimension 0). A 1-D tensor is
  one vector in every mode. Row statistics are float64 pairwise sums within the row; column
  statistics float64 sums over the rows in order (a running sum carried from chunk to chunk), so they too do
  not depend on chunking.

The kernels return the merged task vector against the reference (the base, else the first model):
``sum_j k_j tau_j`` in the task-vector space, ``(sum_j k_j - 1) theta_0 + sum_j k_j tau_j`` on raw weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from agentmerge.errors import MergeError
from agentmerge.methods.deltas import sum_agents
from agentmerge.methods.exactsum import gram, pairs_of, product_parts, vectors_gram
from agentmerge.methods.spec import Chunk, Params, TensorSource
from agentmerge.methods.stats import STAT_BLOCK

NUSLERP_NORM_FLOOR = 1e-7  # mergekit's clamp of a vector's norm
NUSLERP_COLINEAR = 1e-8  # |sin(theta)| at most this (1 - cos^2 <= 1e-16): linear interpolation
NUSLERP_ZERO_WEIGHTS = 1e-6  # |w_0 + w_1| below this: t = 0.5

# --------------------------------------------------------------------------- the vectors and their combination


def raw_weights(c: Chunk) -> torch.Tensor:
    """``[N, E]`` the models' weights ``theta_0 + tau_i`` (the reference plus each task vector)."""
    return c.base[None, :] + c.tau


def merge_space(c: Chunk) -> torch.Tensor:
    """``[N, E]`` what Multi-SLERP and NuSLERP interpolate: task vectors with a base, raw weights without."""
    return c.tau if c.has_base else raw_weights(c)


def combine(c: Chunk, k: torch.Tensor, raw: bool) -> torch.Tensor:
    """``[E]`` merged task vector of ``sum_j k_j x_j`` (``k``: ``[N]`` float64); ``raw``: x_j are the raw weights."""
    delta = sum_agents(c.tau * k.float()[:, None])
    if raw:
        delta += c.base * float(k.sum() - 1.0)
    return delta


def tensor_gram(c: Chunk, vectors: Callable[[Chunk], torch.Tensor]) -> torch.Tensor:
    """``[K, K]`` float64 Gram matrix of ``vectors(c)``: from the prepare pass, or from the chunk when it is whole."""
    if c.stats.prepared is not None:
        return torch.as_tensor(c.stats.prepared)
    if not c.whole:
        raise RuntimeError(f"{c.name}: tensor statistics missing for a partial chunk (prepare was not run)")
    return vectors_gram(vectors(c))


def gram_prepare(vectors: Callable[[Chunk], torch.Tensor]) -> Callable[[TensorSource], torch.Tensor]:
    """A ``prepare`` hook: the exact Gram matrix of ``vectors(chunk)`` over a multi-chunk tensor."""

    def prepare(source: TensorSource) -> torch.Tensor:
        parts: torch.Tensor | None = None
        k = 0
        for ch in source():
            v = vectors(ch)
            k = v.shape[0]
            counted = product_parts(v, pairs_of(k), ch.start)
            parts = counted if parts is None else parts.add_(counted)
        assert parts is not None
        return gram(parts, k)

    return prepare


def _quad(g: torch.Tensor, a: torch.Tensor, b: torch.Tensor | None = None) -> float:
    """``a^T G b`` (``b = a`` when omitted), float64."""
    return float(a @ g @ (a if b is None else b))


def _norm(g: torch.Tensor, a: torch.Tensor) -> float:
    return math.sqrt(max(_quad(g, a), 0.0))


# --------------------------------------------------------------------------- Karcher


def karcher_coefficients(g: torch.Tensor, max_iter: int, tol: float) -> torch.Tensor:
    """``[N, N]`` float64 Gram of the raw weights -> ``[N]`` coefficients of mergekit's Karcher mean."""
    n = g.shape[0]
    norms = g.diagonal().clamp(min=0.0).sqrt()
    valid = [i for i in range(n) if float(norms[i]) > tol]
    if not valid:
        return torch.zeros(n, dtype=torch.float64)
    a = 1.0 / len(valid)  # mergekit: equal weights, renormalised over the inputs that count
    units = torch.zeros(n, n, dtype=torch.float64)  # row i: the coefficients of x_i / n_i
    for i in valid:
        units[i, i] = 1.0 / float(norms[i])
    u = _karcher_start(g, units, valid, a, tol)
    for _ in range(max_iter):
        step = _karcher_tangent(g, units, valid, a, u, tol)
        size = _norm(g, step)
        if _below(size, tol):
            break
        u = math.cos(size) * u + math.sin(size) * (step / size)
        length = _norm(g, u)
        if length > tol:
            u = u / length
    return float(norms.sum()) / n * u


def _karcher_start(g: torch.Tensor, units: torch.Tensor, valid: Sequence[int], a: float, tol: float) -> torch.Tensor:
    """The normalised weighted mean of the unit vectors (the first unit vector when it is nearly zero)."""
    u = sum((a * units[i] for i in valid), torch.zeros(g.shape[0], dtype=torch.float64))
    length = _norm(g, u)
    return units[valid[0]].clone() if _below(length, tol) else u / length


def _karcher_tangent(
    g: torch.Tensor, units: torch.Tensor, valid: Sequence[int], a: float, u: torch.Tensor, tol: float
) -> torch.Tensor:
    """``T = sum_i a theta_i / sin(theta_i) (unit_i - cos(theta_i) u)`` over the inputs with theta_i >= tol."""
    step = torch.zeros(g.shape[0], dtype=torch.float64)
    for i in valid:
        dot = min(1.0, max(-1.0, _quad(g, u, units[i])))
        theta = math.acos(dot)
        if _below(theta, tol):
            continue
        step += a * (theta / math.sin(theta)) * (units[i] - dot * u)
    return step


def _below(x: float, tol: float) -> bool:
    """mergekit's ``x < tol``, also true at ``x == 0`` (``tol: 0`` must not divide by that zero)."""
    return x < tol or x == 0.0


def karcher(c: Chunk) -> torch.Tensor:
    if c.tau.shape[0] == 1:
        return c.tau[0].clone()  # mergekit returns a lone model as it is
    k = karcher_coefficients(tensor_gram(c, raw_weights), int(c.params["max_iter"]), float(c.params["tol"]))
    return combine(c, k, raw=True)


# --------------------------------------------------------------------------- Multi-SLERP


def multislerp_coefficients(g: torch.Tensor, weights: torch.Tensor, eps: float, name: str) -> torch.Tensor:
    """``[N, N]`` float64 Gram, ``[N]`` float64 weights (normalised or not) -> ``[N]`` coefficients."""
    norms = g.diagonal().clamp(min=0.0).sqrt()
    if not bool((norms * weights != 0).any()):
        # every weighted input is zero (e.g. a tensor no agent changed): the result's length sum_i w_i |x_i| is 0,
        # so the result is 0 (the base) whatever the undefined direction; mergekit raises here with 3+ models
        return torch.zeros_like(weights)
    units = weights / (norms + eps)  # the coefficients of sum_i w_i u_i
    length = _norm(g, units)
    if length < eps:
        if weights.numel() == 2:
            return weights.clone()  # mergekit: linear interpolation of two models
        raise MergeError(
            f"tensor {name!r}: Multi-SLERP's weighted mean of the models' directions is zero (models pointing in "
            "opposite directions with balancing weights); choose other weights"
        )
    mean = units / length
    dots = (g @ mean) / (norms + eps)  # <u_i, m>
    tangent = units - float((weights * dots).sum()) * mean
    size = _norm(g, tangent) + eps
    result = mean * math.cos(size) + tangent * (math.sin(size) / size)
    return result * float((norms * weights).sum())


def _multislerp_weights(c: Chunk) -> torch.Tensor:
    w = c.weights.double()
    return w / w.sum() if bool(c.params["normalize_weights"]) else w


def multislerp(c: Chunk) -> torch.Tensor:
    if c.tau.shape[0] == 1:
        return c.tau[0].clone()  # mergekit returns a lone model as it is
    g = tensor_gram(c, merge_space)
    k = multislerp_coefficients(g, _multislerp_weights(c), float(c.params["eps"]), c.name)
    return combine(c, k, raw=not c.has_base)


# --------------------------------------------------------------------------- NuSLERP


def nuslerp_t(weights: torch.Tensor) -> float:
    """mergekit's interpolation factor ``w_1 / (w_0 + w_1)`` (0.5 when the sum is nearly zero)."""
    w0, w1 = (float(x) for x in weights)
    return 0.5 if abs(w0 + w1) < NUSLERP_ZERO_WEIGHTS else w1 / (w0 + w1)


def nuslerp_coefficients(s00: torch.Tensor, s11: torch.Tensor, s01: torch.Tensor, t: float) -> torch.Tensor:
    """``[R]`` float64 squared norms and dot products of R vector pairs -> ``[2, R]`` float64 (a, b)."""
    n0 = s00.clamp(min=0.0).sqrt().clamp(min=NUSLERP_NORM_FLOOR)
    n1 = s11.clamp(min=0.0).sqrt().clamp(min=NUSLERP_NORM_FLOOR)
    cos = (s01 / (n0 * n1)).clamp(-1.0, 1.0)
    colinear = 1.0 - cos * cos <= NUSLERP_COLINEAR**2  # mergekit 0.1.5's test of |sin(theta)| <= 1e-8
    theta = torch.acos(torch.where(colinear, 0.0, cos))
    safe = torch.where(colinear, 1.0, torch.sin(theta))
    a = torch.where(colinear, 1.0 - t, torch.sin((1.0 - t) * theta) / safe)
    b = torch.where(colinear, t, torch.sin(t * theta) / safe)
    return torch.stack([a, b])


def nuslerp_unit(shape: tuple[int, ...]) -> int:
    """Chunks start on whole rows (the row and column modes) and on dot-product blocks (the flattened mode)."""
    row = math.prod(shape[1:]) if len(shape) >= 2 else math.prod(shape)
    return math.lcm(STAT_BLOCK, max(1, row))


def _layout(params: Params, shape: tuple[int, ...]) -> str:
    """``flat`` (one vector), ``rows`` (vectors along the last dimension) or ``columns`` (along dimension 0)."""
    if bool(params["nuslerp_flatten"]):
        return "flat"
    if len(shape) <= 1:
        return "rows"  # a 1-D tensor is one vector in every mode
    return "columns" if bool(params["nuslerp_row_wise"]) else "rows"


def _pairwise_row_sums(x: torch.Tensor) -> torch.Tensor:
    """``[R, L]`` float64 -> ``[R]`` row sums by pairwise halving (zero-padded to a power of two)."""
    size = 1 << max(0, (x.shape[1] - 1).bit_length())
    v = torch.nn.functional.pad(x, (0, size - x.shape[1]))
    while v.shape[1] > 1:
        h = v.shape[1] // 2
        v = v[:, :h] + v[:, h:]
    return v[:, 0]


def _products(v: torch.Tensor) -> torch.Tensor:
    """``[2, ...]`` float32 -> ``[3, ...]`` float64 ``v0 v0, v1 v1, v0 v1``."""
    v0, v1 = v.double()
    return torch.stack([v0 * v0, v1 * v1, v0 * v1])


def column_sums(v: torch.Tensor, width: int, carry: torch.Tensor | None = None) -> torch.Tensor:
    """``[2, R * width]`` (whole rows) -> ``[3, width]`` float64 column sums of the products, rows added in
    order onto ``carry`` (a running sum: the same bits however the rows are cut into chunks)."""
    p = _products(v.reshape(2, -1, width))  # [3, R, width]
    start = torch.zeros(3, 1, width, dtype=torch.float64) if carry is None else carry[:, None, :]
    return torch.cat([start, p], dim=1).cumsum(1)[:, -1]


def nuslerp_prepare(source: TensorSource) -> torch.Tensor | None:
    """The column sums (``columns`` layout) or the Gram matrix (``flat``) of a multi-chunk tensor; rows need none."""
    layout = _layout(source.params, source.shape)
    if layout == "rows":
        return None
    if layout == "flat":
        return gram_prepare(merge_space)(source)
    width = math.prod(source.shape[1:])
    carry: torch.Tensor | None = None
    for ch in source():
        carry = column_sums(merge_space(ch), width, carry)
    return carry


def _pair_coefficients(c: Chunk, t: float) -> torch.Tensor:
    """``[3, E]`` (or ``[3, 1]``) float32 coefficients of v_0, v_1 and, on raw weights, of theta_0 (a + b - 1)."""
    v = merge_space(c)
    e = v.shape[1]
    layout = _layout(c.params, c.shape)
    if layout == "flat":
        g = tensor_gram(c, merge_space)
        return _with_reference(nuslerp_coefficients(g[0, 0:1], g[1, 1:2], g[0, 1:2], t)).float()
    if layout == "rows":
        width = c.shape[-1] if len(c.shape) >= 2 else e
        s = _pairwise_row_sums(_products(v.reshape(2, -1, width)).reshape(-1, width)).reshape(3, -1)
        return _with_reference(nuslerp_coefficients(s[0], s[1], s[2], t)).float().repeat_interleave(width, dim=1)
    width = math.prod(c.shape[1:])
    s = c.stats.prepared if c.stats.prepared is not None else _whole_columns(c, v, width)
    return _with_reference(nuslerp_coefficients(s[0], s[1], s[2], t)).float().repeat(1, e // width)


def _with_reference(ab: torch.Tensor) -> torch.Tensor:
    """``[2, R]`` float64 (a, b) -> ``[3, R]`` with ``a + b - 1``, the reference's coefficient on raw weights."""
    return torch.cat([ab, (ab[0] + ab[1] - 1.0)[None]])


def _whole_columns(c: Chunk, v: torch.Tensor, width: int) -> torch.Tensor:
    if not c.whole:
        raise RuntimeError(f"{c.name}: NuSLERP's column statistics missing for a partial chunk (prepare was not run)")
    return column_sums(v, width)


def nuslerp(c: Chunk) -> torch.Tensor:
    if c.tau.shape[0] != 2:
        raise MergeError(f"tensor {c.name!r}: NuSLERP merges exactly 2 models (got {c.tau.shape[0]})")
    k = _pair_coefficients(c, nuslerp_t(c.weights))
    delta = k[0] * c.tau[0] + k[1] * c.tau[1]
    if not c.has_base:
        delta += k[2] * c.base
    return delta


# --------------------------------------------------------------------------- prepare hooks of the multi-chunk tensors

karcher_prepare = gram_prepare(raw_weights)
multislerp_prepare = gram_prepare(merge_space)
