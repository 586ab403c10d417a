"""ResMerge (arXiv 2606.02252; the authors' ``resmerge-main.py``) as a kernel, holding one tensor per model.

For a 2-D tensor that names no embedding, LM head or norm (``rules.resmerge_wanted``), with
``eps = 1e-8``, ``cos(a, b) = <a, b> / (|a| |b| + eps)`` and ``clamp01`` clamping to [0, 1]:

    split     tau_i = H_i + R_i, H_i the top ``rank_topk`` SVD components (H_i = R_i = 0 when tau_i = 0)
    backbone  A = 0 if max_i |R_i| <= eps; else q_i = R_i / (|R_i| + eps), s = mean_{i<j} cos(q_i, q_j) (1 for
              one model), q_sum = sum_i q_i; A = mean_i R_i if |q_sum| <= eps; else q = q_sum / (|q_sum| + eps),
              c = clamp01(mean_i cos(q_i, q)), score = clamp01((clamp01((s+1)/2) + clamp01((c+1)/2)) / 2 * fam)
              (fam = 1 for attention / FFN names, else 0), beta = beta_max - (beta_max - beta_min) score;
              A = mean_i R_i if c <= 1/sqrt(N), else c^beta * mean_i |R_i| * q
    head      rel = clamp01(mean_{i<j} max(0, cos(H_i/|H_i|, H_j/|H_j|))) over the heads with |H| > eps
              (1 for one such head, 0 for none); C = rho rel |A| mean_i H_i / |mean_i H_i| when rho rel > 0,
              |A| > 1e-8 and |mean_i H_i| > 1e-8, else 0
    delta     A + C                                  (every other tensor: mean_i tau_i, the experts' mean)

Only the task vectors are held whole: heads are kept as their factors (``U_K, s_K, V_K``) and residuals are
rebuilt from them when needed, so the dot products among the ``q_i`` come from the residuals' Gram matrix
(two passes) instead of N more dense copies. ``|H_i| = |s_K|`` and ``<H_i, H_j>`` come from the factors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from agentmerge.methods.linalg import svd
from agentmerge.methods.spec import Chunk
from agentmerge.methods.svd import ResMergeParams
from agentmerge.methods.svd.kernels import matrices, mean_tau
from agentmerge.methods.svd.rules import resmerge_family, resmerge_wanted

EPS = 1e-8


def clamp01(x: float) -> float:
    return max(0.0, min(1.0, x))


@dataclass
class Heads:
    """Each task vector's head as its top-K factors; a zero task vector has an empty head."""

    u: list[torch.Tensor]  # [m, K_i]
    s: list[torch.Tensor]  # [K_i]
    vh: list[torch.Tensor]  # [K_i, n]

    def dense(self, i: int) -> torch.Tensor:
        return (self.u[i] * self.s[i]) @ self.vh[i]

    def norm(self, i: int) -> float:
        return float(self.s[i].double().norm())

    def dot(self, i: int, j: int) -> float:
        """``<H_i, H_j> = sum_ab s_ia s_jb (u_ia . u_jb)(v_ia . v_jb)``."""
        uu, vv = self.u[i].T.double() @ self.u[j].double(), self.vh[i].double() @ self.vh[j].T.double()
        return float((self.s[i].double()[:, None] * self.s[j].double()[None, :] * uu * vv).sum())


def heads_of(taus: torch.Tensor, k: int) -> Heads:
    heads = Heads([], [], [])
    for tau in taus:
        if float(tau.norm()) <= 0.0:
            top = 0
            u, s, vh = torch.zeros(tau.shape[0], 0), torch.zeros(0), torch.zeros(0, tau.shape[1])
        else:
            u, s, vh = svd(tau)
            top = min(k, s.numel())
        heads.u.append(u[:, :top].clone())
        heads.s.append(s[:top].clone())
        heads.vh.append(vh[:top].clone())
        del u, s, vh
    return heads


def residual_gram(taus: torch.Tensor, heads: Heads) -> torch.Tensor:
    """``[N, N]`` float64: ``<R_i, R_j>``, each residual rebuilt from its head when needed."""
    n = taus.shape[0]
    gram = torch.zeros(n, n, dtype=torch.float64)
    for i in range(n):
        r_i = taus[i] - heads.dense(i)
        for j in range(i + 1):
            r_j = r_i if j == i else taus[j] - heads.dense(j)
            gram[i, j] = gram[j, i] = float(torch.dot(r_i.view(-1), r_j.view(-1)))
    return gram


def pair_mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 1.0


def backbone(c: Chunk, taus: torch.Tensor, heads: Heads) -> torch.Tensor:
    """SRC-A: the residual backbone ``A`` (``[m, n]``)."""
    n = taus.shape[0]
    gram = residual_gram(taus, heads)
    norms = gram.diagonal().clamp(min=0).sqrt().tolist()
    if max(norms) <= EPS:
        return torch.zeros(taus.shape[1:])
    scale = [1.0 / (x + EPS) for x in norms]  # q_i = R_i * scale_i
    q_dot = [[gram[i, j].item() * scale[i] * scale[j] for j in range(n)] for i in range(n)]
    q_norm = [math.sqrt(max(q_dot[i][i], 0.0)) for i in range(n)]
    s = pair_mean([q_dot[i][j] / (q_norm[i] * q_norm[j] + EPS) for i in range(n) for j in range(i + 1, n)])
    q_sum, mean_r = torch.zeros(taus.shape[1:]), torch.zeros(taus.shape[1:])
    for i in range(n):
        r_i = taus[i] - heads.dense(i)
        q_sum.add_(r_i, alpha=scale[i])
        mean_r.add_(r_i, alpha=1.0 / n)
    sum_norm = float(q_sum.norm())
    if sum_norm <= EPS:
        return mean_r
    src_norm = sum_norm / (sum_norm + EPS)  # |q| for q = q_sum / (|q_sum| + eps)
    cos = [sum(q_dot[i]) / (sum_norm + EPS) / (q_norm[i] * src_norm + EPS) for i in range(n)]
    coherence = clamp01(sum(cos) / n)
    fam = 1.0 if resmerge_family(c.name) else 0.0
    score = clamp01(0.5 * (clamp01((s + 1.0) * 0.5) + clamp01((coherence + 1.0) * 0.5)) * fam)
    p = ResMergeParams.of(c.params)
    beta_min, beta_max = p.beta_min, p.beta_max
    beta = beta_max - (beta_max - beta_min) * score
    if coherence <= 1.0 / math.sqrt(max(1, n)):
        return mean_r
    return q_sum.mul_(coherence**beta * (sum(norms) / n) / (sum_norm + EPS))


def head_reliability(heads: Heads) -> float:
    """Mean positive cosine among the non-zero heads (1 for one, 0 for none)."""
    live = [i for i in range(len(heads.s)) if heads.norm(i) > EPS]
    if not live:
        return 0.0
    cos = []
    for a, i in enumerate(live):
        for j in live[a + 1 :]:
            unit = heads.dot(i, j) / (heads.norm(i) * heads.norm(j))
            cos.append(max(0.0, unit / (1.0 + EPS)))  # the unit heads' cosine, with the reference's eps
    return clamp01(pair_mean(cos))


def resmerge(c: Chunk) -> torch.Tensor:
    if not resmerge_wanted(c.name, c.shape, c.params):
        return mean_tau(c)
    p = ResMergeParams.of(c.params)
    taus = matrices(c)
    heads = heads_of(taus, p.rank_topk)
    merged = backbone(c, taus, heads)
    budget = p.head_ratio_budget * head_reliability(heads)
    anchor = float(merged.norm())
    mean_head = torch.zeros_like(merged)
    for i in range(len(heads.s)):
        mean_head.add_(heads.dense(i), alpha=1.0 / len(heads.s))
    head_norm = float(mean_head.norm())
    if budget > 0.0 and anchor > 1e-8 and head_norm > 1e-8:
        merged.add_(mean_head, alpha=budget * anchor / head_norm)
    return merged.view(-1)
