"""What a method asks of the driver besides its kernel: its inputs, its statistics passes, the scales it reports.

A ``Method`` entry carries four hooks, all plain data naming the method's own functions, so the driver,
the dry run and the report run every method the same way and never name one:

- ``needs`` (``Needs``): a base, model weights, how many models, extra per-model tensors (a Fisher file),
  how its tensors are cut into chunks (aligned, or whole: ``WholeTensor``, an SVD needs the whole matrix),
  which tensors it refuses before anything is written (``check_tensor``).
- ``passes``: the statistics it needs before the write pass, in order. Each is one of four kinds the engine
  knows how to run (``engine.passes``), over every merged tensor, chunk-parallel:

  ``MaskLevels``     per agent and tensor, the thresholds of adaptive mask rules; the plan puts it first
                     whenever a tensor's rule is adaptive, whatever the method (not declared by methods);
  ``OverlapCounts``  each tensor's ``[N, N]`` overlap histogram under its mask rule, summed over the model
                     and, by ``group``, over groups of tensors (RAM+'s rho);
  ``ModelSum``       one whole-model statistic: ``count`` of every chunk (a ``Chunk`` with its values, its
                     extra tensors and its mask thresholds), summed in plan order (ram_fisher's Fisher masses);
  ``TensorPrepare``  whole-tensor statistics of each multi-chunk tensor (``prepare``, one pass over its chunks;
                     with the compiled kernels, their ``Compiled.rounds`` compute the same chunk-parallel).

  Kernels find what the passes found in ``ChunkSpec.stats`` (``TensorStats``). ``reads`` says how many
  times a pass reads the merged tensors (the dry run adds them up); ``cached`` passes keep their counts per
  input set across runs, so a sweep counts them once before its trials (``engine.merge.count_overlaps``).
- ``scales`` (``Scales``): the per-agent scales the method reports, as rows of merge.json's ``scales`` (from
  the whole-model statistics, ``ModelStats``) and as lines of the merge summary.
- ``advice``: notes for the merge summary from each agent's overlap over the merged tensors (``AgentOverlap``),
  where the method is known to do something a user should check (RAM: an agent it averages nearly whole).

Pure Python; torch appears in annotations only, so the method table loads without it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from agentmerge.methods.params import Params
from agentmerge.methods.spec import Lazy

if TYPE_CHECKING:
    import torch

    from agentmerge.methods.spec import Chunk, TensorSource


@dataclass(frozen=True)
class WholeTensor:
    """Tensors merged whole (an SVD needs the whole matrix): one chunk each, one tensor per model held.

    ``wanted(name, shape, params)`` says which tensors; ``svds(shape, params, n_models)`` the ``(rows, cols)`` of
    every SVD the kernel (or post-step) runs on one of them (the dry run's time estimate and the benchmark's
    "SVDs alone"); ``copies(n_models)`` how many float32 copies of the tensor it holds at once beyond the
    ``N + 1`` inputs (the memory figure). The driver runs a whole tensor in its thread pool when it fits the
    memory budget's share of one thread, else alone, after the pool, with all threads (``MergePlan.alone``).
    """

    wanted: Callable[[str, tuple[int, ...], Params], bool]
    svds: Callable[[tuple[int, ...], Params, int], tuple[tuple[int, int], ...]]
    copies: Callable[[int], float]


@dataclass(frozen=True)
class Needs:
    """What a config must give a method, and how the driver cuts its tensors."""

    base: bool = True  # a base model (task vectors are taken against it; False: the first model stands in)
    weights: bool = False  # reads the models' weights (else every weight must be 1)
    models: tuple[int, int | None] = (1, None)  # at least, at most (None: any number)
    extras: tuple[str, ...] = ()  # extra per-model tensors, e.g. ("fisher",): ``ModelSpec.fisher`` of each model
    # chunks of a tensor of this shape start on multiples of this (e.g. whole rows); None: any
    chunk_multiple: Callable[[tuple[int, ...]], int] | None = None
    whole: WholeTensor | None = None  # tensors merged whole, one chunk each (SVD methods); None: any may be chunked
    # refuses a tensor it cannot merge while the plan is made, before anything is read or written:
    # (name, shape, params, N) -> raises ValueError with a sentence saying what to do
    check_tensor: Callable[[str, tuple[int, ...], Params, int], None] | None = None


# --------------------------------------------------------------------------- statistics before the write pass


@dataclass(frozen=True)
class MaskLevels:
    """Adaptive mask thresholds (``masks.tensor_levels``) of every tensor whose rule is adaptive; cached."""

    cached: ClassVar[bool] = True

    def reads(self, params: Sequence[Params]) -> int:
        return 1


@dataclass(frozen=True)
class OverlapCounts:
    """Each merged tensor's overlap histogram under its mask rule, before the write pass; cached.

    ``group(name, params)``: the group a tensor's histogram is also summed into (None: none), e.g. RAM+'s
    ``scope: layer``; kernels read the tensor's, its group's and the model's (``TensorStats``).
    """

    group: Callable[[str, Params], str | None] | None = None
    cached: ClassVar[bool] = True

    def reads(self, params: Sequence[Params]) -> int:
        return 1


@dataclass(frozen=True)
class ModelSum:
    """A whole-model statistic: ``count(chunk)`` summed over every chunk of every merged tensor, in plan order.

    Runs only when ``wanted(params)`` holds for some merged tensor's parameters (else ``TensorStats.model_stat``
    stays None and nothing is read); ``label`` names it on the progress bar.
    """

    count: Callable[[Chunk], torch.Tensor]
    wanted: Callable[[Params], bool]
    label: str
    cached: ClassVar[bool] = False

    def reads(self, params: Sequence[Params]) -> int:
        return int(any(self.wanted(p) for p in params))


@dataclass(frozen=True)
class TensorPrepare:
    """Whole-tensor statistics of each multi-chunk tensor, one pass over its chunks before it is merged.

    ``prepare(source)`` may return None (nothing needed for this tensor); a one-chunk tensor's kernel computes
    what it needs from the chunk itself. The compiled form's ``Rounds``, when the compiled kernels run,
    compute the same values chunk-parallel.
    """

    prepare: Callable[[TensorSource], Any]
    cached: ClassVar[bool] = False

    def reads(self, params: Sequence[Params]) -> int:
        return 1


Pass = MaskLevels | OverlapCounts | ModelSum | TensorPrepare


# --------------------------------------------------------------------------- the scales a method reports

ScaleRow = dict[str, Any]  # merge.json: {"group": name, "agents": [{"agent", "rho", "lambda"}, ...]}


@dataclass(frozen=True)
class ModelStats:
    """What the statistics passes found over the whole merge, as a method's ``Scales.rows`` reads it."""

    params: Params  # the first merged tensor's parameters
    model_hist: torch.Tensor | None  # [N, N] summed over the merged tensors (None: not counted)
    groups: Mapping[str, tuple[torch.Tensor, Params]]  # group -> summed [N, N] histogram, its first tensor's params
    model_stat: Any  # a ``ModelSum``'s value, or None


@dataclass(frozen=True)
class ScaleSummary:
    """The merge summary's part of a method: text after each agent's line, then lines of its own."""

    cells: tuple[str, ...] = ()  # one per agent, in order (): nothing added
    lines: tuple[str, ...] = ()


@dataclass(frozen=True)
class AgentOverlap:
    """One agent over the merged tensors, as a method's ``advice`` reads it."""

    name: str
    overlap: tuple[float, ...]  # w.0..w.(N-1): share of its updated elements that exactly k others also updated


Advice = Callable[[Params, Sequence[AgentOverlap]], tuple[str, ...]]  # (params, agents) -> summary notes


@dataclass(frozen=True)
class Scales:
    """The per-agent scales a method reports.

    ``rows(stats, labels)``: merge.json's ``scales`` rows; ``summary(params, rows, agents)``: the summary's
    part, from the merge's parameters, those rows and each agent's ``(label, rho)`` over the model.
    """

    rows: Callable[[ModelStats, Sequence[str]], list[ScaleRow]]
    summary: Callable[[Params, Sequence[ScaleRow], Sequence[tuple[str, float]]], ScaleSummary]


# the chunk alignment of the methods that count exact block sums (``stats.stat_blocks``), imported on first use
STAT_BLOCKS = Lazy("agentmerge.methods.stats:stat_blocks")
