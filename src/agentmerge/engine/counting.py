"""Counting over chunks, before the write pass: overlap histograms, adaptive mask thresholds, compiled rounds.

``overlap_stats`` counts the ``[N, N]`` overlap histogram of each tensor under its mask rule (RAM+ and the
probe), ``mask_levels`` first computes the thresholds of adaptive mask rules, tensor by tensor; both
read what an earlier run counted for the same files from the cache (``caches``). ``run_rounds`` computes a
compiled method's whole-tensor statistics (e.g. exact thresholds) in chunk-parallel rounds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from tqdm import tqdm

from agentmerge.engine.caches import LevelsCache, OverlapCache
from agentmerge.engine.inputs import Inputs, Scratch
from agentmerge.engine.merge_plan import MergePlan, TensorJob
from agentmerge.engine.parallel import fold_parallel, run_parallel
from agentmerge.methods.deltas import histogram_from_patterns, overlap_histogram, task_vectors
from agentmerge.methods.fused.jit import available
from agentmerge.methods.fused.kernels import counts
from agentmerge.methods.hooks import ModelSum
from agentmerge.methods.masks import Levels, tensor_levels, tensor_mask
from agentmerge.methods.spec import MaskRule, Rounds, TensorStats


def overlap_stats(
    inputs: Inputs,
    rules: Mapping[str, MaskRule],
    threads: int,
    chunk: int,
    quiet: bool = True,
    levels: Mapping[str, Levels] | None = None,
) -> dict[str, torch.Tensor]:
    """The statistics pass: ``[N, N]`` overlap histogram of each tensor named in ``rules``, under its mask rule.

    Counts only, nothing written; chunks of ``chunk`` elements on ``threads`` workers. ``levels`` holds
    the thresholds of the tensors whose rule is adaptive (``mask_levels``). Histograms already counted
    for these very files and rules (``OverlapCache``) are not counted again.
    """
    cache = OverlapCache([c.weight_files for c in inputs.checkpoints])
    known = cache.get(rules, len(inputs.models))
    todo = {name: rule for name, rule in rules.items() if name not in known}
    tasks, owners = [], []
    scratch = Scratch()
    for name, rule in todo.items():
        numel = inputs.reference.tensors[name].numel
        level = (levels or {}).get(name)
        for s in range(0, numel, chunk):
            tasks.append(_hist_task(inputs, name, s, min(s + chunk, numel), rule, level, scratch))
            owners.append(name)
    n = len(inputs.models)
    counted = {name: torch.zeros(n, n, dtype=torch.int64) for name in todo}
    with tqdm(total=len(tasks), desc="statistics", unit="chunk", disable=quiet or not tasks, leave=False) as bar:
        for name, h in zip(owners, run_parallel(tasks, threads, bar), strict=True):
            counted[name] += h
    cache.put(counted, todo)
    return {name: known[name] if name in known else counted[name] for name in rules}


def mask_levels(
    inputs: Inputs, rules: Mapping[str, MaskRule], threads: int, chunk: int, quiet: bool = True
) -> dict[str, Levels]:
    """The per-agent thresholds of every tensor in ``rules`` whose rule is adaptive, one tensor per worker.

    Each tensor is streamed in chunks of ``chunk`` elements (float32 task vectors, inputs checked finite);
    the values do not depend on ``chunk`` (``masks.tensor_levels``). Thresholds already computed for these
    very files and rules (``LevelsCache``) are read instead; nothing is read or stored when no rule is adaptive.
    """
    adaptive = {name: rule for name, rule in rules.items() if rule.adaptive}
    if not adaptive:
        return {}
    cache = LevelsCache([c.weight_files for c in inputs.checkpoints])
    known = cache.get(adaptive, len(inputs.models))
    wanted = {name: rule for name, rule in adaptive.items() if name not in known}

    def task(name: str, rule: MaskRule) -> Callable[[], Levels]:
        numel = inputs.reference.tensors[name].numel

        def batches() -> Iterator[tuple[int, torch.Tensor]]:
            for s in range(0, numel, chunk):
                ref, models = inputs.read(name, s, min(s + chunk, numel))
                yield s, models.sub_(ref)

        return lambda: tensor_levels(rule, name, numel, batches)

    tasks = [task(name, rule) for name, rule in wanted.items()]
    with tqdm(total=len(tasks), desc="mask thresholds", unit="tensor", disable=quiet or not tasks, leave=False) as bar:
        computed = dict(zip(wanted, run_parallel(tasks, threads, bar), strict=True))
    cache.put(computed, wanted)
    return {name: known[name] if name in known else computed[name] for name in adaptive}


def _hist_task(
    inputs: Inputs, name: str, start: int, stop: int, rule: MaskRule, levels: Levels | None, scratch: Scratch
) -> Callable[[], torch.Tensor]:
    def task() -> torch.Tensor:
        if rule.plain and available(len(inputs.models)):
            counted = counts(*inputs.read_stored(name, start, stop, scratch), rule.epsilon)
            if counted.finite:
                return histogram_from_patterns(counted.patterns)
        ref, models = inputs.read(name, start, stop)  # also the path that names a non-finite input
        return overlap_histogram(tensor_mask(task_vectors(ref, models), ref, rule, levels))

    return task


def model_sum(inputs: Inputs, plan: MergePlan, total: ModelSum, levels: Mapping[str, Levels], quiet: bool) -> Any:
    """A ``ModelSum`` pass: ``total.count`` of every chunk of every merged tensor, summed in plan order as the
    chunks come in (so the sum does not depend on threads, and no chunk's result outlives the sum); None, and
    nothing read, when ``total.wanted`` holds for no tensor.

    Each chunk is a ``Chunk`` with its values, its extra tensors and its tensor's adaptive thresholds (``levels``),
    so its mask is the one the write pass will use.
    """
    if not any(total.wanted(j.params) for j in plan.merged):
        return None

    def task(job: TensorJob, start: int, stop: int) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            ref, models = inputs.read(job.name, start, stop)
            spec = plan.spec(job, start, stop, TensorStats(levels=levels.get(job.name)))
            return total.count(spec.with_values(ref, models.sub_(ref), inputs.read_extras(job.name, start, stop)))

        return run

    tasks = [task(job, s, e) for job in plan.merged for s, e in job.chunks]
    with tqdm(total=len(tasks), desc=total.label, unit="chunk", disable=quiet, leave=False) as bar:
        return fold_parallel(tasks, plan.threads, _add, None, bar)


def _add(acc: torch.Tensor | None, counted: torch.Tensor) -> torch.Tensor:
    """One step of a left-to-right sum (the first term is kept as it is, so 0 + c0 + c1 ... is the same bits)."""
    return counted if acc is None else acc.add_(counted)


def run_rounds(
    inputs: Inputs, plan: MergePlan, jobs: Sequence[TensorJob], rounds: Rounds, quiet: bool = True
) -> dict[str, Any]:
    """A compiled method's whole-tensor statistics of ``jobs``: ``{name: final value}``, chunk-parallel.

    Each round counts every chunk of the tensors still open and settles each tensor's summed counts as
    soon as its last chunk is in, so memory holds only the tensors in flight. A tensor with a non-finite
    input is left out (its chunks then take the reference path, which names the file).
    """
    states: dict[str, Any] = {job.name: None for job in jobs}
    scratch = Scratch()
    open_jobs, label = list(jobs), "statistics (1st pass)"
    while open_jobs:
        settled = _count_round(inputs, plan, open_jobs, rounds, states, scratch, label, quiet)
        for job in open_jobs:
            if job.name in settled:
                states[job.name] = settled[job.name]
            else:
                del states[job.name]  # a non-finite input
        open_jobs = [job for job in open_jobs if job.name in settled and not rounds.done(settled[job.name])]
        label = "statistics (next pass)"
    return states


def _count_round(
    inputs: Inputs,
    plan: MergePlan,
    jobs: Sequence[TensorJob],
    rounds: Rounds,
    states: Mapping[str, Any],
    scratch: Scratch,
    label: str,
    quiet: bool,
) -> dict[str, Any]:
    """One round of ``run_rounds``: ``{name: settled state}`` of every job whose inputs were finite."""
    lock = threading.Lock()
    totals: dict[str, torch.Tensor] = {}
    left = {job.name: len(job.chunks) for job in jobs}
    broken: set[str] = set()
    settled: dict[str, Any] = {}

    def task(job: TensorJob, start: int, stop: int) -> Callable[[], None]:
        def run() -> None:
            ref, models = inputs.read_stored(job.name, start, stop, scratch)
            counted, ok = rounds.count(ref, models, plan.spec(job, start, stop), states[job.name])
            with lock:
                total = totals[job.name] = counted if job.name not in totals else totals[job.name].add_(counted)
                if not ok:
                    broken.add(job.name)
                left[job.name] -= 1
                if left[job.name] == 0:
                    del totals[job.name]
                    if job.name not in broken:
                        settled[job.name] = rounds.settle(total, plan.spec(job, 0, job.numel), states[job.name])

        return run

    tasks = [task(job, s, e) for job in jobs for s, e in job.chunks]
    with tqdm(total=len(tasks), desc=label, unit="chunk", disable=quiet, leave=False) as bar:
        run_parallel(tasks, plan.threads, bar)
    return settled
