"""Slow, literal references of the SVD methods, one whole model at a time, in float64 (tests only).

Each follows the reference code line by line (fusion_bench TSVM_utils / iso_utils / svc utils, CART's
merging.py, ResMerge's resmerge-main.py; see ../shared/field-methods.md): zero-padded factors, dense heads and
residuals, Python loops over tasks and singular directions. Nothing here is shared with agentmerge's kernels.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

T = torch.Tensor


def svd(a: T) -> tuple[T, T, T]:
    u, s, vh = torch.linalg.svd(a, full_matrices=False)
    return u, s, vh


def is_vocab(name: str) -> bool:
    return "embed_tokens" in name or "lm_head" in name


def is_matrix(name: str, shape: Sequence[int], params: Mapping[str, Any]) -> bool:
    return len(shape) == 2 and (params.get("svd_embeddings", True) or not is_vocab(name))


# --------------------------------------------------------------------------- TSV-M, Iso-C, Iso-CTS (fusion_bench)


def tsv(taus: list[T], alpha: float) -> T:
    n_tasks = len(taus)
    m, n = taus[0].shape
    k = min(m, n)
    r = int(k * (1 / n_tasks))
    f64 = torch.float64
    sum_u, sum_s, sum_vh = torch.zeros(m, k, dtype=f64), torch.zeros(k, dtype=f64), torch.zeros(k, n, dtype=f64)
    for i, tau in enumerate(taus):
        u, s, vh = svd(tau)
        sum_u[:, i * r : (i + 1) * r] = u[:, :r]
        sum_s[i * r : (i + 1) * r] = s[:r]
        sum_vh[i * r : (i + 1) * r, :] = vh[:r, :]
    u_u, _, vh_u = svd(sum_u)
    u_vh, _, vh_vh = svd(sum_vh)
    return alpha * torch.linalg.multi_dot((u_u, vh_u, torch.diag(sum_s), u_vh, vh_vh))


def iso_c(taus: list[T], alpha: float) -> T:
    u, s, vh = svd(sum(taus))
    return alpha * torch.linalg.multi_dot((u, torch.diag(torch.ones_like(s) * s.mean()), vh))


def iso_cts(taus: list[T], alpha: float, fraction: float) -> T:
    k = min(taus[0].shape)
    n_tasks = len(taus)
    common = int(k * fraction)
    common = k - round((k - common) / n_tasks) * n_tasks
    u, s, v = svd(sum(taus))
    cu, cs, cv = u[:, :common], s[:common], v[:common, :]
    d = int((k - common) / n_tasks)
    space_u = torch.zeros(taus[0].shape[0], k, dtype=torch.float64)
    space_s = torch.zeros(k, dtype=torch.float64)
    space_v = torch.zeros(k, taus[0].shape[1], dtype=torch.float64)
    for i, w in enumerate(taus):
        u_ts, s_ts, v_ts = svd(w - cu @ cu.T @ w)
        space_u[:, i * d : (i + 1) * d] = u_ts[:, :d]
        space_s[i * d : (i + 1) * d] = s_ts[:d]
        space_v[i * d : (i + 1) * d, :] = v_ts[:d, :]
    space_u[:, n_tasks * d : n_tasks * d + common] = cu
    space_s[n_tasks * d : n_tasks * d + common] = cs
    space_v[n_tasks * d : n_tasks * d + common, :] = cv
    a, _, b = svd(space_u)
    c, _, e = svd(space_v)
    space_s = torch.ones_like(space_s) * space_s.mean()
    return alpha * torch.linalg.multi_dot((a @ b, torch.diag(space_s), c @ e))


# --------------------------------------------------------------------------- CART (JH-GEECS/CART merging.py)


def cart(name: str, base: T, taus: list[T], prior: float, ratio: float) -> T:
    """The merged weights (not a delta)."""
    theta_avg = base + (1.0 / len(taus)) * sum(taus)
    low_rank = ("attn" in name or "mlp" in name) and not ("ln" in name or "bias" in name) and base.dim() == 2
    total = torch.zeros_like(base)
    for tau in taus:
        value = tau + base - theta_avg
        if low_rank and ratio not in (0.0, 1.0):
            u, s, vh = svd(value)
            dim = max(1, int(ratio * s.shape[0]))
            value = (u[:, :dim] * s[:dim]) @ vh[:dim, :]
        elif ratio == 0.0:
            value = torch.zeros_like(value)
        total += value
    return theta_avg + prior * total


# --------------------------------------------------------------------------- ResMerge (resmerge-main.py)

ATTN = ("self_attn", ".attn.", "attention", "q_proj", "k_proj", "v_proj", "o_proj")
FFN = ("mlp", "ffn", "feed_forward", "gate_proj", "up_proj", "down_proj")


def resmerge_mode(name: str, ndim: int) -> bool:
    text = name.lower()
    if any(x in text for x in ("embed_tokens", "wte", "lm_head", "word_embeddings")):
        return False
    if any(x in text for x in ("norm", "ln_", "layernorm")):
        return False
    return ndim == 2


def cosine(a: T, b: T, eps: float = 1e-8) -> float:
    return float(torch.dot(a.reshape(-1), b.reshape(-1)) / (a.norm() * b.norm() + eps))


def pair_stats(vectors: list[T]) -> tuple[float, float]:
    values = [cosine(vectors[i], vectors[j]) for i in range(len(vectors)) for j in range(i + 1, len(vectors))]
    if not values:
        return 1.0, 1.0
    return sum(values) / len(values), sum(max(0.0, v) for v in values) / len(values)


def clamp01(x: float) -> float:
    return max(0.0, min(1.0, x))


def src_a(name: str, residuals: list[T], beta_min: float, beta_max: float, eps: float = 1e-8) -> T:
    n = len(residuals)
    norms = [float(r.norm()) for r in residuals]
    if max(norms) <= eps:
        return torch.zeros_like(residuals[0])
    qs = [r.reshape(-1) / (norms[i] + eps) for i, r in enumerate(residuals)]
    s_mean, _ = pair_stats(qs)
    q_sum = sum(qs)
    mean_r = sum(residuals) / n
    if float(q_sum.norm()) <= eps:
        return mean_r
    q_src = q_sum / (float(q_sum.norm()) + eps)
    coherence = clamp01(sum(cosine(q, q_src) for q in qs) / n)
    fam = 1.0 if any(x in name.lower() for x in ATTN + FFN) else 0.0
    score = clamp01(0.5 * (clamp01((s_mean + 1) * 0.5) + clamp01((coherence + 1) * 0.5)) * fam)
    beta = beta_max - (beta_max - beta_min) * score
    if coherence <= 1.0 / math.sqrt(max(1, n)):
        return mean_r
    return (q_src * (coherence**beta) * (sum(norms) / n)).reshape(residuals[0].shape)


def resmerge(name: str, taus: list[T], params: Mapping[str, Any]) -> T:
    """The merged delta."""
    if not resmerge_mode(name, taus[0].dim()):
        return sum(taus) / len(taus)
    heads, residuals = [], []
    for tau in taus:
        head = torch.zeros_like(tau)
        if float(tau.norm()) > 0.0:
            u, s, vh = svd(tau)
            for idx in range(min(int(params["rank_topk"]), s.numel())):
                head += s[idx] * torch.outer(u[:, idx], vh[idx, :])
        heads.append(head)
        residuals.append(tau - head)
    backbone = src_a(name, residuals, float(params["beta_min"]), float(params["beta_max"]))
    units = [h.reshape(-1) / float(h.norm()) for h in heads if float(h.norm()) > 1e-8]
    reliability = clamp01(pair_stats(units)[1]) if units else 0.0
    budget = float(params["head_ratio_budget"]) * reliability
    mean_head = sum(heads) / len(heads)
    anchor, head_norm = float(backbone.norm()), float(mean_head.norm())
    if budget > 0.0 and anchor > 1e-8 and head_norm > 1e-8:
        return backbone + mean_head / head_norm * (budget * anchor)
    return backbone


# --------------------------------------------------------------------------- SVC (fusion_bench, the loop version)


def svc(taus: list[T], merged_delta: T, alpha: float) -> T:
    """The calibrated merged delta."""
    u, s, vh = svd(merged_delta)
    gamma = []
    for r in range(s.numel()):
        merged_response = u[:, r] @ merged_delta
        coefs = []
        for tau in taus:
            task_response = u[:, r] @ tau
            coef = float(torch.dot(merged_response, task_response) / max(float(task_response @ task_response), 1e-12))
            coefs.append(alpha if math.isnan(coef) else coef)
        gamma.append(len(taus) / sum(max(alpha, x) for x in coefs))
    return u @ torch.diag(torch.tensor(gamma, dtype=torch.float64) * s) @ vh


# --------------------------------------------------------------------------- a whole model


def merged_delta(method: str, name: str, base: T, taus: list[T], params: Mapping[str, Any]) -> T:
    """One tensor's merged delta by the reference of ``method`` (float64 in, float64 out)."""
    mean = sum(taus) / len(taus)
    if method == "cart":
        return cart(name, base, taus, float(params["prior"]), float(params["rank_ratio"])) - base
    if method == "resmerge":
        return resmerge(name, taus, params)
    if method == "task_arithmetic":
        return float(params["scale"]) * sum(taus)
    alpha = float(params["scale"])  # the papers' alpha
    if not is_matrix(name, base.shape, params):
        return alpha * mean
    if method == "tsv":
        return tsv(taus, alpha)
    if method == "iso_c":
        return iso_c(taus, alpha)
    if method == "iso_cts":
        return iso_cts(taus, alpha, float(params["common_space_fraction"]))
    raise ValueError(method)


def merge_model(
    method: str, base: Mapping[str, T], agents: list[Mapping[str, T]], params: Mapping[str, Any]
) -> dict[str, T]:
    """Every tensor of the merged model in float64."""
    out = {}
    for name, b in base.items():
        theta0 = b.double()
        taus = [a[name].double() - theta0 for a in agents]
        delta = merged_delta(method, name, theta0, taus, params)
        if params.get("calibrate") == "svc" and is_matrix(name, b.shape, params):
            delta = svc(taus, delta, float(params["svc_floor"]))
        out[name] = theta0 + delta
    return out
