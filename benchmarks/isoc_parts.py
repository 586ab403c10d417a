"""Where Iso-C's time goes on one embedding-sized matrix: its SVD against the rest of its kernel.

Three bf16 task vectors of Qwen2.5-0.5B's embedding shape (151,936 x 896, random), one torch thread, CPU seconds
per step of ``methods.spectral.iso_c``: upcast and sum, the float32 SVD, ``U Vh * mean(S)``, the cast back. The
merge's reading and writing of the tensor are not here (docs/performance.md, "SVD methods and SVC").

    .venv/bin/python benchmarks/isoc_parts.py [--rows 151936] [--cols 896] [--models 3]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def cpu_seconds(step: Callable[[], T]) -> tuple[T, float]:
    start = time.process_time()
    out = step()
    return out, time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=151936)
    parser.add_argument("--cols", type=int, default=896)
    parser.add_argument("--models", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    taus = [torch.randn(args.rows, args.cols).to(torch.bfloat16) for _ in range(args.models)]
    total, t_sum = cpu_seconds(lambda: sum(t.float() for t in taus))
    assert isinstance(total, torch.Tensor)
    (u, s, vh), t_svd = cpu_seconds(lambda: torch.linalg.svd(total, full_matrices=False))
    out, t_rec = cpu_seconds(lambda: (u @ vh).mul_(float(s.mean())))
    _, t_cast = cpu_seconds(lambda: out.to(torch.bfloat16))
    kernel = t_sum + t_svd + t_rec + t_cast
    print(
        f"upcast+sum {t_sum:.2f}  svd {t_svd:.2f}  U@Vh*mean(S) {t_rec:.2f}  cast {t_cast:.2f}  "
        f"(kernel / svd {kernel / t_svd:.2f})"
    )


if __name__ == "__main__":
    main()
