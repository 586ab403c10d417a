"""Streaming the inputs: opened checkpoints read chunk by chunk, parallel chunk jobs, overlap statistics.

``Inputs`` holds the base (or reference) and the models, checked to be mergeable, and reads any
element range of any tensor from all of them. ``run_parallel`` runs chunk jobs on a thread pool with a
bounded window. ``overlap_stats`` is the statistics pass of RAM+ and the probe (``mask_levels`` first
computes the thresholds of adaptive mask rules, tensor by tensor); ``run_rounds`` computes
a compiled method's whole-tensor statistics (e.g. exact thresholds) in chunk-parallel rounds.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from agentmerge.config.schema import MergeConfig
from agentmerge.engine.plan import MergePlan, TensorJob
from agentmerge.errors import CheckpointError, MergeError
from agentmerge.io.cache import InputSetStore
from agentmerge.io.checkpoint import Checkpoint, Readable, TensorInfo
from agentmerge.io.headers import read_json_object
from agentmerge.io.localpath import is_adapter
from agentmerge.io.lora import LoraModel, split_model_plus_adapter
from agentmerge.io.trainer import open_weights
from agentmerge.io.validate import check_derived_values, check_fisher_role
from agentmerge.io.vocab import VocabPlan, plan_vocab
from agentmerge.methods.deltas import histogram_from_patterns, overlap_histogram, task_vectors
from agentmerge.methods.fused.jit import available
from agentmerge.methods.fused.kernels import counts
from agentmerge.methods.masks import Levels, levels_from_json, levels_key, levels_to_json, tensor_levels, tensor_mask
from agentmerge.methods.ram import fisher_mass
from agentmerge.methods.spec import MaskRule, Rounds

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
        self.models: list[Readable] = []
        self.extras: dict[str, list[Checkpoint]] = {}  # per-model extra tensors, e.g. "fisher"
        self.base = open_weights(base) if base is not None else None
        self.vocab = VocabPlan()
        try:
            self.models = [open_model(m, self.base) for m in models]
            for c in self.checkpoints:
                if isinstance(c, Checkpoint):
                    check_fisher_role(c, fisher=False)
            self.vocab = plan_vocab(self.reference, self.models)
            check_compatible(self.reference, self.models, allow_dtype_mismatch, resized=self.vocab.tensors.keys())
            for kind, paths in (extras or {}).items():
                self.extras[kind] = []
                for path in paths:
                    self.extras[kind].append(Checkpoint(path))
                    check_fisher_role(self.extras[kind][-1], fisher=kind == "fisher")
        except BaseException:
            self.close()
            raise

    @classmethod
    def for_merge(cls, cfg: MergeConfig) -> Inputs:
        """The inputs of a merge configuration, with the extra per-model tensors its method reads (e.g. Fisher)."""
        extras = {kind: [getattr(m, kind) for m in cfg.models] for kind in cfg.spec.model_inputs}
        models = [m.path for m in cfg.models]
        return cls(cfg.base, models, allow_dtype_mismatch=cfg.allow_dtype_mismatch, extras=extras)

    @property
    def checkpoints(self) -> list[Readable]:
        """The reference and the models, in that order."""
        return [self.reference, *self.models]

    @property
    def reference(self) -> Readable:
        """The checkpoint task vectors are taken against: the base, else the first model."""
        return self.base if self.base is not None else self.models[0]

    def close(self) -> None:
        for c in [self.base, *self.models, *(e for group in self.extras.values() for e in group)]:
            if c is not None:
                c.close()

    def check_extras(self, names: Sequence[str]) -> None:
        """Every extra checkpoint holds each of ``names`` with its model's shape, else ``MergeError``."""
        for kind, group in self.extras.items():
            for ckpt, model in zip(group, self.models, strict=True):
                for name in names:
                    info = ckpt.tensors.get(name)
                    want = model.tensors[name].shape
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

    def read_added(self, name: str, adders: Sequence[int], start: int, stop: int) -> torch.Tensor:
        """``[A, E]`` float32: elements ``start:stop`` of ``name`` in the models that added vocabulary rows."""
        values = torch.empty(len(adders), stop - start)
        for row, i in enumerate(adders):
            values[row] = self.models[i].read(name, start, stop)
            check_derived_values(f"{self.models[i].path}: tensor {name!r} (added vocabulary rows)", start, values[row])
        return values

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


def open_model(ref: str, base: Readable | None) -> Readable:
    """A model folder or hub id, a trainer checkpoint (verl, DCP: ``trainer.open_weights``); a LoRA adapter folder
    (on ``base``); or mergekit's ``MODEL+ADAPTER``."""
    pair = split_model_plus_adapter(ref)
    if pair is not None:
        host = open_weights(pair[0])
        try:
            return LoraModel(pair[1], host, owns_host=True)
        except BaseException:
            host.close()
            raise
    if "+" in ref and not Path(ref).expanduser().exists():
        adapter = ref.rpartition("+")[2]
        raise CheckpointError(
            f"{ref}: read as MODEL+ADAPTER, but {adapter} is not a local LoRA adapter folder (adapter_config.json); "
            "download the adapter first"
        )
    if is_adapter(ref):
        if base is None:
            raise MergeError(f"{ref}: a LoRA adapter is merged against its base model; pass the base (--base)")
        return LoraModel(ref, base)
    return open_weights(ref)


def all_finite(x: torch.Tensor) -> bool:
    """Whether every value of a float tensor is finite (one reduction; the exact test only if the sum is not)."""
    return math.isfinite(float(x.sum())) or bool(torch.isfinite(x).all())


def _non_finite(name: str, ref: torch.Tensor, models: torch.Tensor, inputs: Inputs) -> str:
    values = [ref, *models]
    bad = next(c for c, v in zip(inputs.checkpoints, values, strict=True) if not bool(torch.isfinite(v).all()))
    return f"{bad.path}: tensor {name!r} contains NaN or Inf values; this checkpoint is broken, re-export it"


def check_compatible(
    ref: Readable,
    models: Sequence[Readable],
    allow_dtype_mismatch: bool = True,
    resized: Collection[str] = (),
) -> None:
    """Same architecture, tensor names and shapes, and dtypes of the same kind; else a ``MergeError``.

    Floating tensors may differ in dtype (a bf16 base with fp32 agents is how verl and ToolRL release them);
    task vectors are float32 either way. ``allow_dtype_mismatch`` is kept for old callers and configs.
    The vocabulary tensors in ``resized`` may have more rows (``vocab.plan_vocab`` checked them).
    """
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
            _check_tensor(ref, m, info, m.tensors[name], name in resized)


def _check_tensor(ref: Readable, m: Readable, a: TensorInfo, b: TensorInfo, resized: bool = False) -> None:
    if a.shape != b.shape and not resized:
        raise MergeError(
            f"{m.path}: tensor {a.name!r} has shape {list(b.shape)} but {ref.path} has {list(a.shape)} "
            "(only vocabulary tensors, embedding and lm_head with config.json vocab_size rows, may grow; "
            "merge models with this tensor's shape)"
        )
    floating = a.dtype.is_floating_point and b.dtype.is_floating_point  # bf16 base, fp32 agents: a normal case
    if a.dtype != b.dtype and not floating:
        raise MergeError(
            f"{m.path}: tensor {a.name!r} is {b.dtype} but {ref.path} stores it as {a.dtype}; integer and "
            "boolean tensors must match the base exactly (convert the checkpoint)"
        )


def _architecture(c: Readable) -> tuple[str, ...] | None:
    cfg = c.folder / "config.json"
    if not cfg.exists():
        return None
    data = read_json_object(cfg, "config.json")
    arch = data.get("architectures") or [data.get("model_type")]
    arch = arch if isinstance(arch, list) else [arch]
    return tuple(str(a) for a in arch) if any(arch) else None


# --------------------------------------------------------------------------- parallel chunk jobs


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


class OverlapCache:
    """Overlap histograms of one input set (files in order), per tensor and mask rule, kept across runs.

    Stored in ``cache_dir() / stats`` (``cache.InputSetStore``: keyed by the files' identities, so a changed
    file never reuses an old count); a tensor's entry is keyed by its rule (``MaskRule.key``: the plain
    rule's is its epsilon, as before). ``AGENTMERGE_NO_CACHE=1`` turns it off.
    """

    def __init__(self, files: Sequence[Sequence[Path]]) -> None:
        self.store = InputSetStore("stats", files)

    @staticmethod
    def _key(name: str, rule: MaskRule) -> str:
        return f"{name}|{rule.key}"

    def get(self, rules: Mapping[str, MaskRule], n: int) -> dict[str, torch.Tensor]:
        """The cached ``[N, N]`` histograms of these tensors under these rules (those it has)."""
        found = self.store.get(self._key(name, rule) for name, rule in rules.items())
        out = {}
        for name, rule in rules.items():
            rows = found.get(self._key(name, rule))
            if isinstance(rows, list) and len(rows) == n and all(_counts(r, n) for r in rows):
                out[name] = torch.tensor(rows, dtype=torch.int64)
        return out

    def put(self, hists: Mapping[str, torch.Tensor], rules: Mapping[str, MaskRule]) -> None:
        self.store.put({self._key(name, rules[name]): h.tolist() for name, h in hists.items()})


def _counts(row: object, n: int) -> bool:
    """A histogram row as counted: ``n`` whole numbers >= 0 (anything else in the cache is recomputed)."""
    return isinstance(row, list) and len(row) == n and all(type(v) is int and 0 <= v < 1 << 62 for v in row)


class LevelsCache:
    """Adaptive mask thresholds of one input set, per tensor and rule, kept across runs (``cache_dir() / levels``).

    Keyed like ``OverlapCache`` by the files' identities; a tensor's entry by ``masks.levels_key`` (the
    rule with its ``epsilon_q``, or the valley's epsilon, seed and fit settings). Values are stored as the
    exact float32 thresholds, so a merge that reads them is bit-identical to one that computed them.
    """

    def __init__(self, files: Sequence[Sequence[Path]]) -> None:
        self.store = InputSetStore("levels", files)

    def get(self, rules: Mapping[str, MaskRule], n: int) -> dict[str, Levels]:
        """The cached thresholds of these tensors under these rules (those it has, for ``n`` agents)."""
        found = self.store.get(levels_key(name, rule) for name, rule in rules.items())
        out = {}
        for name, rule in rules.items():
            levels = levels_from_json(found.get(levels_key(name, rule)), n)
            if levels is not None:
                out[name] = levels
        return out

    def put(self, levels: Mapping[str, Levels], rules: Mapping[str, MaskRule]) -> None:
        self.store.put({levels_key(name, rules[name]): levels_to_json(lv) for name, lv in levels.items()})


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


def fisher_mass_pass(
    inputs: Inputs, plan: MergePlan, quiet: bool = True, levels: Mapping[str, Levels] | None = None
) -> torch.Tensor | None:
    """``ram_fisher``'s statistics pass: ``[N, 2]`` float64 Fisher mass of each agent (unique, shared), whole model.

    Summed over every merged tensor, chunk by chunk in plan order (so the sum does not depend on threads);
    None when no tensor rescales (``r = 0``), and nothing is read. Updates are counted under each tensor's
    mask rule (``levels``: the thresholds of the adaptive ones, ``mask_levels``), as the merge pass counts them.
    """
    if not any(float(j.params["r"]) > 0 for j in plan.merged):
        return None

    def task(job: TensorJob, start: int, stop: int) -> Callable[[], torch.Tensor]:
        def run() -> torch.Tensor:
            ref, models = inputs.read(job.name, start, stop)
            floor = float(job.params["floor"])
            fisher = inputs.read_extras(job.name, start, stop)["fisher"].clamp_(min=floor)
            mask = tensor_mask(models.sub_(ref), ref, job.rule, (levels or {}).get(job.name))
            return fisher_mass(mask, fisher)

        return run

    tasks = [task(job, s, e) for job in plan.merged for s, e in job.chunks]
    n = len(inputs.models)
    with tqdm(total=len(tasks), desc="statistics (Fisher)", unit="chunk", disable=quiet, leave=False) as bar:
        return sum(run_parallel(tasks, plan.threads, bar), torch.zeros(n, 2, dtype=torch.float64))


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
