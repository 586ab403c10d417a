"""The driver: open inputs -> plan -> statistics pass -> write pass (chunks through the kernel) -> finish the folder.

The plan (``merge_plan.py``) is frozen before any weight is read. The statistics pass (``passes.py``) runs the
passes the plan lists (the method's own, declared in its registry entry) and collects what whole tensors
and the whole model must tell a kernel before it sees one chunk. The write pass then runs one job per chunk: it reads
the chunk's range from the base and each model (``pread``), merges it with the compiled kernel (or the
reference kernel, which also names any broken input), casts once to the output dtype and writes the
bytes at their planned offset. Jobs are independent, so they run on a thread pool in any order, and
the output is bit-identical whatever the chunk size, shard size or thread count. Whole tensors (SVD
methods, ``hooks.WholeTensor``) are one job each, through the reference kernel and the post-steps (SVC,
``TensorJob.steps``); those larger than a thread's share of the budget run after the pool, one at a time,
on every thread (their LAPACK sums, unlike everything else, round with the thread count).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from agentmerge.config.schema import MergeConfig, input_refs
from agentmerge.engine.coverage import check_planned, check_written
from agentmerge.engine.inputs import Inputs, Scratch
from agentmerge.engine.lines_pass import depth_scaling
from agentmerge.engine.merge_plan import MergePlan, TensorJob, make_plan, planned_tensors
from agentmerge.engine.parallel import run_parallel, torch_threads
from agentmerge.engine.passes import Collected, model_stats, statistics_pass
from agentmerge.engine.provenance import MergeResult, record_text, reproducibility_record
from agentmerge.engine.quantnote import measure, note
from agentmerge.engine.render import model_card
from agentmerge.engine.sources import OutputSources, output_sources
from agentmerge.io.cache.digests import InputDigests, hash_mode
from agentmerge.io.formats.checkpoint import Checkpoint
from agentmerge.io.formats.gguf_read import GgufCheckpoint
from agentmerge.io.formats.roles import check_tokenizer_source
from agentmerge.io.formats.vocab import new_rows
from agentmerge.io.guards.finite import check_output_chunk
from agentmerge.io.guards.safety import check_output_target
from agentmerge.io.output.atomic import atomic_output_dir
from agentmerge.io.output.gguf_write import check_out_type, export_gguf
from agentmerge.io.output.shards import plan_shards
from agentmerge.io.output.writer import ShardWriter, finish_model_files
from agentmerge.methods.deltas import histogram_from_patterns, overlap_histogram, sum_agents
from agentmerge.methods.masks import levels_record, tensor_mask
from agentmerge.methods.poststeps import STEPS
from agentmerge.methods.spec import CompiledResult

__all__ = ["MergeResult", "count_overlaps", "merge"]


def merge(
    cfg: MergeConfig,
    out_dir: str | Path,
    *,
    force: bool = False,
    quiet: bool = False,
    force_any: bool = False,
    hashing: str | None = None,
    gguf: str | None = None,
) -> MergeResult:
    """Merge ``cfg.models`` into ``out_dir`` (written atomically). Returns what was done.

    ``gguf`` (a type of ``gguf_write.OUT_TYPES``): the output folder also holds ``model-TYPE.gguf``, written
    from the merged folder before it is published.

    ``force`` replaces an earlier agentmerge output at ``out_dir``; ``force_any`` any other folder (see ``safety``).
    ``hashing`` (``fast``, ``sha256``, ``none``; default ``$AGENTMERGE_HASH``, else ``fast``) is how merge.json
    identifies the input files (``digests``).
    """
    t0 = time.perf_counter()
    mode = hash_mode(hashing)
    out = Path(out_dir)
    check_output_target(out, input_refs(cfg), force=force, force_any=force_any)
    if cfg.tokenizer_ref:
        check_tokenizer_source(cfg.tokenizer_ref)
    inputs = Inputs.for_merge(cfg)
    try:
        sources = output_sources(cfg, inputs.reference, inputs.models, inputs.vocab)
        plan = make_plan(cfg, inputs.reference, len(inputs.models), cfg.threads or os.cpu_count() or 1, inputs.vocab)
        check_planned(inputs.checkpoints, (j.name for j in plan.jobs))
        inputs.check_extras([j.name for j in plan.merged])
        hashes = InputDigests.start([f for c in inputs.checkpoints for f in c.weight_files], mode)  # for merge.json
        try:
            with torch_threads(1), atomic_output_dir(out, force=force or force_any) as tmp:
                collected = statistics_pass(plan, inputs, quiet)
                write_pass(plan, inputs, collected, tmp, quiet)
                check_written(tmp, planned_tensors(plan.jobs))
                result = _result(cfg, plan, collected, tmp, time.perf_counter() - t0)
                result = replace(result, vocab=inputs.vocab.record(result.model_labels), sources=sources.record())
                quantized = measure(inputs.reference, inputs.models, result.model_labels)
                result = replace(result, notes=[note(quantized)] if quantized else [])
                _finish_folder(cfg, inputs, result, hashes, sources)
                if gguf is not None:
                    merged_gguf(tmp, gguf, inputs, sources)
        except BaseException:
            hashes.cancel()
            raise
    finally:
        inputs.close()
    return replace(result, out_dir=out.resolve(), seconds=time.perf_counter() - t0)


def count_overlaps(cfg: MergeConfig, *, quiet: bool = True) -> None:
    """Only the cached passes of ``cfg``'s statistics pass: its adaptive mask thresholds (any method) and overlap
    histograms (methods with an ``OverlapCounts`` pass) land in the cache for the merges to come.

    A sweep runs it once per input set before its RAM+ and adaptive-rule trials, so none of them reads its
    inputs twice.
    """
    inputs = Inputs.for_merge(cfg)
    try:
        plan = make_plan(cfg, inputs.reference, len(inputs.models), cfg.threads or os.cpu_count() or 1, inputs.vocab)
        with torch_threads(1):
            statistics_pass(plan, inputs, quiet, cached_only=True)
    finally:
        inputs.close()


# --------------------------------------------------------------------------- the write pass


def write_pass(plan: MergePlan, inputs: Inputs, collected: Collected, folder: Path, quiet: bool) -> None:
    """Merge every chunk and write it at its planned offset in ``folder``'s shards."""
    tensors = planned_tensors(plan.jobs)
    writer = ShardWriter(folder, plan_shards(tensors, plan.shard_bytes), tensors)
    chunks = ChunkWriter(plan, inputs, collected, writer)
    collected.depth = depth_scaling(plan, chunks.deltas, quiet)  # LiNeS's alpha: a pass of its own when needed
    alone = [j for j in plan.jobs if plan.alone(j)]
    pooled = sorted((j for j in plan.jobs if not plan.alone(j)), key=lambda j: -j.numel if j.whole else 0)
    tasks = [chunks.task(job, s, e) for job in pooled for s, e in job.chunks]  # whole tensors (SVDs) first
    tasks += [chunks.added_task(job, s, e) for job, s, e in plan.added_tasks()]
    label = f"merge {plan.method.name} ({plan.kernels} kernels)"
    try:
        with tqdm(total=len(tasks) + len(alone), desc=label, unit="chunk", disable=quiet) as bar:
            run_parallel(tasks, plan.threads, bar)
            merge_alone(chunks, alone, plan.threads, bar)
    finally:
        writer.close()
    if not collected.counted:  # the histograms were counted by the write pass itself
        collected.model_hist = collected.total(len(inputs.models))


def merge_alone(chunks: ChunkWriter, jobs: list[TensorJob], threads: int, bar: tqdm) -> None:
    """Whole tensors too large for a pool thread's share of the budget: one at a time, torch on every thread."""
    with torch_threads(threads):
        for job in jobs:
            bar.set_postfix_str(f"{job.name} {list(job.shape)} on {threads} threads", refresh=True)
            chunks.write(job, 0, job.numel)
            bar.update(1)
        bar.set_postfix_str("")


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
        elif self.plan.reference(job) or not self._compiled(job, start, stop):
            self._reference(job, start, stop)

    def _compiled(self, job: TensorJob, start: int, stop: int) -> bool:
        """Merge with the compiled kernel; False when an input is not finite (the reference path then names it)."""
        result, ref, _ = self._compiled_merge(job, start, stop, self.scratch.get("merged", stop - start, torch.float32))
        if result is None or result.merged is None:
            return False
        if not self.collected.counted:
            self.collected.add_hist(job.name, histogram_from_patterns(result.patterns))
        merged = self._depth(job, ref, result.merged)
        self._put(job, start, self.scratch.get("out", stop - start, job.out_dtype).copy_(merged))
        return True

    def _compiled_merge(
        self, job: TensorJob, start: int, stop: int, out: torch.Tensor
    ) -> tuple[CompiledResult | None, torch.Tensor, torch.Tensor]:
        """``(result or None when an input is not finite, ref, models)``, both as stored (this thread's buffers)."""
        compiled = self.plan.method.compiled
        assert compiled is not None
        ref, models = self.inputs.read_stored(job.name, start, stop, self.scratch)
        spec = self.plan.spec(job, start, stop, self.collected.stats(job.name))
        result = compiled.kernel(ref, models, spec, out)
        return (result if result.finite else None), ref, models

    def deltas(self, job: TensorJob, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(sum_i tau_i, merged - theta_0)``, ``[E]`` float32, of a chunk by the plan's kernels; nothing written.

        On the compiled path the chunk was sized for inputs as stored (bf16), so the sum is taken a model at a
        time (agents in ``sum_agents``'s order: the same bits), never as N float32 copies, and every float32
        array is one of this thread's reused buffers (valid until its next chunk): fresh chunk-sized arrays on
        every chunk of every thread fragmented glibc's arenas to 2-3.5 GB on a 0.5B model at 1 GB.
        """
        if not self.plan.reference(job):
            e, scratch = stop - start, self.scratch
            result, ref, models = self._compiled_merge(job, start, stop, scratch.get("merged", e, torch.float32))
            if result is not None and result.merged is not None:
                r = scratch.get("ref32", e, torch.float32).copy_(ref)
                total, tau = scratch.get("total", e, torch.float32).zero_(), scratch.get("tau", e, torch.float32)
                for model in models:
                    total += torch.sub(model, r, out=tau)  # model.float() - r: bf16 -> float32 is exact
                return total, result.merged.sub_(r)
        ref, tau, delta = self._merged(job, start, stop)
        return sum_agents(tau), (ref + delta) - ref

    def _merged(
        self, job: TensorJob, start: int, stop: int, warn: Callable[[str], None] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(ref, tau, merged delta)`` of a chunk by the reference kernel, then the tensor's post-steps in order
        (``warn``: where the kernel's warnings go; the write pass's, not LiNeS's alpha pass's)."""
        ref, models = self.inputs.read(job.name, start, stop)
        tau = models.sub_(ref)  # = task_vectors(ref, models), in place: models is ours
        spec = self.plan.spec(job, start, stop, self.collected.stats(job.name), warn)
        chunk = spec.with_values(ref, tau, self._extras(job, start, stop))
        delta = self.plan.method.kernel(chunk)
        for step in job.steps:  # post-steps (SVC) rewrite the merged delta
            delta = STEPS[step].apply(chunk, delta)
        return ref, tau, delta

    def _reference(self, job: TensorJob, start: int, stop: int) -> None:
        ref, tau, delta = self._merged(job, start, stop, self.collected.warner(job.name))
        if not self.collected.counted:
            self.collected.add_hist(job.name, self._histogram(job, tau, ref))
        self._put(job, start, self._depth(job, ref, ref + delta).to(job.out_dtype))

    def _histogram(self, job: TensorJob, tau: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        """``[N, N]`` overlap histogram of a chunk, its mask made a chunk's worth at a time (a whole tensor
        would otherwise hold N float32 copies of |tau| at once)."""
        levels, step = self.collected.levels.get(job.name), self.plan.chunk
        hist = torch.zeros(tau.shape[0], tau.shape[0], dtype=torch.int64)
        for s in range(0, tau.shape[1], step):
            hist += overlap_histogram(tensor_mask(tau[:, s : s + step], ref[s : s + step], job.rule, levels))
        return hist

    def _depth(self, job: TensorJob, ref: torch.Tensor, merged: torch.Tensor) -> torch.Tensor:
        """LiNeS: ``theta_0 + lambda(l) (merged - theta_0)`` in float32 (the same bits from either kernel path)."""
        scale = self.collected.depth.scale(job) if self.collected.depth is not None else None
        if scale is None:
            return merged
        r = ref.float()
        return (merged - r).mul_(scale).add_(r)

    def _put(self, job: TensorJob, start: int, values: torch.Tensor) -> None:
        """Write a chunk, unless it holds NaN or Inf (an overflow of the output dtype: the merge fails, naming it)."""
        check_output_chunk(job.name, start, values)
        self.writer.write(job.name, start, values)

    def _extras(self, job: TensorJob, start: int, stop: int) -> dict[str, torch.Tensor]:
        return self.inputs.read_extras(job.name, start, stop) if self.inputs.extras else {}


# --------------------------------------------------------------------------- the folder


def _result(cfg: MergeConfig, plan: MergePlan, collected: Collected, out: Path, seconds: float) -> MergeResult:
    return MergeResult(
        out_dir=out,
        method=cfg.method,
        params=dict(cfg.shared_params),  # params alone: an override, even of pattern "*", is a tensor group's
        seconds=seconds,
        tensors=len(plan.jobs),
        merged_tensors=len(plan.merged),
        model_hist=collected.model_hist.tolist() if collected.model_hist is not None else None,
        model_labels=[m.label for m in cfg.models],
        numel=sum(j.numel for j in plan.merged),
        scales=_scales(plan, collected, [m.label for m in cfg.models]),
        thresholds=levels_record(collected.levels, plan.rules(), [m.label for m in cfg.models]),
        lines=collected.depth.record() if collected.depth is not None else None,
        warnings=collected.warning_lines(),
    )


def _scales(plan: MergePlan, collected: Collected, labels: list[str]) -> list[dict[str, Any]]:
    """The method's per-agent scales, as merge.json and the summary report them (its ``Scales`` hook)."""
    hook = plan.method.scales
    return hook.rows(model_stats(plan, collected), labels) if hook is not None and plan.merged else []


def merged_gguf(folder: Path, qtype: str, inputs: Inputs, sources: OutputSources) -> Path:
    """``folder/model-TYPE.gguf`` from the merged ``folder``; the tokenizer fields are copied from the GGUF the
    tokenizer came from, when it came from one."""
    origin = next(
        (c.path for c in inputs.checkpoints if isinstance(c, GgufCheckpoint) and c.folder == sources.source.folder),
        None,
    )
    out = folder / f"model-{check_out_type(qtype, '--gguf')}.gguf"
    with Checkpoint(folder) as merged:
        export_gguf(merged, out, qtype, tokenizer_gguf=origin)
    return out


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
