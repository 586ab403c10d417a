"""LiNeS at merge time: the reference's alpha, known in closed form or found by a pre-pass, and each tensor's scale.

``lines.py`` defines the scaling (lambda(l) = alpha + beta l / (L - 1)) and its parameters. Here:

- ``exact_alpha``: alpha = ||sum_i tau_i||_1 / (N ||tau*||_1) without reading anything, where tau* is a fixed
  multiple c sum_i tau_i of the plain sum (``lines.closed_form_alpha``: task arithmetic with equal weights w
  and one lambda for every tensor, alpha = 1 / (N lambda w); the linear average with equal weights, 1);
- ``alpha_pass``: otherwise one pass over every merged chunk (the method's own kernel and the tensor's
  post-steps, such as SVC, which LiNeS follows; before anything is written) summing |sum_i tau_i| and |tau*|.
  The sums are exact: each float32 magnitude is m 2^(e - 150) with an integer mantissa m < 2^24, so summing
  the mantissas per exponent in int64 (``l1_parts``) and adding the 256 buckets as exact fractions gives the
  true L1 norm, whatever the chunking, thread count or order; alpha is rounded once, so a merge is
  bit-identical however it is cut into chunks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import torch
from tqdm import tqdm

from agentmerge.engine.inputs import Scratch
from agentmerge.engine.merge_plan import MergePlan, TensorJob
from agentmerge.engine.parallel import run_parallel
from agentmerge.errors import MergeError
from agentmerge.methods.lines import LAYER, auto_alpha, closed_form_alpha, depth_scale, lines_on
from agentmerge.methods.params import MethodParams

# (job, start, stop) -> ([E] sum_i tau_i, [E] the merged chunk minus theta_0), float32
Deltas = Callable[[TensorJob, int, int], tuple[torch.Tensor, torch.Tensor]]
_BUCKETS = 256  # float32 exponents
_MANTISSA = (1 << 23) - 1
_SLICE = 1 << 16  # elements of a chunk l1_parts takes at a time (its temporaries: 28 B an element, ~2 MB)


@dataclass(frozen=True)
class DepthScaling:
    """What the write pass needs to scale a tensor: L and the reference's alpha (None when no tensor uses it)."""

    layers: int
    alpha: float | None

    def record(self) -> dict[str, Any]:
        """merge.json's ``lines``: the layer rule, L, and the reference's alpha when it was used (else null)."""
        return {"layer_rule": LAYER.pattern, "layers": self.layers, "reference_alpha": self.alpha}

    def scale(self, job: TensorJob) -> float | None:
        """The tensor's ``lambda(l)``, or None when its parameters leave LiNeS off."""
        if not lines_on(job.params):
            return None
        alpha = self.alpha if auto_alpha(job.params) else MethodParams.of(job.params).lines_shallow
        assert alpha is not None, "the reference's alpha was not computed"
        return depth_scale(job.name, self.layers, alpha, float(job.params["lines_beta"]))


def depth_scaling(plan: MergePlan, deltas: Deltas, quiet: bool = True) -> DepthScaling | None:
    """The merge's depth scaling: None without LiNeS; alpha in closed form, or from ``alpha_pass``."""
    jobs = [j for j in plan.merged if lines_on(j.params)]
    if not jobs:
        return None
    if not any(auto_alpha(j.params) for j in jobs):
        return DepthScaling(plan.layers, None)
    alpha = exact_alpha(plan)
    return DepthScaling(plan.layers, alpha if alpha is not None else alpha_pass(plan, deltas, quiet))


def exact_alpha(plan: MergePlan) -> float | None:
    """alpha without a pass where the method's merged vector is a fixed multiple of sum_i tau_i (``lines``); not
    when a post-step (SVC) rewrites some tensor's merged vector first."""
    if not plan.merged or any(j.steps for j in plan.merged):
        return None
    weights = plan.weights.tolist()
    if len(set(weights)) != 1:
        return None
    record = plan.method.record
    return closed_form_alpha(
        len(weights), {record.of(j.params).sum_multiple(weights[0], len(weights)) for j in plan.merged}
    )


def needs_pass(plan: MergePlan) -> bool:
    """Whether the merge reads its inputs once more for LiNeS's alpha (the dry run counts it)."""
    auto = any(auto_alpha(j.params) for j in plan.merged)
    return auto and exact_alpha(plan) is None


def l1_parts(x: torch.Tensor, slice_size: int = _SLICE, scratch: Scratch | None = None) -> torch.Tensor:
    """``[E]`` finite float32 -> ``[256]`` int64: per exponent field e, the sum of the integer mantissas of |x|
    (|x| = mantissa * 2^(max(e, 1) - 150), denormals included).

    Its temporaries (28 bytes an element) are buffers of ``scratch``: this thread's, reused from chunk to chunk,
    with the whole chunk at once; without it, one set of ``slice_size`` elements reused over the slices. Fresh
    temporaries on every chunk let glibc's heap grow by about a chunk a chunk on some runs (0.4 to 3.6 GB of
    anonymous memory for one merge, the same code, one thread).
    """
    buffers, step = (scratch, max(x.numel(), 1)) if scratch is not None else (Scratch(), slice_size)
    out = torch.zeros(_BUCKETS, dtype=torch.int64)
    for start in range(0, x.numel(), step):
        part = x[start : start + step]
        n = part.numel()
        bits = torch.abs(part, out=buffers.get("l1_abs", n, torch.float32)).view(torch.int32)
        exponent = torch.bitwise_right_shift(bits, 23, out=buffers.get("l1_exponent", n, torch.int32))
        mantissa = torch.bitwise_and(bits, _MANTISSA, out=buffers.get("l1_mantissa", n, torch.int32))
        hidden = torch.clamp(exponent, max=1, out=buffers.get("l1_hidden", n, torch.int32)).bitwise_left_shift_(23)
        mantissa.bitwise_or_(hidden)  # the implicit leading 1 of a normal number (exponent field >= 1)
        index = buffers.get("l1_index", n, torch.int64).copy_(exponent)
        out.scatter_add_(0, index, buffers.get("l1_value", n, torch.int64).copy_(mantissa))
    return out


def exact_value(parts: torch.Tensor) -> Fraction:
    """The exact sum that ``l1_parts`` buckets stand for."""
    total = sum(int(m) << max(e, 1) for e, m in enumerate(parts.tolist()) if m)
    return Fraction(total, 1 << 150)


def alpha_pass(plan: MergePlan, deltas: Deltas, quiet: bool = True) -> float:
    """``||sum_i tau_i||_1 / (N ||tau*||_1)`` over every merged tensor, exactly, chunk-parallel.

    Each chunk's buckets are added into one running ``[2, 256]`` sum (integers: any order, the same sums) and
    nothing of a chunk outlives it: a small result kept per chunk, allocated among the chunk's freed
    temporaries, split their holes so the next chunk's did not fit, and the heap grew by about a chunk a chunk
    (measured: 4.7 GB of anonymous memory on the 7B-wide shape at ``--max-memory 1GB``).
    """
    scratch = Scratch()  # per thread: l1_parts's buffers, reused from chunk to chunk
    parts = torch.zeros(2, _BUCKETS, dtype=torch.int64)
    lock = threading.Lock()

    def task(job: TensorJob, start: int, stop: int) -> Callable[[], None]:
        def run() -> None:
            total, merged = deltas(job, start, stop)
            chunk = (l1_parts(total, scratch=scratch), l1_parts(merged, scratch=scratch))
            with lock:
                parts[0] += chunk[0]
                parts[1] += chunk[1]

        return run

    tasks = [task(job, s, e) for job in plan.merged for s, e in job.chunks]
    with tqdm(total=len(tasks), desc="LiNeS alpha", unit="chunk", disable=quiet, leave=False) as bar:
        run_parallel(tasks, plan.threads, bar)
    total, merged = exact_value(parts[0]), exact_value(parts[1])
    if merged == 0:
        raise MergeError(
            f"LiNeS: {plan.method.name}'s merged task vector is zero on every tensor, so the reference's alpha "
            "is undefined; set lines_shallow"
        )
    return float(total / (len(plan.weights) * merged))
