"""``agentmerge merge --dry-run``: validate everything and print the plan, writing nothing.

The plan says which tensors are merged or copied, the output shards and their sizes, the memory
budget and chunk size, the bytes the merge will read and write, the free disk space, and an
estimated time from a short read-speed probe of the inputs (at most ``PROBE_BYTES`` read).
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agentmerge.config.schema import MergeConfig, input_refs
from agentmerge.engine.coverage import check_planned
from agentmerge.engine.inputs import Inputs
from agentmerge.engine.lines_pass import needs_pass
from agentmerge.engine.merge_plan import MergePlan, make_plan, planned_tensors
from agentmerge.engine.render import input_lines
from agentmerge.engine.sources import output_sources
from agentmerge.io.formats.checkpoint import Readable
from agentmerge.io.formats.roles import check_tokenizer_source
from agentmerge.io.guards.safety import check_output_target, check_writable_parent
from agentmerge.io.output.shards import plan_shards

PROBE_BYTES = 64 * 1024 * 1024
_PROBE_BLOCK = 4 * 1024 * 1024


@dataclass(frozen=True)
class DryRunPlan:
    """Everything a merge would do, computed without writing anything."""

    method: str
    out_dir: str
    models: int
    tensors_merged: int
    tensors_copied: int
    shards: list[tuple[str, int]]  # (file name, bytes)
    threads: int
    kernels: str  # "compiled" (numba) or "reference" (torch)
    memory_budget: int
    chunk_elements: int
    passes: int  # reads of every merged tensor: the write pass and each statistics pass (``MergePlan.reads``)
    bytes_read: int
    bytes_written: int
    disk_free: int | None
    read_speed: float | None  # bytes/s measured on the inputs
    est_seconds: float | None  # reading time only: a lower bound on the merge time
    inputs: list[str] = field(default_factory=list)  # added vocabulary rows, tokenizer source, its warnings
    whole: dict[str, Any] | None = None  # whole-tensor (SVD) jobs: ``svdcost.WholeCost``, None when none
    svd_seconds: float | None = None  # their SVDs' estimated time (with the probe), else None
    svd_vocab_seconds: float | None = None  # of that, on embeddings and LM head
    whole_lines: list[str] = field(default_factory=list)  # the memory figure and time estimate of those jobs

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def text(self) -> str:
        """The plan as a few human-readable lines."""
        lines = [
            f"plan: {self.method} of {self.models} models into {self.out_dir} (dry run: nothing written)",
            f"tensors: {self.tensors_merged} merged, {self.tensors_copied} copied from the base",
            f"output: {len(self.shards)} shard(s), {_gb(self.bytes_written)} in all",
            *[f"  {name}  {_gb(size)}" for name, size in self.shards],
            f"memory: budget {_gb(self.memory_budget)}, {self.chunk_elements} elements per chunk, "
            f"{self.threads} thread(s), {self.kernels} kernels",
            *self.whole_lines[:1],
            f"reads: {_gb(self.bytes_read)} in {self.passes} pass(es) over the merged tensors",
        ]
        if self.disk_free is not None:
            ok = "enough" if self.disk_free >= self.bytes_written else "NOT ENOUGH"
            lines.append(f"disk: {_gb(self.disk_free)} free at the output location ({ok})")
        if self.read_speed is not None and self.est_seconds is not None:
            lines.append(
                f"estimate: at least ~{self.est_seconds:.1f} s to read the inputs at the measured "
                f"{self.read_speed / 1e6:.0f} MB/s; the method's CPU time and cold caches come on top"
            )
        lines += self.whole_lines[1:]
        return "\n".join(lines + self.inputs)


def _gb(n: int) -> str:
    return f"{n / 1e9:.3f} GB" if n >= 10**8 else f"{n / 1e6:.2f} MB"


def plan_merge(
    cfg: MergeConfig, out_dir: str | Path, *, force: bool = False, probe: bool = True, force_any: bool = False
) -> DryRunPlan:
    """Open and check the inputs and plan the merge exactly as ``merge`` would, without writing."""
    out = Path(out_dir)
    check_output_target(out, input_refs(cfg), force=force, force_any=force_any)
    check_writable_parent(out)
    if cfg.tokenizer_ref:
        check_tokenizer_source(cfg.tokenizer_ref)
    inputs = Inputs.for_merge(cfg)
    try:
        n = len(inputs.models)
        sources = output_sources(cfg, inputs.reference, inputs.models, inputs.vocab)  # refusals as in a merge
        notes = input_lines(inputs.vocab.record([m.label for m in cfg.models]), sources.record())
        plan = make_plan(cfg, inputs.reference, n, cfg.threads or os.cpu_count() or 1, inputs.vocab)
        check_planned(inputs.checkpoints, (j.name for j in plan.jobs))
        shards = plan_shards(planned_tensors(plan.jobs), cfg.shard_bytes)
        sizes = {name: info.nbytes for name, info in inputs.reference.tensors.items()}
        passes = plan.reads() + (1 if needs_pass(plan) else 0)  # LiNeS's alpha from the whole merged vector
        merged = sum(sizes[j.name] for j in plan.merged)
        copied = sum(sizes[j.name] for j in plan.jobs if not j.merged)
        bytes_read = passes * merged * (n + 1) + copied
        speed = _read_speed(inputs.models[0]) if probe else None
    finally:
        inputs.close()
    written = sum(s.size for s in shards)
    est = bytes_read / speed if speed else None
    whole = whole_estimate(plan, cfg.memory_bytes, probe, 2 if needs_pass(plan) else 1)
    return DryRunPlan(
        cfg.method,
        str(out.resolve()),
        n,
        len(plan.merged),
        len(plan.jobs) - len(plan.merged),
        [(s.file_name, s.size) for s in shards],
        plan.threads,
        plan.kernels,
        cfg.memory_bytes,
        plan.chunk,
        passes,
        bytes_read,
        written,
        _disk_free(out),
        speed,
        est,
        notes,
        *whole,
    )


def whole_estimate(
    plan: MergePlan, budget: int, probe: bool, runs: int = 1
) -> tuple[dict[str, Any] | None, float | None, float | None, list[str]]:
    """The whole-tensor (SVD) jobs: their record, estimated SVD seconds (all, vocabulary), the lines to print;
    ``runs``: how often the kernels run on every tensor (2 when LiNeS's alpha pass runs them first)."""
    from agentmerge.engine.svdcost import WholeCost, svd_rate  # torch's SVD probe, only for plans that need it

    cost = WholeCost.of(plan, runs)
    if cost is None:
        return None, None, None, []
    lines = [cost.memory_line(budget, plan.threads)]
    if not probe:
        return asdict(cost), None, None, lines
    rate = svd_rate()
    total, vocab = cost.seconds(rate, plan.threads)
    return asdict(cost), total, vocab, [*lines, cost.time_line(rate, plan.threads)]


def _read_speed(ckpt: Readable) -> float | None:
    """Bytes per second reading (up to ``PROBE_BYTES`` of) the checkpoint's weight files."""
    done, t0 = 0, time.perf_counter()
    for f in ckpt.weight_files:
        fd, pos = os.open(f, os.O_RDONLY), 0
        try:
            while done < PROBE_BYTES:
                got = len(os.pread(fd, _PROBE_BLOCK, pos))
                if not got:
                    break
                done, pos = done + got, pos + got
        finally:
            os.close(fd)
        if done >= PROBE_BYTES:
            break
    elapsed = time.perf_counter() - t0
    return done / elapsed if done and elapsed > 0 else None


def _disk_free(out: Path) -> int | None:
    """Free bytes on the file system the output will be written to (its nearest existing ancestor)."""
    p = out.resolve()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None
