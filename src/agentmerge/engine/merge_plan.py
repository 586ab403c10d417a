"""The merge plan: which tensors are merged or copied, their chunks and parameters; pure, nothing is read.

Every tensor is treated as a flat array and cut into element ranges ("chunks") small enough that
``threads`` chunks in flight fit the memory budget; a tensor the method or a post-step needs whole (an SVD:
``Needs.whole``, ``PostStep.whole``) is one chunk, run after the pool when it is larger than a thread's share.
The plan is frozen before any weight is read; the driver (``merge.py``) and the dry run (``merge_dryrun.py``) both
work from it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from agentmerge.config.schema import MergeConfig
from agentmerge.errors import MergeError
from agentmerge.io.formats.checkpoint import Readable
from agentmerge.io.formats.tensorfile import dtype_from_name
from agentmerge.io.formats.vocab import ResizedTensor, VocabPlan
from agentmerge.io.output.shards import PlannedTensor
from agentmerge.methods import Method, MethodParams
from agentmerge.methods.deltas import RNG_BLOCK
from agentmerge.methods.fused.jit import available
from agentmerge.methods.hooks import MaskLevels, Pass
from agentmerge.methods.lines import check_layers, layer_count
from agentmerge.methods.masks import grid_of
from agentmerge.methods.poststeps import active_steps
from agentmerge.methods.spec import ChunkSpec, MaskRule, Params, TensorStats, mask_rule, update_threshold

MAX_CHUNK = RNG_BLOCK  # elements per chunk at most (see chunk_elements)


@dataclass(frozen=True)
class TensorJob:
    """One output tensor: how it is produced, its element ranges and (when merged) its parameters.

    ``shape``, ``numel`` and ``chunks`` are the base's tensor (for a vocabulary tensor with added rows, its
    first ``V_base`` rows); ``resized`` then names the rows past them, which come from the adding agents.
    """

    name: str
    out_dtype: torch.dtype
    shape: tuple[int, ...]
    numel: int
    merged: bool  # False: copied from the reference unchanged
    chunks: tuple[tuple[int, int], ...]
    params: Params = field(default_factory=dict)  # the method's record for this tensor (after overrides)
    model_params: tuple[Params, ...] = ()  # per model, when any model sets params
    resized: ResizedTensor | None = None  # the vocabulary rows the agents added (vocab.py), else None
    rule: MaskRule = field(default_factory=MaskRule)  # what its masks and overlap statistics count as an update
    whole: bool = False  # one chunk: the method or a post-step decomposes the whole matrix (``hooks.WholeTensor``)
    steps: tuple[str, ...] = ()  # the post-steps that run on it after the kernel (``poststeps.POST_STEPS``)
    copies: float = 0.0  # whole: float32 copies of the tensor its kernel and steps hold beyond the N + 1 inputs
    svds: tuple[tuple[int, int], ...] = ()  # whole: the (rows, cols) of every SVD its kernel and steps run
    weights: tuple[float, ...] | None = None  # this tensor's model weights (an override's); None: the plan's

    @property
    def out_shape(self) -> tuple[int, ...]:
        """The written tensor's shape: the base's, with the added vocabulary rows."""
        return self.resized.out_shape if self.resized is not None else self.shape

    def added_chunks(self, chunk: int) -> tuple[tuple[int, int], ...]:
        """Element ranges of the added rows (whole rows, about ``chunk`` elements each); () when none."""
        return self.resized.extra_chunks(chunk) if self.resized is not None else ()

    @property
    def eps(self) -> float:
        """The tensor's update threshold: what its masks and overlap statistics count as an update."""
        return update_threshold(self.params)

    @property
    def chunked(self) -> bool:
        """Whether the tensor spans several chunks (its whole-tensor statistics then need a pass of their own)."""
        return len(self.chunks) > 1


@dataclass(frozen=True)
class MergePlan:
    """Everything a merge will do, decided before any weight is read."""

    method: Method
    jobs: tuple[TensorJob, ...]
    chunk: int  # elements per chunk
    threads: int
    weights: torch.Tensor  # [N] float32 model weights
    seed: int
    shard_bytes: int
    compiled: bool  # the method's compiled kernel runs (numba present, at most 16 agents, plain mask rules)
    has_base: bool = True  # False: no base model, the first model is the reference
    layers: int = 0  # decoder layers of the reference (``.layers.N.`` in names): LiNeS depth scaling's L
    memory: int = 1 << 30  # the memory budget (``max_memory``) in bytes

    def whole_bytes(self, job: TensorJob) -> int:
        """Bytes a whole-tensor job holds at once: N + 1 float32 inputs, the kernel's copies, the cast output."""
        return int(job.numel * (4 * (len(self.weights) + 1 + job.copies) + job.out_dtype.itemsize))

    def alone(self, job: TensorJob) -> bool:
        """A whole tensor too large for one thread's share of the budget: merged after the pool, with all threads."""
        return job.whole and self.whole_bytes(job) * self.threads > self.memory

    @property
    def whole_jobs(self) -> list[TensorJob]:
        return [j for j in self.jobs if j.whole]

    def reference(self, job: TensorJob) -> bool:
        """Whether the reference kernel merges this tensor: always for a whole tensor or one with post-steps."""
        return not self.compiled or job.whole or bool(job.steps)

    @property
    def merged(self) -> list[TensorJob]:
        return [j for j in self.jobs if j.merged]

    def added_tasks(self) -> list[tuple[TensorJob, int, int]]:
        """``(job, start, stop)`` of every chunk of added vocabulary rows."""
        return [(j, s, e) for j in self.jobs for s, e in j.added_chunks(self.chunk)]

    @property
    def kernels(self) -> str:
        """Which kernels merge: ``compiled`` (numba) or ``reference`` (torch)."""
        return "compiled" if self.compiled else "reference"

    def rules(self) -> dict[str, MaskRule]:
        """Each merged tensor's mask rule (the overlap statistics pass counts with these)."""
        return {j.name: j.rule for j in self.merged}

    @property
    def passes(self) -> tuple[Pass, ...]:
        """The statistics passes before the write pass, in order: the thresholds of adaptive mask rules (when a
        tensor has one), then the method's own (``Method.passes``)."""
        levels: tuple[Pass, ...] = (MaskLevels(),) if any(j.rule.adaptive for j in self.merged) else ()
        return levels + self.method.passes

    def reads(self) -> int:
        """How many times the merge reads the merged tensors: the write pass and each statistics pass."""
        params = [j.params for j in self.merged]
        return 1 + sum(p.reads(params) for p in self.passes)

    def spec(
        self,
        job: TensorJob,
        start: int,
        stop: int,
        stats: TensorStats | None = None,
        warn: Callable[[str], None] | None = None,
    ) -> ChunkSpec:
        """The ``ChunkSpec`` of elements ``start:stop`` of ``job``'s tensor (``warn``: where its kernel reports)."""
        return ChunkSpec(
            name=job.name,
            start=start,
            stop=stop,
            params=job.params,
            weights=self.weights if job.weights is None else torch.tensor(job.weights, dtype=torch.float32),
            stats=stats or TensorStats(),
            seed=self.seed,
            shape=job.shape,
            model_params=job.model_params,
            has_base=self.has_base,
            warn=warn,
        )


def make_plan(
    cfg: MergeConfig, ref: Readable, n_models: int, threads: int, vocab: VocabPlan | None = None
) -> MergePlan:
    """Plan the merge of ``n_models`` models against the reference checkpoint ``ref`` (and added ``vocab`` rows)."""
    chunk = chunk_elements(cfg, n_models, threads)
    method = cfg.spec
    jobs = tuple(plan_jobs(cfg, ref, chunk, vocab or VocabPlan()))
    # other mask rules, and parameters the compiled kernels do not implement (``Param.reference_only``), run
    # on the reference kernels
    plain = all(j.rule.plain and not method.needs_reference(j.params) for j in jobs if j.merged)
    layers = layer_count(j.name for j in jobs)
    if any(float(j.params.get("lines_beta", 0.0)) > 0 for j in jobs if j.merged):
        check_layers(layers, str(ref.path))
    return MergePlan(
        method=method,
        jobs=jobs,
        chunk=chunk,
        threads=threads,
        weights=torch.tensor([m.weight for m in cfg.models], dtype=torch.float32),
        seed=cfg.seed,
        shard_bytes=cfg.shard_bytes,
        compiled=plain and method.compiled is not None and available(n_models),
        has_base=cfg.base is not None,
        layers=layers,
        memory=cfg.memory_bytes,
    )


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


def plan_jobs(cfg: MergeConfig, ref: Readable, chunk: int, vocab: VocabPlan | None = None) -> list[TensorJob]:
    """Decide, per tensor of the reference, its output dtype, whether it is merged, its chunks and parameters."""
    out_dtype = dtype_from_name(cfg.dtype) if cfg.dtype else None
    multiple = cfg.spec.chunk_multiple
    jobs = []
    for name, info in ref.tensors.items():
        floating = info.dtype.is_floating_point
        merged = floating and cfg.selected(name)
        dtype = out_dtype if (out_dtype is not None and floating) else info.dtype
        step = chunk
        if multiple is not None and merged:  # round up to the method's unit
            unit = multiple(info.shape)
            step = -(-chunk // unit) * unit
        params = resolve_mask(cfg.tensor_params(name), info.dtype) if merged else {}  # the config's typed record
        whole = whole_work(cfg, name, info.shape, params) if merged else WholeWork()
        if whole.whole:
            step = max(info.numel, 1)
        ranges = tuple((s, min(s + step, info.numel)) for s in range(0, info.numel, step)) or ((0, 0),)
        model_params = tuple(resolve_mask(p, info.dtype) for p in cfg.model_params(name)) if merged else ()
        rule = mask_rule(params, cfg.seed) if merged else MaskRule()
        resized = vocab.tensors.get(name) if vocab is not None else None
        weights = cfg.tensor_weights(name) if merged else None
        job = TensorJob(
            name,
            dtype,
            info.shape,
            info.numel,
            merged,
            ranges,
            params,
            model_params,
            resized,
            rule,
            *whole.fields(),
            weights=weights,
        )
        jobs.append(job)
    return jobs


@dataclass(frozen=True)
class WholeWork:
    """Whether a tensor is merged whole, which post-steps run on it, what its kernel and steps hold."""

    whole: bool = False
    steps: tuple[str, ...] = ()
    copies: float = 0.0
    svds: tuple[tuple[int, int], ...] = ()

    def fields(self) -> tuple[bool, tuple[str, ...], float, tuple[tuple[int, int], ...]]:
        return self.whole, self.steps, self.copies, self.svds


def whole_work(cfg: MergeConfig, name: str, shape: tuple[int, ...], params: Params) -> WholeWork:
    """The method's and the post-steps' claims on one merged tensor (``Needs.whole``, ``PostStep.whole``); a
    tensor the method refuses (``Needs.check_tensor``) raises here, before anything is read or written."""
    needs, n = cfg.spec.needs, len(cfg.models)
    if needs.check_tensor is not None:
        try:
            needs.check_tensor(name, shape, params, n)
        except ValueError as e:
            raise MergeError(str(e)) from None
    wholes = [needs.whole] if needs.whole is not None and needs.whole.wanted(name, shape, params) else []
    steps = active_steps(name, shape, params)
    wholes += [s.whole for s in steps if s.whole is not None and s.whole.wanted(name, shape, params)]
    svds = tuple(svd for w in wholes for svd in w.svds(shape, params, n))
    # one after the other: the largest work space, plus the merged delta each later step receives
    copies = max((w.copies(n) for w in wholes), default=0.0) + max(len(wholes) - 1, 0)
    return WholeWork(bool(wholes), tuple(s.name for s in steps), copies, svds)


def resolve_mask(params: Params, base_dtype: torch.dtype) -> Params:
    """``mask_dtype: base`` made the base tensor's grid (``masks.grid_of``); other parameters unchanged. A record
    stays a record of its type."""
    if params.get("mask_dtype") != "base":
        return params
    grid = {**params, "mask_dtype": grid_of(base_dtype)}
    return type(params).of(grid) if isinstance(params, MethodParams) else grid


def planned_tensors(jobs: Sequence[TensorJob]) -> list[PlannedTensor]:
    return [PlannedTensor(j.name, j.out_dtype, j.out_shape) for j in jobs]
