"""The driver: open inputs -> plan -> statistics pass -> write pass (chunks through the kernel) -> finish the folder.

The plan (``plan.py``) is frozen before any weight is read. The statistics pass collects what whole
tensors must tell a kernel before it sees one chunk: the overlap histograms (RAM+) and a compiled
method's exact thresholds (``Compiled.rounds``). The write pass then runs one job per chunk: it reads
the chunk's range from the base and each model (``pread``), merges it with the compiled kernel (or the
reference kernel, which also names any broken input), casts once to the output dtype and writes the
bytes at their planned offset. Jobs are independent, so they run on a thread pool in any order, and
the output is bit-identical whatever the chunk size, shard size or thread count.
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from agentmerge.config.schema import MergeConfig, input_refs
from agentmerge.engine.plan import MergePlan, TensorJob, make_plan, planned_tensors
from agentmerge.engine.provenance import MergeResult, record_text, reproducibility_record
from agentmerge.engine.report import model_card
from agentmerge.engine.sources import OutputSources, output_sources
from agentmerge.engine.stream import (
    Inputs,
    Scratch,
    mask_levels,
    overlap_stats,
    run_parallel,
    run_rounds,
    torch_threads,
)
from agentmerge.io.checkpoint import ShardWriter, atomic_output_dir, finish_model_files, plan_shards
from agentmerge.io.digests import InputDigests, hash_mode
from agentmerge.io.safety import check_output_target
from agentmerge.io.validate import check_output_chunk, check_tokenizer_source
from agentmerge.io.vocab import new_rows
from agentmerge.methods.deltas import histogram_from_patterns, overlap_histogram, rho_from_histogram
from agentmerge.methods.masks import Levels, levels_record, tensor_mask
from agentmerge.methods.ram import ram_lambda
from agentmerge.methods.spec import Params, TensorSource, TensorStats

__all__ = ["MergeResult", "count_overlaps", "merge"]


def merge(
    cfg: MergeConfig,
    out_dir: str | Path,
    *,
    force: bool = False,
    quiet: bool = False,
    force_any: bool = False,
    hashing: str | None = None,
) -> MergeResult:
    """Merge ``cfg.models`` into ``out_dir`` (written atomically). Returns what was done.

    ``force`` replaces an earlier agentmerge output at ``out_dir``; ``force_any`` any other folder (see ``safety``).
    ``hashing`` (``fast``, ``sha256``, ``none``; default ``$AGENTMERGE_HASH``, else ``fast``) is how merge.json
    identifies the input files (``digests``).
    """
    t0 = time.perf_counter()
    mode = hash_mode(hashing)
    out = Path(out_dir)
    check_output_target(out, input_refs(cfg), force=force, force_any=force_any)
    if cfg.tokenizer_source:
        check_tokenizer_source(cfg.tokenizer_source)
    inputs = Inputs.for_merge(cfg)
    try:
        sources = output_sources(cfg, inputs.reference, inputs.models, inputs.vocab)
        plan = make_plan(cfg, inputs.reference, len(inputs.models), cfg.threads or os.cpu_count() or 1, inputs.vocab)
        inputs.check_extras([j.name for j in plan.merged])
        hashes = InputDigests.start([f for c in inputs.checkpoints for f in c.weight_files], mode)  # for merge.json
        try:
            with torch_threads(1), atomic_output_dir(out, force=force or force_any) as tmp:
                collected = statistics_pass(plan, inputs, quiet)
                write_pass(plan, inputs, collected, tmp, quiet)
                result = _result(cfg, plan, collected, tmp, time.perf_counter() - t0)
                result = replace(result, vocab=inputs.vocab.record(result.model_labels), sources=sources.record())
                _finish_folder(cfg, inputs, result, hashes, sources)
        except BaseException:
            hashes.cancel()
            raise
    finally:
        inputs.close()
    return replace(result, out_dir=out.resolve(), seconds=time.perf_counter() - t0)


def count_overlaps(cfg: MergeConfig, *, quiet: bool = True) -> None:
    """Only the statistics pass of ``cfg``: its adaptive mask thresholds (any method) and overlap histograms
    (methods that need them) land in the cache for the merges to come.

    A sweep runs it once per input set before its RAM+ and adaptive-rule trials, so none of them reads its
    inputs twice.
    """
    inputs = Inputs.for_merge(cfg)
    try:
        plan = make_plan(cfg, inputs.reference, len(inputs.models), cfg.threads or os.cpu_count() or 1, inputs.vocab)
        with torch_threads(1):
            levels = mask_levels(inputs, plan.rules(), plan.threads, plan.chunk, quiet)
            if plan.method.needs_model_stats:
                overlap_stats(inputs, plan.rules(), plan.threads, plan.chunk, quiet, levels)
    finally:
        inputs.close()


# --------------------------------------------------------------------------- what the passes collect


@dataclass
class Collected:
    """Per tensor: overlap histograms and whole-tensor statistics; filled by the passes, from any thread."""

    hists: dict[str, torch.Tensor] = field(default_factory=dict)  # [N, N] per merged tensor
    prepared: dict[str, Any] = field(default_factory=dict)  # whole-tensor statistics (prepare / rounds)
    model_hist: torch.Tensor | None = None  # [N, N] summed over the tensors, once the statistics pass is done
    groups: dict[str, str] = field(default_factory=dict)  # tensor -> its RAM+ rescaling group (grouped scopes)
    group_hists: dict[str, torch.Tensor] = field(default_factory=dict)  # [N, N] summed over each group
    model_stat: Any = None  # the method's whole-model statistics (``Method.model_pass``)
    levels: dict[str, Levels] = field(default_factory=dict)  # adaptive mask rules: per-agent thresholds per tensor
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _preparing: dict[str, threading.Lock] = field(default_factory=dict)

    def add_hist(self, name: str, hist: torch.Tensor) -> None:
        with self._lock:
            self.hists[name] = self.hists[name] + hist if name in self.hists else hist

    def total(self, n: int) -> torch.Tensor:
        """``[N, N]``: the histograms summed over every tensor counted so far."""
        return sum(self.hists.values(), torch.zeros(n, n, dtype=torch.int64))

    def stats(self, name: str, prepared: Any = None) -> TensorStats:
        group = self.group_hists.get(self.groups[name]) if name in self.groups else None
        return TensorStats(
            self.hists.get(name), self.model_hist, prepared, group, self.model_stat, self.levels.get(name)
        )

    def group_by(self, groups: dict[str, str]) -> None:
        """Sum the tensors' histograms (each under its tensor's mask rule) over their groups, in plan order."""
        self.groups = groups
        for name, group in groups.items():
            hist = self.hists[name]
            self.group_hists[group] = self.group_hists[group] + hist if group in self.group_hists else hist.clone()

    def prepared_once(self, source: TensorSource, prepare: Any) -> Any:
        """``prepare(source)`` computed once per tensor, whichever chunk job asks first (the others wait)."""
        with self._lock:
            lock = self._preparing.setdefault(source.name, threading.Lock())
        with lock:
            if source.name not in self.prepared:
                self.prepared[source.name] = prepare(source)
            return self.prepared[source.name]


def statistics_pass(plan: MergePlan, inputs: Inputs, quiet: bool) -> Collected:
    """What must be known before merging: adaptive mask thresholds, overlap histograms (RAM+), compiled thresholds."""
    collected = Collected()
    collected.levels = mask_levels(inputs, plan.rules(), plan.threads, plan.chunk, quiet)
    if plan.method.needs_model_stats:
        collected.hists = overlap_stats(inputs, plan.rules(), plan.threads, plan.chunk, quiet, collected.levels)
        collected.model_hist = collected.total(len(inputs.models))
        collected.group_by(plan.groups())
    if plan.method.model_pass is not None:
        collected.model_stat = plan.method.model_pass(inputs, plan, quiet, collected.levels)
    rounds = plan.method.compiled.rounds if plan.compiled and plan.method.compiled else None
    if rounds is not None:
        jobs = [j for j in plan.merged if j.chunked and rounds.wanted(plan.spec(j, 0, j.numel))]
        collected.prepared = run_rounds(inputs, plan, jobs, rounds, quiet)
    return collected


# --------------------------------------------------------------------------- the write pass


def write_pass(plan: MergePlan, inputs: Inputs, collected: Collected, folder: Path, quiet: bool) -> None:
    """Merge every chunk and write it at its planned offset in ``folder``'s shards."""
    tensors = planned_tensors(plan.jobs)
    writer = ShardWriter(folder, plan_shards(tensors, plan.shard_bytes), tensors)
    chunks = ChunkWriter(plan, inputs, collected, writer)
    tasks = [chunks.task(job, s, e) for job in plan.jobs for s, e in job.chunks]
    tasks += [chunks.added_task(job, s, e) for job, s, e in plan.added_tasks()]
    label = f"merge {plan.method.name} ({plan.kernels} kernels)"
    try:
        with tqdm(total=len(tasks), desc=label, unit="chunk", disable=quiet) as bar:
            run_parallel(tasks, plan.threads, bar)
    finally:
        writer.close()
    if not plan.method.needs_model_stats:
        collected.model_hist = collected.total(len(inputs.models))


@dataclass(frozen=True)
class ChunkWriter:
    """Produces and writes one chunk: copied, merged by the compiled kernel, or by the reference kernel."""

    plan: MergePlan
    inputs: Inputs
    collected: Collected
    writer: ShardWriter
    scratch: Scratch = field(default_factory=Scratch)  # each worker's chunk buffers, freed with the pass

    def task(self, job: TensorJob, start: int, stop: int) -> Any:
        return lambda: self.write(job, start, stop)

    def added_task(self, job: TensorJob, start: int, stop: int) -> Any:
        return lambda: self.write_added(job, start, stop)

    def write_added(self, job: TensorJob, start: int, stop: int) -> None:
        """Added vocabulary rows: the adding agent's values, or the weighted mean of several (``vocab.new_rows``)."""
        assert job.resized is not None
        adders = list(job.resized.adders)
        values = self.inputs.read_added(job.name, adders, start, stop)
        self._put(job, start, new_rows(values, self.plan.weights[adders]).to(job.out_dtype))

    def write(self, job: TensorJob, start: int, stop: int) -> None:
        if not job.merged:
            self._put(job, start, self.inputs.reference.read(job.name, start, stop).to(job.out_dtype))
        elif not (self.plan.compiled and self._compiled(job, start, stop)):
            self._reference(job, start, stop)

    def _compiled(self, job: TensorJob, start: int, stop: int) -> bool:
        """Merge with the compiled kernel; False when an input is not finite (the reference path then names it)."""
        compiled = self.plan.method.compiled
        assert compiled is not None
        ref, models = self.inputs.read_stored(job.name, start, stop, self.scratch)
        spec = self.plan.spec(job, start, stop, self.collected.stats(job.name, self.collected.prepared.get(job.name)))
        result = compiled.kernel(ref, models, spec, self.scratch.get("merged", stop - start, torch.float32))
        if not result.finite or result.merged is None:
            return False
        if not self.plan.method.needs_model_stats:
            self.collected.add_hist(job.name, histogram_from_patterns(result.patterns))
        self._put(job, start, self.scratch.get("out", stop - start, job.out_dtype).copy_(result.merged))
        return True

    def _reference(self, job: TensorJob, start: int, stop: int) -> None:
        ref, models = self.inputs.read(job.name, start, stop)
        tau = models.sub_(ref)  # = task_vectors(ref, models), in place: models is ours
        spec = self.plan.spec(job, start, stop, self.collected.stats(job.name, self._prepared(job)))
        delta = self.plan.method.kernel(spec.with_values(ref, tau, self._extras(job, start, stop)))
        if not self.plan.method.needs_model_stats:
            mask = tensor_mask(tau, ref, job.rule, self.collected.levels.get(job.name))
            self.collected.add_hist(job.name, overlap_histogram(mask))
        self._put(job, start, (ref + delta).to(job.out_dtype))

    def _put(self, job: TensorJob, start: int, values: torch.Tensor) -> None:
        """Write a chunk, unless it holds NaN or Inf (an overflow of the output dtype: the merge fails, naming it)."""
        check_output_chunk(job.name, start, values)
        self.writer.write(job.name, start, values)

    def _extras(self, job: TensorJob, start: int, stop: int) -> dict[str, torch.Tensor]:
        return self.inputs.read_extras(job.name, start, stop) if self.inputs.extras else {}

    def _prepared(self, job: TensorJob) -> Any:
        """The reference kernel's whole-tensor statistics of a multi-chunk tensor (None for a one-chunk tensor)."""
        prepare = self.plan.method.prepare
        if prepare is None or not job.chunked:
            return None
        source = TensorSource(job.name, job.shape, len(job.chunks), job.params, job.model_params, self._chunks(job))
        return self.collected.prepared_once(source, prepare)

    def _chunks(self, job: TensorJob) -> Any:
        def chunks() -> Any:
            for s, e in job.chunks:
                ref, models = self.inputs.read(job.name, s, e)
                spec = self.plan.spec(job, s, e, self.collected.stats(job.name))
                yield spec.with_values(ref, models.sub_(ref), self._extras(job, s, e))

        return chunks


# --------------------------------------------------------------------------- the folder


def _result(cfg: MergeConfig, plan: MergePlan, collected: Collected, out: Path, seconds: float) -> MergeResult:
    return MergeResult(
        out_dir=out,
        method=cfg.method,
        params=cfg.tensor_params(""),
        seconds=seconds,
        tensors=len(plan.jobs),
        merged_tensors=len(plan.merged),
        model_hist=collected.model_hist.tolist() if collected.model_hist is not None else None,
        model_labels=[m.label for m in cfg.models],
        numel=sum(j.numel for j in plan.merged),
        scales=group_scales(plan, collected, [m.label for m in cfg.models]),
        thresholds=levels_record(collected.levels, plan.rules(), [m.label for m in cfg.models]),
    )


def group_scales(plan: MergePlan, collected: Collected, labels: list[str]) -> list[dict[str, Any]]:
    """rho_i and lambda_i per rescaling group, as merge.json and the summary report them.

    RAM+ with a grouped scope: one row per group (lambda with the parameters of the group's first tensor);
    RAM+ with scope global: one row ``model``; ram_fisher with r > 0: one row from the Fisher masses.
    """
    if collected.group_hists:
        params: dict[str, Params] = {}
        for job in plan.merged:
            if job.name in collected.groups:
                params.setdefault(collected.groups[job.name], job.params)
        hists = collected.group_hists.items()
        return [_scale_row(g, rho_from_histogram(h), params[g], labels) for g, h in hists]
    if isinstance(collected.model_stat, torch.Tensor) and plan.merged:
        rho = [s / u if u else math.inf for u, s in collected.model_stat.tolist()]
        return [_scale_row("model (Fisher mass)", rho, plan.merged[0].params, labels)]
    if plan.method.name == "ram_plus" and collected.model_hist is not None and plan.merged:
        first = plan.merged[0].params
        if first["scope"] == "global":
            return [_scale_row("model", rho_from_histogram(collected.model_hist), first, labels)]
    return []


def _scale_row(group: str, rho: list[float], params: Params, labels: list[str]) -> dict[str, Any]:
    agents = [
        {"agent": name, "rho": x if math.isfinite(x) else "inf", "lambda": ram_lambda(x, params)}
        for name, x in zip(labels, rho, strict=True)
    ]
    return {"group": group, "agents": agents}


def _finish_folder(
    cfg: MergeConfig, inputs: Inputs, result: MergeResult, hashes: InputDigests, sources: OutputSources
) -> None:
    """Config, tokenizer, generation config, merge.json and the model card next to the shards."""
    gen = sources.generation_config
    finish_model_files(
        result.out_dir,
        inputs.reference.folder,
        sources.source.folder,
        cfg.dtype,
        generation=gen.folder if gen else None,
        config_values=sources.config_ids,
        vocab_size=inputs.vocab.out_rows,
    )
    record = reproducibility_record(cfg, inputs.checkpoints, result, hashes)
    (result.out_dir / "merge.json").write_text(record_text(record))
    (result.out_dir / "README.md").write_text(model_card(cfg, result))
