"""Pure tensor primitives over a stack of task vectors.

Shapes: ``E`` elements of one chunk of one tensor (flattened), ``N`` agents.

    tau_i      = theta_i - theta_0                        task vector of agent i      [N, E] float32
    m_i[p]     = |tau_i[p]| > eps   (strict)              update mask                 [N, E] bool
    c[p]       = sum_i m_i[p]                             overlap count               [E]    int
    H[i, k]    = #{p : m_i[p] and c[p] = k + 1}           overlap histogram           [N, N] int64

From ``H``: agent i's updated elements ``sum_k H[i, k]``, unique ``H[i, 0]``, shared
``sum_{k>=1} H[i, k]``, and the RAM+ overlap-unique ratio ``rho_i = shared_i / unique_i``; from its
shares ``w_k = H[i, k] / sum_k H[i, k]``, what RAM keeps of agent i counted by element,
``w_0 + sum_{k>=1} w_k / (k + 1)`` (``kept_by_count``).

Sign election (TIES, its family, RAM's ``shared: elect``), ``disjoint_merge``::

    s[p]    = sgn(sum_i w_i tau_i[p])                     (tau_i zero where an agent is left out)
    tau*[p] = sum_{i: sgn tau_i[p] = s[p]} w_i tau_i[p] / sum_{same i} w_i      (0 where none agrees)
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import torch

from agentmerge.methods.params import MethodParams, Params

RNG_BLOCK = 1 << 20  # elements per random block; chunks are aligned to this so draws never depend on chunking


def task_vectors(base: torch.Tensor, models: torch.Tensor) -> torch.Tensor:
    """``[E]`` base and ``[N, E]`` models -> ``[N, E]`` float32 task vectors."""
    return models.float() - base.float()


def sum_agents(x: torch.Tensor) -> torch.Tensor:
    """``[N, E]`` -> ``[E]``: ``((0 + x_0) + x_1) + ... + x_{N-1}`` in float32, agents in order.

    ``x.sum(0)`` does not fix the order: for N >= 5 torch sums an element differently depending on its
    position in the chunk (the last ``E mod 32`` columns go another way), so merged values would depend
    on the chunk size. A fixed order keeps results independent of chunking and lets compiled kernels
    (``agentmerge.methods.fused``) reproduce them bit for bit.
    """
    acc = torch.zeros(x.shape[1:], dtype=x.dtype)
    for row in x:
        acc += row
    return acc


def update_mask(tau: torch.Tensor, eps: float) -> torch.Tensor:
    """``[N, E]`` -> ``[N, E]`` bool: True where ``|tau| > eps`` (strictly: a delta of exactly eps is no update)."""
    return tau.abs() > eps


def overlap_count(mask: torch.Tensor) -> torch.Tensor:
    """``[N, E]`` bool -> ``[E]`` int32: how many agents updated each element."""
    return mask.sum(0, dtype=torch.int32)


MAX_PATTERN_AGENTS = 16  # update patterns are counted in 2**N bins up to this many agents


def overlap_histogram(mask: torch.Tensor) -> torch.Tensor:
    """``[N, E]`` bool -> ``[N, N]`` int64 with ``H[i, k]`` = elements agent i updated together with k others."""
    n = mask.shape[0]
    if n <= MAX_PATTERN_AGENTS:
        return histogram_from_patterns(pattern_counts(mask))
    count = overlap_count(mask)
    hist = torch.empty(n, n, dtype=torch.int64)
    for k in range(n):
        hist[:, k] = (mask & (count == k + 1)).sum(1)
    return hist


def pattern_counts(mask: torch.Tensor) -> torch.Tensor:
    """``[N, E]`` bool -> ``[2**N]`` int64: how many elements each set of agents (bit i = agent i) updated."""
    n = mask.shape[0]
    code = torch.zeros(mask.shape[1], dtype=torch.int32)
    for i in range(n):
        code.bitwise_or_(mask[i].to(torch.int32).bitwise_left_shift_(i))
    return torch.bincount(code, minlength=1 << n)


def histogram_from_patterns(counts: torch.Tensor) -> torch.Tensor:
    """``[2**N]`` pattern counts -> ``[N, N]`` overlap histogram (agent i in a pattern of k + 1 agents)."""
    n = counts.numel().bit_length() - 1
    codes = torch.arange(counts.numel())
    member = (codes[:, None] >> torch.arange(n)) & 1  # [P, N]: agent i in pattern p
    size = member.sum(1)  # [P]: agents in pattern p
    by_size = (size[:, None] == torch.arange(1, n + 1)).to(torch.int64)  # [P, N]: pattern p has k + 1 agents
    return (member * counts.to(torch.int64)[:, None]).T @ by_size


def rho_from_histogram(hist: torch.Tensor) -> list[float]:
    """Per agent ``shared / unique`` from ``[N, N]`` histogram; ``inf`` when an agent has no unique element."""
    unique = hist[:, 0].tolist()
    shared = hist[:, 1:].sum(1).tolist()
    return [s / u if u else float("inf") for s, u in zip(shared, unique, strict=True)]


def kept_by_count(overlap: Sequence[float]) -> float:
    """What RAM keeps of one agent's update, counted by element: ``w_0 + sum_{k>=1} w_k / (k + 1)``.

    ``w_k`` is the share of the agent's updated elements that exactly ``k`` other agents also updated. RAM
    keeps a unique update whole and takes the mean of the ``k + 1`` updates of a shared element, so there the
    agent's own update enters at ``1 / (k + 1)`` (the others', if unrelated to it, add nothing along it). It
    estimates ``agentmerge probe --merged``'s kept, <Delta, tau_i> / <tau_i, tau_i>, and equals it when the
    agent's update has one magnitude everywhere and the others are orthogonal to it; plain averaging keeps
    ``1 / N`` of every agent.
    """
    return sum(w / (k + 1) for k, w in enumerate(overlap))


def disjoint_merge(tau: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``[N, E]`` (zeros = dropped), ``[N]`` -> ``[E]``: TIES sign election by mass and disjoint weighted mean.

    ``s[p] = sgn(sum_i w_i tau_i[p])``; the mean of the nonzero ``w_i tau_i[p]`` with sign ``s[p]`` over their
    weights, 0 where none agrees (``s = 0`` included). TIES, its family and RAM's ``shared: elect`` share it.
    """
    wt = tau * weights[:, None]  # [N, E]
    elected = torch.sign(sum_agents(wt))  # [E] in {-1, 0, 1}
    wt.mul_(elected)  # > 0 exactly where the entry is nonzero and agrees with the elected sign
    agree = wt > 0  # [N, E]
    num = sum_agents(wt.clamp_(min=0.0)).mul_(elected)  # sum of the agreeing w_i tau_i (all of one sign)
    return safe_divide(num, agreeing_weight(agree, weights))


def agreeing_weight(agree: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``[N, E]`` bool, ``[N]`` -> ``[E]`` ``sum_i agree_i * w_i``, agents added in order (as ``sum_agents``).

    ``acc + w_i * agree_i`` with ``agree_i`` in {0, 1} is exact whether or not it is fused, so this equals
    ``sum_agents(agree * weights[:, None])`` bit for bit without the ``[N, E]`` float copy.
    """
    acc = torch.zeros(agree.shape[1:], dtype=torch.float32)
    for row, w in zip(agree, weights.tolist(), strict=True):
        acc.add_(row, alpha=w)
    return acc


def safe_divide(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``[E]`` ``num / den`` where ``den != 0``, else 0 (``num`` is overwritten)."""
    return zero_unless(num.div_(den), den != 0)


def zero_unless(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """In place: contiguous float32 ``x`` -> ``x`` where ``keep``, else +0.0; returns ``x``.

    The same bits as ``torch.where(keep, x, 0.0)``, as an AND of the bit patterns with an all-ones or
    all-zeros int32 mask, which is a few times faster than ``where``/``masked_fill_`` on a random mask.
    """
    x.view(torch.int32).bitwise_and_(keep.to(torch.int32).neg_())
    return x


def seeded_uniform(seed: int, name: str, start: int, stop: int, rows: int) -> torch.Tensor:
    """``[rows, stop - start]`` uniform draws in [0, 1) for elements ``start:stop`` of tensor ``name``.

    Each block of ``RNG_BLOCK`` elements has its own generator seeded from (seed, name, block), so the
    draws for an element do not depend on how the tensor is chunked, on thread count or on tensor order.
    """
    out = torch.empty(rows, stop - start)
    for block, b0, lo, hi in rng_blocks(start, stop):
        gen = torch.Generator().manual_seed(block_seed(seed, name, block))
        draws = torch.rand(rows, RNG_BLOCK, generator=gen)
        out[:, lo - start : hi - start] = draws[:, lo - b0 : hi - b0]
    return out


def rng_blocks(start: int, stop: int) -> Iterator[tuple[int, int, int, int]]:
    """``(block, block start, lo, hi)`` per random block that elements ``start:stop`` touch (``lo:hi`` inside it)."""
    for block in range(start // RNG_BLOCK, (stop - 1) // RNG_BLOCK + 1) if stop > start else ():
        b0 = block * RNG_BLOCK
        yield block, b0, max(start, b0), min(stop, b0 + RNG_BLOCK)


def block_seed(seed: int, name: str, block: int) -> int:
    """The generator seed of block ``block`` of tensor ``name`` (63 bits of a keyed hash)."""
    digest = hashlib.blake2b(f"{seed}\0{name}\0{block}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


R = TypeVar("R", bound=MethodParams)


class HasParams(Protocol):
    """A chunk's spec or a tensor's source: its parameters, and each model's when models set their own."""

    @property
    def params(self) -> Params: ...

    @property
    def model_params(self) -> tuple[Params, ...]: ...


@dataclass(frozen=True)
class PerAgent:
    """One per-model parameter of a tensor: each model's own value when models set params, else the tensor's."""

    tensor: float
    models: tuple[float, ...]  # () when no model sets params

    @classmethod
    def of(cls, record: type[R], where: HasParams, get: Callable[[R], float]) -> PerAgent:
        """``get`` of ``where``'s parameters (and of each model's) read as ``record``."""
        return cls(get(record.of(where.params)), tuple(get(record.of(mp)) for mp in where.model_params))

    def values(self, n: int) -> torch.Tensor:
        """``[N]`` float64: the value of each of ``n`` agents."""
        if self.models:
            return torch.tensor(self.models, dtype=torch.float64)
        return torch.full((n,), self.tensor, dtype=torch.float64)

    def every(self) -> tuple[float, ...]:
        """The distinct places the value is set: each model's, or the tensor's."""
        return self.models or (self.tensor,)
