"""The statistics pass: what whole tensors and the whole model must tell the kernels before the write pass.

The plan lists the passes (``MergePlan.passes``: the thresholds of adaptive mask rules when a tensor has
one, then the method's own ``Method.passes``); ``statistics_pass`` runs them in order, each by its kind
(``methods.hooks``), never by method, and ``Collected`` keeps what they found:

    MaskLevels      per-agent thresholds of each adaptive tensor          -> levels           (counting.mask_levels)
    OverlapCounts   [N, N] histogram per tensor, per group, of the model  -> hists, group_hists, model_hist
    ModelSum        one whole-model statistic                             -> model_stat       (counting.model_sum)
    TensorPrepare   whole-tensor statistics of each multi-chunk tensor    -> prepared

A kernel reads them in ``ChunkSpec.stats`` (``Collected.stats``); the method's report hook reads the
whole-model ones (``model_stats``). Methods without an ``OverlapCounts`` pass have their histograms counted
by the write pass itself (``Collected.counted`` is False), for merge.json and the merge summary.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm import tqdm

from agentmerge.engine.counting import mask_levels, model_sum, overlap_stats, run_rounds
from agentmerge.engine.inputs import Inputs
from agentmerge.engine.merge_plan import MergePlan, TensorJob
from agentmerge.engine.parallel import run_parallel
from agentmerge.methods.hooks import MaskLevels, ModelStats, ModelSum, OverlapCounts, Pass, TensorPrepare
from agentmerge.methods.masks import Levels
from agentmerge.methods.spec import Chunk, Params, TensorSource, TensorStats


@dataclass
class Collected:
    """Per tensor and for the whole model: what the passes found; the write pass adds histograms (and the
    kernels' warnings) from any thread."""

    hists: dict[str, torch.Tensor] = field(default_factory=dict)  # [N, N] per merged tensor
    counted: bool = False  # True: the histograms were counted before the write pass (an ``OverlapCounts``)
    prepared: dict[str, Any] = field(default_factory=dict)  # whole-tensor statistics (prepare / compiled rounds)
    model_hist: torch.Tensor | None = None  # [N, N] summed over the tensors, once they are counted
    groups: dict[str, str] = field(default_factory=dict)  # tensor -> the group its histogram is summed into
    group_hists: dict[str, torch.Tensor] = field(default_factory=dict)  # [N, N] summed over each group
    model_stat: Any = None  # a ``ModelSum``'s value
    levels: dict[str, Levels] = field(default_factory=dict)  # adaptive mask rules: per-agent thresholds per tensor
    depth: Any = None  # LiNeS (``lines_pass.DepthScaling``): each tensor's depth scale of its merged task vector
    warnings: dict[str, list[str]] = field(default_factory=dict)  # a kernel's warning -> the tensors it concerns
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def warner(self, name: str) -> Callable[[str], None]:
        """The ``ChunkSpec.warn`` of tensor ``name``: its kernel's warnings, gathered by text."""

        def warn(text: str) -> None:
            with self._lock:
                self.warnings.setdefault(text, []).append(name)

        return warn

    def warning_lines(self) -> list[str]:
        """One line per warning text, naming up to three of its tensors."""
        lines = []
        for text, names in self.warnings.items():
            shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
            lines.append(f"{text} ({len(names)} tensor{'s' if len(names) > 1 else ''}: {shown})")
        return lines

    def add_hist(self, name: str, hist: torch.Tensor) -> None:
        with self._lock:
            self.hists[name] = self.hists[name] + hist if name in self.hists else hist

    def total(self, n: int) -> torch.Tensor:
        """``[N, N]``: the histograms summed over every tensor counted so far."""
        return sum(self.hists.values(), torch.zeros(n, n, dtype=torch.int64))

    def stats(self, name: str) -> TensorStats:
        """What a kernel sees of tensor ``name``'s statistics."""
        group = self.group_hists.get(self.groups[name]) if name in self.groups else None
        return TensorStats(
            self.hists.get(name),
            self.model_hist,
            self.prepared.get(name),
            group,
            self.model_stat,
            self.levels.get(name),
        )

    def group_by(self, groups: dict[str, str]) -> None:
        """Sum the tensors' histograms (each under its tensor's mask rule) over their groups, in plan order."""
        self.groups = groups
        for name, group in groups.items():
            hist = self.hists[name]
            self.group_hists[group] = self.group_hists[group] + hist if group in self.group_hists else hist.clone()


def statistics_pass(plan: MergePlan, inputs: Inputs, quiet: bool, cached_only: bool = False) -> Collected:
    """Run the plan's passes in order (``cached_only``: those whose counts are kept across runs, for a sweep)."""
    collected = Collected()
    for p in plan.passes:
        if p.cached or not cached_only:
            _run(p, plan, inputs, collected, quiet)
    return collected


def _run(p: Pass, plan: MergePlan, inputs: Inputs, collected: Collected, quiet: bool) -> None:
    if isinstance(p, MaskLevels):
        collected.levels = mask_levels(inputs, plan.rules(), plan.threads, plan.chunk, quiet)
    elif isinstance(p, OverlapCounts):
        collected.hists = overlap_stats(inputs, plan.rules(), plan.threads, plan.chunk, quiet, collected.levels)
        collected.counted = True
        collected.model_hist = collected.total(len(inputs.models))
        collected.group_by(_groups(plan.merged, p.group))
    elif isinstance(p, ModelSum):
        collected.model_stat = model_sum(inputs, plan, p, collected.levels, quiet)
    else:
        collected.prepared = _prepared(p, plan, inputs, collected, quiet)


def _groups(jobs: Sequence[TensorJob], group: Callable[[str, Params], str | None] | None) -> dict[str, str]:
    """Tensor -> its group, for the tensors ``group`` puts in one (plan order)."""
    named = ((j.name, group(j.name, j.params)) for j in jobs) if group is not None else ()
    return {name: g for name, g in named if g is not None}


def _prepared(p: TensorPrepare, plan: MergePlan, inputs: Inputs, collected: Collected, quiet: bool) -> dict[str, Any]:
    """Whole-tensor statistics of every multi-chunk tensor: the compiled form's rounds when the compiled kernels
    run (a tensor they cannot settle, a non-finite input, goes to ``prepare``, which names the file), else the
    method's ``prepare``, one tensor per worker."""
    jobs = [j for j in plan.merged if j.chunked]
    compiled = plan.method.compiled if plan.compiled else None
    found: dict[str, Any] = {}
    if compiled is not None and compiled.rounds is not None:
        rounds = compiled.rounds
        jobs = [j for j in jobs if rounds.wanted(plan.spec(j, 0, j.numel))]
        found = run_rounds(inputs, plan, jobs, rounds, quiet)
        jobs = [j for j in jobs if j.name not in found]
    tasks = [_prepare_task(p, plan, inputs, collected, job) for job in jobs]
    bar = tqdm(total=len(tasks), desc="statistics (tensors)", unit="tensor", disable=quiet or not tasks, leave=False)
    with bar:
        found |= dict(zip((j.name for j in jobs), run_parallel(tasks, plan.threads, bar), strict=True))
    return found


def _prepare_task(
    p: TensorPrepare, plan: MergePlan, inputs: Inputs, collected: Collected, job: TensorJob
) -> Callable[[], Any]:
    def chunks() -> Iterator[Chunk]:
        for s, e in job.chunks:
            ref, models = inputs.read(job.name, s, e)
            extras = inputs.read_extras(job.name, s, e) if inputs.extras else {}
            yield plan.spec(job, s, e, collected.stats(job.name)).with_values(ref, models.sub_(ref), extras)

    source = TensorSource(job.name, job.shape, len(job.chunks), job.params, job.model_params, chunks)
    return lambda: p.prepare(source)


def model_stats(plan: MergePlan, collected: Collected) -> ModelStats:
    """The whole-model statistics a method's report hook reads (``plan.merged`` must not be empty)."""
    firsts: dict[str, Params] = {}
    for job in plan.merged:
        if job.name in collected.groups:
            firsts.setdefault(collected.groups[job.name], job.params)
    groups = {g: (h, firsts[g]) for g, h in collected.group_hists.items()}
    return ModelStats(plan.merged[0].params, collected.model_hist, groups, collected.model_stat)
