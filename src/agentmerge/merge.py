"""The driver: validate -> plan -> (statistics pass) -> stream chunks through the kernel -> write.

Every tensor is treated as a flat array and cut into element ranges ("chunks") small enough that
``threads`` chunks in flight fit the memory budget. A chunk job reads its range from the base and
each model (``pread``), computes in float32, casts once to the output dtype and writes the bytes at
their planned offset; jobs are independent, so they run on a thread pool in any order and the
output is bit-identical whatever the chunk size, shard size or thread count.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tqdm import tqdm

from agentmerge import fused
from agentmerge.baselines import RadixPlan
from agentmerge.checkpoint import (
    MODEL_FILES,
    TOKENIZER_FILES,
    Checkpoint,
    PlannedTensor,
    ShardWriter,
    TensorInfo,
    atomic_output_dir,
    copy_aux_files,
    dtype_from_name,
    plan_shards,
    set_config_dtype,
)
from agentmerge.config import MergeConfig
from agentmerge.deltas import RNG_BLOCK, histogram_from_patterns, overlap_histogram, task_vectors, update_mask
from agentmerge.errors import MergeError
from agentmerge.headers import read_json_object
from agentmerge.methods import Chunk, Method, ParamValue, TensorSource, TensorStats
from agentmerge.safety import check_output_target
from agentmerge.validate import check_fisher_role, check_output_chunk, check_tokenizer_source, input_refs

if TYPE_CHECKING:
    from agentmerge.report import InputHashes

EPS_DEFAULT = 1e-5
MAX_CHUNK = RNG_BLOCK  # elements per chunk at most (see chunk_elements)


# --------------------------------------------------------------------------- inputs


class Inputs:
    """The opened base (or reference) and models, checked to be mergeable, with chunk reads."""

    def __init__(
        self,
        base: str | None,
        models: Sequence[str],
        *,
        allow_dtype_mismatch: bool = False,
        extras: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.models: list[Checkpoint] = []
        self.extras: dict[str, list[Checkpoint]] = {}  # per-model extra tensors, e.g. "fisher"
        self.base = Checkpoint(base) if base is not None else None
        try:
            self.models = [Checkpoint(m) for m in models]
            for c in [self.reference, *self.models]:
                check_fisher_role(c, fisher=False)
            check_compatible(self.reference, self.models, allow_dtype_mismatch)
            for kind, paths in (extras or {}).items():
                self.extras[kind] = []
                for path in paths:
                    self.extras[kind].append(Checkpoint(path))
                    check_fisher_role(self.extras[kind][-1], fisher=kind == "fisher")
        except BaseException:
            self.close()
            raise

    @property
    def reference(self) -> Checkpoint:
        """The checkpoint task vectors are taken against: the base, else the first model."""
        return self.base if self.base is not None else self.models[0]

    def close(self) -> None:
        for c in [self.base, *self.models, *(e for group in self.extras.values() for e in group)]:
            if c is not None:
                c.close()

    def check_extras(self, names: Sequence[str]) -> None:
        """Every extra checkpoint holds each of ``names`` with the reference's shape, else ``MergeError``."""
        for kind, group in self.extras.items():
            for ckpt in group:
                for name in names:
                    info = ckpt.tensors.get(name)
                    want = self.reference.tensors[name].shape
                    if info is None or info.shape != want:
                        got = "lacks it" if info is None else f"has shape {list(info.shape)}"
                        raise MergeError(
                            f"{ckpt.path}: {kind} tensor {name!r} {got}, the model has shape {list(want)} "
                            f"(recompute it for this model, or exclude the tensor)"
                        )

    def read_extras(self, name: str, start: int, stop: int) -> dict[str, torch.Tensor]:
        """``{kind: [N, E] float32}`` extra per-model values of elements ``start:stop`` of ``name``."""
        out = {}
        for kind, group in self.extras.items():
            values = torch.empty(len(group), stop - start)
            for i, ckpt in enumerate(group):
                values[i] = ckpt.read(name, start, stop)
            if not bool(torch.isfinite(values).all()) or bool((values < 0).any()):
                raise MergeError(f"{kind} tensor {name!r}: values must be finite and non-negative")
            out[kind] = values
        return out

    def read(self, name: str, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``([E], [N, E])`` float32: reference and model values of elements ``start:stop`` of ``name``."""
        ref = self.reference.read(name, start, stop).float()
        models = torch.empty(len(self.models), stop - start)
        for i, m in enumerate(self.models):
            models[i] = m.read(name, start, stop)
        if not (all_finite(ref) and all_finite(models)):
            raise MergeError(_non_finite(name, ref, models, self))
        return ref, models

    def read_stored(
        self, name: str, start: int, stop: int, scratch: Scratch | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``([E], [N, E])`` as stored (no conversion, no finiteness check); models in float32 if dtypes differ.

        With ``scratch`` the values land in this thread's reused buffers (valid until its next read).
        """
        scratch = scratch or Scratch()
        e = stop - start
        ref = self.reference.read_into(name, start, scratch.get("ref", e, self.reference.tensors[name].dtype))
        dtypes = {m.tensors[name].dtype for m in self.models}
        dtype = dtypes.pop() if len(dtypes) == 1 else torch.float32
        models = scratch.get("models", len(self.models) * e, dtype).view(len(self.models), e)
        for i, m in enumerate(self.models):
            if m.tensors[name].dtype == dtype:
                m.read_into(name, start, models[i])
            else:
                models[i] = m.read(name, start, stop)
        return ref, models


class Scratch(threading.local):
    """Per-thread buffers reused from chunk to chunk: no allocation (and no page faults) per chunk."""

    def __init__(self) -> None:
        self.buffers: dict[str, torch.Tensor] = {}

    def get(self, key: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A flat ``[numel]`` tensor of ``dtype`` over this thread's buffer ``key`` (grown when too small)."""
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        buf = self.buffers.get(key)
        if buf is None or buf.numel() < nbytes:
            self.buffers[key] = buf = torch.empty(max(nbytes, 1), dtype=torch.uint8)
        return buf[:nbytes].view(dtype)


def all_finite(x: torch.Tensor) -> bool:
    """Whether every value of a float tensor is finite (one reduction; the exact test only if the sum is not)."""
    return math.isfinite(float(x.sum())) or bool(torch.isfinite(x).all())


def _non_finite(name: str, ref: torch.Tensor, models: torch.Tensor, inputs: Inputs) -> str:
    ckpts = [inputs.reference, *inputs.models]
    values = [ref, *models]
    bad = next(c for c, v in zip(ckpts, values, strict=True) if not bool(torch.isfinite(v).all()))
    return f"{bad.path}: tensor {name!r} contains NaN or Inf values; this checkpoint is broken, re-export it"


def check_compatible(ref: Checkpoint, models: Sequence[Checkpoint], allow_dtype_mismatch: bool) -> None:
    """Same architecture, same tensor names, shapes and dtypes; else a ``MergeError`` naming the first difference."""
    arch = _architecture(ref)
    for m in models:
        other = _architecture(m)
        if arch and other and arch != other:
            raise MergeError(f"{m.path}: architecture {other} differs from {ref.path}'s {arch}")
        missing, extra = ref.tensors.keys() - m.tensors.keys(), m.tensors.keys() - ref.tensors.keys()
        if missing or extra:
            what = f"lacks {sorted(missing)[0]!r}" if missing else f"has extra tensor {sorted(extra)[0]!r}"
            raise MergeError(
                f"{m.path}: tensor sets differ from {ref.path} ({what}; {len(missing)} missing, {len(extra)} extra); "
                "models must share the base's architecture"
            )
        for name, info in ref.tensors.items():
            _check_tensor(ref, m, info, m.tensors[name], allow_dtype_mismatch)


def _check_tensor(ref: Checkpoint, m: Checkpoint, a: TensorInfo, b: TensorInfo, allow_dtype: bool) -> None:
    if a.shape != b.shape:
        raise MergeError(
            f"{m.path}: tensor {a.name!r} has shape {list(b.shape)} but {ref.path} has {list(a.shape)} "
            "(vocabulary resized? merge only models with identical shapes)"
        )
    same_kind = a.dtype.is_floating_point == b.dtype.is_floating_point
    if a.dtype != b.dtype and not (allow_dtype and same_kind):
        raise MergeError(
            f"{m.path}: tensor {a.name!r} is {b.dtype} but {ref.path} stores it as {a.dtype} "
            "(convert the checkpoint, or set allow_dtype_mismatch for floating-point tensors)"
        )


def _architecture(c: Checkpoint) -> tuple[str, ...] | None:
    cfg = c.folder / "config.json"
    if not cfg.exists():
        return None
    data = read_json_object(cfg, "config.json")
    arch = data.get("architectures") or [data.get("model_type")]
    arch = arch if isinstance(arch, list) else [arch]
    return tuple(str(a) for a in arch) if any(arch) else None


# --------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class TensorJob:
    """One output tensor: how it is produced, and its element ranges."""

    name: str
    out_dtype: torch.dtype
    shape: tuple[int, ...]
    numel: int
    merged: bool  # False: copied from the reference unchanged
    chunks: tuple[tuple[int, int], ...]


def chunk_elements(cfg: MergeConfig, n_models: int, threads: int) -> int:
    """Elements per chunk so ``threads`` chunks in flight stay within ``max_memory``.

    Per element in flight: raw reads (<= 8 B x (N+1)), float32 stack (4 B x (N+1)), kernel temporaries
    (about 4 B x (2N+6)) and the cast output: budget ~ (16 N + 40) bytes. Rounded to the RNG block, and
    at most ``MAX_CHUNK``: larger chunks are no faster, and their temporaries (over glibc's 32 MB mmap
    threshold) would be mapped and zero-filled afresh for every chunk (measured: 3x the system time).
    """
    if cfg.chunk_size is not None:
        return cfg.chunk_size
    per_element = 16 * n_models + 40
    n = cfg.memory_bytes // (per_element * threads)
    return min(MAX_CHUNK, max(RNG_BLOCK // 16, (n // RNG_BLOCK) * RNG_BLOCK or n))


def plan_jobs(cfg: MergeConfig, ref: Checkpoint, chunk: int) -> list[TensorJob]:
    """Decide, per tensor of the reference, its output dtype, whether it is merged, and its chunks."""
    out_dtype = dtype_from_name(cfg.dtype) if cfg.dtype else None
    multiple = cfg.spec.chunk_multiple
    jobs = []
    for name, info in ref.tensors.items():
        floating = info.dtype.is_floating_point
        dtype = out_dtype if (out_dtype is not None and floating) else info.dtype
        step = chunk
        if multiple is not None and floating and cfg.selected(name):  # round up to the method's unit
            unit = multiple(info.shape)
            step = -(-chunk // unit) * unit
        ranges = tuple((s, min(s + step, info.numel)) for s in range(0, info.numel, step)) or ((0, 0),)
        jobs.append(TensorJob(name, dtype, info.shape, info.numel, floating and cfg.selected(name), ranges))
    return jobs


def planned_tensors(jobs: Sequence[TensorJob]) -> list[PlannedTensor]:
    return [PlannedTensor(j.name, j.out_dtype, j.shape) for j in jobs]


# --------------------------------------------------------------------------- the chunk loop


def run_parallel(tasks: Sequence[Callable[[], Any]], threads: int, progress: tqdm | None = None) -> list[Any]:
    """Run ``tasks`` on ``threads`` workers with at most 2 x threads in flight; results in task order.

    A new task is submitted as soon as any one finishes, so a slow task never leaves workers idle.
    """
    if threads == 1:
        return [_tick(t(), progress) for t in tasks]
    results: list[Any] = [None] * len(tasks)
    with ThreadPoolExecutor(threads) as pool:
        window: dict[Future[Any], int] = {}
        for i, task in enumerate(tasks):
            window[pool.submit(task)] = i
            if len(window) >= 2 * threads:
                finished, _ = wait(window, return_when=FIRST_COMPLETED)
                for fut in finished:
                    results[window.pop(fut)] = _tick(fut.result(), progress)
        for fut, j in sorted(window.items(), key=lambda item: item[1]):
            results[j] = _tick(fut.result(), progress)
    return results


def _tick(result: Any, progress: tqdm | None) -> Any:
    if progress is not None:
        progress.update(1)
    return result


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run torch single-threaded inside each worker (parallelism comes from the pool); restore after."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def overlap_stats(
    inputs: Inputs, names: Sequence[str], eps: float, threads: int, chunk: int, quiet: bool = True
) -> dict[str, torch.Tensor]:
    """The statistics pass: ``[N, N]`` overlap histogram per tensor (counts only, nothing written)."""
    tasks, owners = [], []
    scratch = Scratch()
    for name in names:
        numel = inputs.reference.tensors[name].numel
        for s in range(0, numel, chunk):
            tasks.append(_hist_task(inputs, name, s, min(s + chunk, numel), eps, scratch))
            owners.append(name)
    n = len(inputs.models)
    hists = {name: torch.zeros(n, n, dtype=torch.int64) for name in names}
    with tqdm(total=len(tasks), desc="statistics", unit="chunk", disable=quiet, leave=False) as bar:
        for name, h in zip(owners, run_parallel(tasks, threads, bar), strict=True):
            hists[name] += h
    return hists


def _hist_task(
    inputs: Inputs, name: str, start: int, stop: int, eps: float, scratch: Scratch
) -> Callable[[], torch.Tensor]:
    def task() -> torch.Tensor:
        if fused.counts_available(len(inputs.models)):
            counted = fused.fused_counts(fused.raw_chunk(*inputs.read_stored(name, start, stop, scratch)), eps)
            if counted.finite:
                return histogram_from_patterns(counted.patterns)
        ref, models = inputs.read(name, start, stop)  # also the path that names a non-finite input
        return overlap_histogram(update_mask(task_vectors(ref, models), eps))

    return task


def ties_thresholds(
    inputs: Inputs,
    work: Sequence[tuple[TensorJob, Callable[[int, int], fused.FusedCall]]],
    form: fused.TiesForm,
    threads: int,
    quiet: bool = True,
) -> dict[str, torch.Tensor]:
    """The fused TIES/DARE/Breadcrumbs statistics pass: ``{name: [N, R]}`` exact magnitude bounds, multi-chunk tensors.

    Two chunk-parallel passes of radix counts (``fused.upper_counts`` then ``fused.lower_counts`` inside the
    bin that holds each rank), the same values as ``baselines.kth_streamed``. Counts are summed per tensor
    as chunks finish, so memory holds only the tensors in flight. A tensor with a non-finite input or
    magnitude is left out (its chunks then take the reference path, which names the file).
    """
    scratch = Scratch()
    plans = _radix_pass(inputs, work, form, None, threads, quiet, scratch)
    second = [(job, make) for job, make in work if job.name in plans and plans[job.name].wanted]
    found = _radix_pass(inputs, second, form, plans, threads, quiet, scratch)
    settled = {name: plan.found(plan.lower_histogram()) for name, plan in plans.items() if not plan.wanted}
    return {**settled, **found}


def _radix_pass(
    inputs: Inputs,
    work: Sequence[tuple[TensorJob, Callable[[int, int], fused.FusedCall]]],
    form: fused.TiesForm,
    plans: Mapping[str, RadixPlan] | None,
    threads: int,
    quiet: bool,
    scratch: Scratch,
) -> dict[str, Any]:
    """One radix pass over ``work``: ``{name: RadixPlan}`` (first pass) or ``{name: [N, R] bounds}`` (second).

    Each tensor's counts are turned into its (small) result as soon as its last chunk is counted.
    """
    lock = threading.Lock()
    totals: dict[str, torch.Tensor] = {}
    left = {job.name: len(job.chunks) for job, _ in work}
    broken: set[str] = set()
    done: dict[str, Any] = {}

    def task(job: TensorJob, call: fused.FusedCall) -> Callable[[], None]:
        def run() -> None:
            raw = fused.raw_chunk(*inputs.read_stored(job.name, call.start, call.stop, scratch))
            drop = fused.chunk_drop(form, call, len(inputs.models))
            eps = fused.region_eps(form, call)
            if plans is None:
                counts, ok = fused.upper_counts(raw, drop, eps)
            else:
                counts, ok = fused.lower_counts(raw, drop, plans[job.name].bin_table(), eps)
            with lock:
                total = totals[job.name] = counts if job.name not in totals else totals[job.name].add_(counts)
                if not ok:
                    broken.add(job.name)
                left[job.name] -= 1
                if left[job.name] == 0:
                    del totals[job.name]
                    if job.name not in broken:
                        done[job.name] = plans[job.name].found(total) if plans else fused.band_plan(total, form, call)

        return run

    tasks = [task(job, make(s, e)) for job, make in work for s, e in job.chunks]
    label = "thresholds" if plans is None else "thresholds (2nd pass)"
    with tqdm(total=len(tasks), desc=label, unit="chunk", disable=quiet, leave=False) as bar:
        run_parallel(tasks, threads, bar)
    return done


# --------------------------------------------------------------------------- results


@dataclass
class MergeResult:
    """What a merge did: where it wrote, how long it took, and the overlap statistics it saw."""

    out_dir: Path
    method: str
    params: dict[str, ParamValue]
    seconds: float
    tensors: int
    merged_tensors: int
    model_hist: list[list[int]] | None = None  # [N][N] overlap histogram over merged tensors
    model_labels: list[str] = field(default_factory=list)
    numel: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "out_dir": str(self.out_dir),
            "method": self.method,
            "params": self.params,
            "seconds": round(self.seconds, 3),
            "tensors": self.tensors,
            "merged_tensors": self.merged_tensors,
            "model_hist": self.model_hist,
            "model_labels": self.model_labels,
            "numel": self.numel,
        }


# --------------------------------------------------------------------------- merge


class _Merger:
    """State of one merge run: inputs, plan, writer and statistics (private to ``merge``)."""

    def __init__(self, cfg: MergeConfig, inputs: Inputs, threads: int, quiet: bool) -> None:
        self.cfg, self.inputs, self.threads, self.quiet = cfg, inputs, threads, quiet
        self.method: Method = cfg.spec
        self.fused = fused.fused_kernel(self.method, len(inputs.models))  # None: the reference kernel
        self.form = fused.ties_form(self.method) if self.fused else None  # the fused TIES/DARE family
        self.scratch = Scratch()  # each worker's chunk buffers, freed with the run
        self.chunk = chunk_elements(cfg, len(inputs.models), threads)
        self.jobs = plan_jobs(cfg, inputs.reference, self.chunk)
        self.weights = torch.tensor([m.weight for m in cfg.models], dtype=torch.float32)
        self.params = {j.name: cfg.tensor_params(j.name) for j in self.jobs if j.merged}
        self.model_params = {j.name: cfg.model_params(j.name) for j in self.jobs if j.merged}
        inputs.check_extras([j.name for j in self.jobs if j.merged])
        self.eps = float(cfg.params.get("epsilon", EPS_DEFAULT))
        self.tensor_hists: dict[str, torch.Tensor] = {}
        self.model_hist: torch.Tensor | None = None
        self._prepared: dict[str, Any] = {}
        self._thresholded: set[str] = set()  # tensors whose fused bounds come from thresholds_pass
        self._locks = {j.name: threading.Lock() for j in self.jobs}
        self._hist_lock = threading.Lock()
        self.writer: ShardWriter | None = None

    def stats_pass(self) -> None:
        merged = [j.name for j in self.jobs if j.merged]
        self.tensor_hists = overlap_stats(self.inputs, merged, self.eps, self.threads, self.chunk, self.quiet)
        self._sum_hists()

    def thresholds_pass(self) -> None:
        """Fused TIES/DARE: the exact magnitude thresholds of every trimmed multi-chunk tensor, chunk-parallel."""
        if self.form is None:
            return
        form = self.form
        jobs = [j for j in self.jobs if j.merged and len(j.chunks) > 1 and fused.trims(form, self._call(j, 0, 0))]
        self._thresholded = {j.name for j in jobs}
        work = [(j, functools.partial(self._call, j)) for j in jobs]
        self._prepared.update(ties_thresholds(self.inputs, work, form, self.threads, self.quiet))

    def _call(self, job: TensorJob, start: int, stop: int) -> fused.FusedCall:
        stats = TensorStats(self.tensor_hists.get(job.name), self.model_hist, self._prepared.get(job.name))
        params, mp = self.params[job.name], tuple(self.model_params[job.name])
        return fused.FusedCall(params, self.weights, stats, self.eps, job.name, start, stop, self.cfg.seed, mp)

    def _sum_hists(self) -> None:
        n = len(self.inputs.models)
        self.model_hist = sum(self.tensor_hists.values(), torch.zeros(n, n, dtype=torch.int64))

    def write(self, folder: Path) -> None:
        tensors = planned_tensors(self.jobs)
        self.writer = ShardWriter(folder, plan_shards(tensors, self.cfg.shard_bytes), tensors)
        tasks = [self._chunk_task(j, s, e) for j in self.jobs for s, e in j.chunks]
        collect = not self.method.needs_model_stats
        try:
            with tqdm(total=len(tasks), desc=f"merge {self.method.name}", unit="chunk", disable=self.quiet) as bar:
                run_parallel(tasks, self.threads, bar)
        finally:
            self.writer.close()
        if collect:
            self._sum_hists()

    def _chunk_task(self, job: TensorJob, start: int, stop: int) -> Callable[[], None]:
        def task() -> None:
            assert self.writer is not None
            if not job.merged:
                copied = self.inputs.reference.read(job.name, start, stop).to(job.out_dtype)
                check_output_chunk(job.name, start, copied)
                self.writer.write(job.name, start, copied)
                return
            if self._fused_chunk(job, start, stop):
                return
            ref, models = self.inputs.read(job.name, start, stop)
            tau = models.sub_(ref)  # = task_vectors(ref, models), in place: models is ours
            delta = self.method.kernel(self._make_chunk(job, start, stop, ref, tau))
            if not self.method.needs_model_stats:
                self._add_hist(job.name, overlap_histogram(update_mask(tau, self.eps)))
            merged = (ref + delta).to(job.out_dtype)
            check_output_chunk(job.name, start, merged)
            self.writer.write(job.name, start, merged)

        return task

    def _fused_chunk(self, job: TensorJob, start: int, stop: int) -> bool:
        """Merge and write one chunk with the fused kernel; False when it does not apply (or an input is not finite)."""
        params = self.params[job.name]
        if self.fused is None or float(params.get("epsilon", self.eps)) != self.eps:
            return False
        if self.model_params[job.name] and not fused.per_model_params(self.method):
            return False
        if job.name in self._thresholded and job.name not in self._prepared:
            return False  # an input was not finite in the statistics pass: the reference path names it
        assert self.writer is not None
        raw = fused.raw_chunk(*self.inputs.read_stored(job.name, start, stop, self.scratch))
        raw.out = self.scratch.get("merged", stop - start, torch.float32)
        result = self.fused(raw, self._call(job, start, stop))
        if not result.finite or result.merged is None:
            return False  # the reference path reads again and names the broken checkpoint
        if not self.method.needs_model_stats:
            self._add_hist(job.name, histogram_from_patterns(result.patterns))
        out = self.scratch.get("out", stop - start, job.out_dtype).copy_(result.merged)
        check_output_chunk(job.name, start, out)
        self.writer.write(job.name, start, out)
        return True

    def _make_chunk(self, job: TensorJob, start: int, stop: int, ref: torch.Tensor, tau: torch.Tensor) -> Chunk:
        stats = TensorStats(self.tensor_hists.get(job.name), self.model_hist, self._prepare(job))
        return self._chunk(job, start, stop, ref, tau, stats)

    def _chunk(
        self, job: TensorJob, start: int, stop: int, ref: torch.Tensor, tau: torch.Tensor, stats: TensorStats
    ) -> Chunk:
        extras = self.inputs.read_extras(job.name, start, stop) if self.inputs.extras else {}
        params, model_params = self.params[job.name], self.model_params[job.name]
        return Chunk(
            job.name, start, stop, ref, tau, self.weights, params, stats, self.cfg.seed, extras, job.shape, model_params
        )

    def _prepare(self, job: TensorJob) -> Any:
        if self.method.prepare is None:
            return None
        with self._locks[job.name]:
            if job.name not in self._prepared:
                mp = self.model_params[job.name]
                source = TensorSource(job.name, job.shape, len(job.chunks), mp, self._source(job))
                self._prepared[job.name] = self.method.prepare(source, self.params[job.name])
            return self._prepared[job.name]

    def _source(self, job: TensorJob) -> Callable[[], Iterator[Chunk]]:
        def chunks() -> Iterator[Chunk]:
            for s, e in job.chunks:
                ref, models = self.inputs.read(job.name, s, e)
                stats = TensorStats(self.tensor_hists.get(job.name), self.model_hist)
                yield self._chunk(job, s, e, ref, task_vectors(ref, models), stats)

        return chunks

    def _add_hist(self, name: str, hist: torch.Tensor) -> None:
        with self._hist_lock:
            if name in self.tensor_hists:
                self.tensor_hists[name] += hist
            else:
                self.tensor_hists[name] = hist


def merge(
    cfg: MergeConfig, out_dir: str | Path, *, force: bool = False, quiet: bool = False, force_any: bool = False
) -> MergeResult:
    """Merge ``cfg.models`` into ``out_dir`` (written atomically). Returns what was done.

    ``force`` replaces an earlier agentmerge output at ``out_dir``; ``force_any`` any other folder (see ``safety``).
    """
    t0 = time.perf_counter()
    out = Path(out_dir)
    check_output_target(out, input_refs(cfg), force=force, force_any=force_any)
    if cfg.tokenizer_source:
        check_tokenizer_source(cfg.tokenizer_source)
    threads = cfg.threads or os.cpu_count() or 1
    extras = {kind: [getattr(m, kind) for m in cfg.models] for kind in cfg.spec.model_inputs}
    inputs = Inputs(
        cfg.base, [m.path for m in cfg.models], allow_dtype_mismatch=cfg.allow_dtype_mismatch, extras=extras
    )
    try:
        from agentmerge.report import InputHashes

        run = _Merger(cfg, inputs, threads, quiet)
        hashes = InputHashes.start(inputs)  # sha256 of the inputs for merge.json, on a background thread
        try:
            with torch_threads(1), atomic_output_dir(out, force=force or force_any) as tmp:
                if run.method.needs_model_stats:
                    run.stats_pass()
                run.thresholds_pass()
                run.write(tmp)
                _finish_folder(cfg, inputs, run, tmp, time.perf_counter() - t0, hashes)
        except BaseException:
            hashes.cancel()
            raise
    finally:
        inputs.close()
    return _result(cfg, run, out, time.perf_counter() - t0)


def _result(cfg: MergeConfig, run: _Merger, out: Path, seconds: float) -> MergeResult:
    hist = run.model_hist.tolist() if run.model_hist is not None else None
    numel = sum(j.numel for j in run.jobs if j.merged)
    merged = sum(j.merged for j in run.jobs)
    labels = [m.label for m in cfg.models]
    params = cfg.tensor_params("")
    return MergeResult(out.resolve(), cfg.method, params, seconds, len(run.jobs), merged, hist, labels, numel)


def _refuse_output_inside_inputs(out: Path, refs: Sequence[str]) -> None:
    target = out.resolve()
    for ref in refs:
        src = Path(ref).expanduser()
        if not src.exists():
            continue
        folder = src.resolve() if src.is_dir() else src.resolve().parent
        if target == folder or folder in target.parents or target in folder.parents:
            raise MergeError(f"{out}: the output folder must not be, contain or lie inside input {ref}")


def _finish_folder(
    cfg: MergeConfig, inputs: Inputs, run: _Merger, tmp: Path, seconds: float, hashes: InputHashes | None = None
) -> None:
    from agentmerge.report import model_card, reproducibility_record

    copy_aux_files(inputs.reference.folder, tmp, MODEL_FILES)
    tokenizer = Path(cfg.tokenizer_source).expanduser() if cfg.tokenizer_source else inputs.reference.folder
    copy_aux_files(tokenizer, tmp, TOKENIZER_FILES)
    if cfg.dtype:
        set_config_dtype(tmp, dtype_from_name(cfg.dtype))
    result = _result(cfg, run, tmp, seconds)
    record = reproducibility_record(cfg, inputs, result, hashes)
    (tmp / "merge.json").write_text(json.dumps(record, indent=2) + "\n")
    (tmp / "README.md").write_text(model_card(cfg, result))
