"""What the whole-tensor (SVD) jobs of a plan hold and cost: the dry run's memory figure and time estimate.

A whole tensor of ``E`` elements holds ``E * (4 (N + 1 + copies) + out_bytes)`` bytes while it is merged
(``plan.MergePlan.whole_bytes``): its N + 1 inputs in float32, the kernel's own copies (SVD work space
included, ``hooks.WholeTensor.copies``) and the cast output. Those that fit one thread's share of the budget
run in the pool (at most ``threads`` at once, within the budget); the others one at a time after it, so the
peak is ``max(budget, the largest of them)``, besides what the process holds anyway (Python, torch, numba:
about 0.2 GB of anonymous memory, measured by ``benchmarks/speed.py``).

Time: each SVD of ``m x n`` costs ``methods.matrices.svd_flops(m, n)``; the rate comes from one probe SVD on
one thread (``svd_rate``), and the estimate assumes the threads divide the work. It leaves out the matrix
products and the reads, which the dry run estimates apart.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch

from agentmerge.engine.merge_plan import MergePlan, TensorJob
from agentmerge.engine.parallel import torch_threads
from agentmerge.methods.linalg import svd
from agentmerge.methods.matrices import is_vocab, svd_flops

PROBE_SHAPE = (1024, 768)  # about 0.1 s on one core of a 2020s CPU


@functools.cache
def svd_rate() -> float:
    """Flops per second of a float32 SVD on one thread of this machine (one probe, the faster of two runs)."""
    a = torch.randn(*PROBE_SHAPE, generator=torch.Generator().manual_seed(0))
    with torch_threads(1):
        seconds = []
        for _ in range(2):
            t0 = time.perf_counter()
            svd(a)
            seconds.append(time.perf_counter() - t0)
    return svd_flops(*PROBE_SHAPE) / max(min(seconds), 1e-9)


def job_flops(job: TensorJob) -> float:
    return sum(svd_flops(m, n) for m, n in job.svds)


@dataclass(frozen=True)
class WholeCost:
    """The whole-tensor jobs of a plan: how many, how many alone, the largest one's bytes, their SVD work."""

    tensors: int
    alone: int
    largest: str
    largest_shape: tuple[int, ...]
    largest_bytes: int
    flops: float  # every run of the kernels included
    vocab_flops: float  # of that, on embeddings and LM head (``svd_embeddings: false`` skips it)
    runs: int = 1  # how often the kernels run on each tensor (2: LiNeS's alpha pass runs them before the write)

    @classmethod
    def of(cls, plan: MergePlan, runs: int = 1) -> WholeCost | None:
        jobs = plan.whole_jobs
        if not jobs:
            return None
        big = max(jobs, key=plan.whole_bytes)
        return cls(
            tensors=len(jobs),
            alone=sum(plan.alone(j) for j in jobs),
            largest=big.name,
            largest_shape=big.shape,
            largest_bytes=plan.whole_bytes(big),
            flops=runs * sum(job_flops(j) for j in jobs),
            vocab_flops=runs * sum(job_flops(j) for j in jobs if is_vocab(j.name)),
            runs=runs,
        )

    def peak(self, budget: int) -> int:
        """Bytes held at most: the budget, or the largest tensor merged alone when it is larger."""
        return max(budget, self.largest_bytes if self.alone else 0)

    def seconds(self, rate: float, threads: int) -> tuple[float, float]:
        """Estimated seconds of every SVD, and of those on embeddings / LM head."""
        speed = rate * max(threads, 1)
        return self.flops / speed, self.vocab_flops / speed

    def memory_line(self, budget: int, threads: int) -> str:
        shape = " x ".join(str(x) for x in self.largest_shape)
        return (
            f"whole tensors (SVD): {self.tensors}, one chunk each, {self.tensors - self.alone} in the pool and "
            f"{self.alone} alone after it on {threads} thread(s); the largest, {self.largest} [{shape}], holds "
            f"~{_gb(self.largest_bytes)} while merged (N + 1 float32 copies, SVD work space, output): "
            f"peak ~{_gb(self.peak(budget))} besides the process's own ~0.2 GB (Python, torch)"
        )

    def time_line(self, rate: float, threads: int) -> str:
        total, vocab = self.seconds(rate, threads)
        twice = "; each twice: LiNeS's alpha pass runs the kernels too" if self.runs > 1 else ""
        line = (
            f"SVDs: ~{total:.1f} s estimated on {threads} thread(s) ({self.flops / 1e9:.3g} GFLOP at the measured "
            f"{rate / 1e9:.1f} GFLOP/s per thread{twice})"
        )
        if self.vocab_flops:
            line += f", ~{vocab:.1f} s of it on embeddings / LM head (svd_embeddings: false skips them)"
        return line


def _gb(n: int) -> str:
    return f"{n / 1e9:.3f} GB" if n >= 10**8 else f"{n / 1e6:.2f} MB"
