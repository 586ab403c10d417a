"""Fast paths against their references, bit for bit, and the merge's memory bound (not a timing test)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from agentmerge.config.schema import MergeConfig, ModelSpec
from agentmerge.engine.merge import merge
from agentmerge.engine.parallel import fold_parallel, run_parallel
from agentmerge.errors import MergeError
from agentmerge.methods.deltas import (
    histogram_from_patterns,
    overlap_count,
    overlap_histogram,
    pattern_counts,
    task_vectors,
    update_mask,
)
from agentmerge.methods.fused import kernels as fk
from agentmerge.methods.fused import rng as frng
from agentmerge.methods.fused.jit import BLOCK, available
from agentmerge.methods.ram import compiled as ram_compiled
from agentmerge.methods.registry import METHODS
from agentmerge.methods.spec import Chunk, ChunkSpec, CompiledKernel, TensorStats
from agentmerge.methods.ties import compiled as ft

needs_numba = pytest.mark.skipif(not available(), reason="numba not installed")


def _compiled(method: str) -> CompiledKernel:
    compiled = METHODS[method].compiled
    assert compiled is not None
    return compiled.kernel


def _histogram_by_definition(mask: torch.Tensor) -> torch.Tensor:
    n = mask.shape[0]
    count = overlap_count(mask)
    return torch.stack([(mask & (count == k + 1)).sum(1) for k in range(n)], dim=1)


def _inputs(n: int, e: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A base and ``n`` sparse RL-like agents, with some deltas exactly at and around epsilon."""
    g = torch.Generator().manual_seed(seed)
    ref = (torch.randn(e, generator=g) * 0.02).to(dtype)
    models = []
    for i in range(n):
        moved = torch.rand(e, generator=g) < (0.05 + 0.9 * i / max(n, 2))
        delta = torch.randn(e, generator=g) * 2e-3 * moved
        models.append((ref.float() + delta).to(dtype))
    stack = torch.stack(models)
    if e > 8:
        stack[0, :4] = ref[:4].float() + torch.tensor([1e-5, -1e-5, 2e-5, 0.0])  # at/around epsilon (float32)
    return ref, stack


def _reference(
    method: str,
    ref: torch.Tensor,
    models: torch.Tensor,
    params: dict[str, object],
    model_params: tuple[dict[str, object], ...] = (),
) -> torch.Tensor:
    """``theta_0 + kernel(chunk)`` in float32, as the driver's reference path computes it (one whole tensor)."""
    spec = METHODS[method]
    full = {**spec.defaults(), **params}
    r, tau = ref.float(), task_vectors(ref, models)
    hist = overlap_histogram(update_mask(tau, float(full.get("epsilon", 1e-5))))
    weights = torch.linspace(0.5, 2.0, models.shape[0])
    mp = tuple({**full, **m} for m in model_params)
    chunk = Chunk(
        name="t", start=0, stop=r.numel(), base=r, tau=tau, weights=weights, params=full,  # type: ignore[arg-type]
        stats=TensorStats(hist, hist), seed=11, shape=(r.numel(),), model_params=mp,  # type: ignore[arg-type]
    )  # fmt: skip
    return r + spec.kernel(chunk)


CASES = [
    ("ram", {}),
    ("ram", {"epsilon": 1e-3}),
    ("ram_plus", {}),
    ("ram_plus", {"scope": "tensor", "r": 0.7, "alpha": 1.5}),
    ("ram_plus", {"form": "authors", "rescale_factor": 1.2}),
    ("linear", {}),
    ("task_arithmetic", {"lambda": 0.37}),
    ("ties", {}),
    ("ties", {"density": 0.55, "lambda": 0.7}),
    ("ties", {"density": 1.0}),
    ("ties", {"density": 0.0}),
    ("dare_ties", {}),
    ("dare_ties", {"p": 0.3, "density": 0.4, "lambda": 1.3}),
    ("dare_ties", {"p": 0.75}),
    ("dare_linear", {}),
    ("dare_linear", {"p": 0.9, "lambda": 0.8}),
    ("breadcrumbs", {}),
    ("breadcrumbs", {"density": 0.3, "gamma": 0.1, "lambda": 0.6}),
    ("breadcrumbs", {"density": 1.0, "gamma": 0.0}),
    ("breadcrumbs", {"density": 0.0}),
    ("ram_ties", {}),
    ("ram_ties", {"keep": 0.35, "epsilon": 1e-3}),
    ("ram_ties", {"keep": 1.0}),
    ("ram_ties", {"keep": 0.0}),
]


@needs_numba
@pytest.mark.parametrize(("method", "params"), CASES)
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_fused_kernel_matches_reference_bit_for_bit(
    method: str, params: dict[str, object], n: int, dtype: torch.dtype
) -> None:
    e = 3 * BLOCK + 123  # not a multiple of the block
    ref, models = _inputs(n, e, dtype, seed=n)
    spec = METHODS[method]
    full = {**spec.defaults(), **params}
    eps = float(full.get("epsilon", 1e-5))
    tau = task_vectors(ref, models)
    hist = overlap_histogram(update_mask(tau, eps))
    weights = torch.linspace(0.5, 2.0, n)
    call = ChunkSpec(
        name="t", start=0, stop=ref.numel(), params=full, weights=weights, stats=TensorStats(hist, hist), seed=11
    )
    result = _compiled(method)(ref, models, call)
    expected = _reference(method, ref, models, params)
    assert result.finite and result.merged is not None
    assert torch.equal(result.merged.view(torch.int32), expected.view(torch.int32))  # bits, -0.0 included
    assert torch.equal(histogram_from_patterns(result.patterns), _histogram_by_definition(update_mask(tau, eps)))


@needs_numba
@pytest.mark.parametrize("method", ["ties", "dare_ties", "dare_linear", "breadcrumbs", "ram_ties"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_ties_family_with_per_model_params(method: str, dtype: torch.dtype) -> None:
    """Per-agent densities and drop rates (one agent keeping nothing, one everything) give the reference's bits."""
    n, e = 4, 2 * BLOCK + 77
    ref, models = _inputs(n, e, dtype, seed=5)
    per_model = (
        {"density": 0.0, "p": 0.1, "gamma": 0.05, "keep": 0.0},
        {"density": 1.0, "p": 0.5, "gamma": 0.0, "keep": 1.0},
        {"density": 0.3, "p": 0.0, "gamma": 0.2, "keep": 0.3},
        {"density": 0.77, "p": 0.6, "gamma": 0.01, "keep": 0.8},
    )
    full = METHODS[method].defaults()
    mp = tuple({**full, **m} for m in per_model)
    call = ChunkSpec(
        name="t", start=0, stop=e, params=full, weights=torch.linspace(0.5, 2.0, n), seed=11, model_params=mp
    )
    result = _compiled(method)(ref, models, call)
    expected = _reference(method, ref, models, {}, per_model)
    assert result.finite and result.merged is not None
    assert torch.equal(result.merged.view(torch.int32), expected.view(torch.int32))


@needs_numba
@pytest.mark.parametrize("e", [0, 1, 7, BLOCK, BLOCK + 1])
def test_fused_edges_and_counts(e: int) -> None:
    ref, models = _inputs(3, e, torch.bfloat16, seed=e)
    counted = fk.counts(ref, models, 1e-5)
    mask = update_mask(task_vectors(ref, models), 1e-5)
    assert counted.finite and counted.patterns.sum() == e
    assert torch.equal(counted.patterns, pattern_counts(mask))
    merged = ram_compiled.ram(
        ref, models, ChunkSpec(name="t", start=0, stop=e, params={"epsilon": 1e-5}, weights=torch.ones(3))
    ).merged
    assert merged is not None and torch.equal(merged, _reference("ram", ref, models, {}))


@needs_numba
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("row", [0, 2])
def test_fused_flags_non_finite(bad: float, row: int) -> None:
    ref, models = _inputs(2, 5000, torch.bfloat16, seed=1)
    if row == 0:
        ref[4321] = bad
    else:
        models[1, 17] = bad
    spec = ChunkSpec(name="t", start=0, stop=5000, params={"epsilon": 1e-5}, weights=torch.ones(2))
    assert not ram_compiled.ram(ref, models, spec).finite
    assert not fk.counts(ref, models, 1e-5).finite


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 16, 17])
def test_pattern_histogram_equals_definition(n: int) -> None:
    g = torch.Generator().manual_seed(n)
    mask = torch.rand(n, 4099, generator=g) < torch.linspace(0.02, 0.9, n)[:, None]
    assert torch.equal(overlap_histogram(mask), _histogram_by_definition(mask))
    if n <= 16:
        assert torch.equal(histogram_from_patterns(pattern_counts(mask)), _histogram_by_definition(mask))


def test_run_parallel_keeps_task_order() -> None:
    import time

    tasks = [lambda i=i: (time.sleep(0.002 * (i % 3)), i)[1] for i in range(40)]
    assert run_parallel(tasks, 3) == list(range(40))
    assert run_parallel(tasks, 1) == list(range(40))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_fold_parallel_folds_in_task_order_and_holds_few_results(threads: int) -> None:
    """The fold sees results in task order (a non-commutative fold shows any other), one task's slowness included,
    and never more than 4 x threads results wait for it: the pass holds a bounded number, not one per chunk."""
    import threading
    import time

    lock, alive, most = threading.Lock(), [0], [0]

    class Result:
        def __init__(self, i: int) -> None:
            self.i = i
            with lock:
                alive[0] += 1
                most[0] = max(most[0], alive[0])

    def task(i: int) -> Result:
        time.sleep(0.05 if i == 3 else 0.001 * (i % 3))
        return Result(i)

    def fold(acc: list[int], r: Result) -> list[int]:
        with lock:
            alive[0] -= 1
        return [*acc, r.i]

    tasks = [lambda i=i: task(i) for i in range(60)]
    assert fold_parallel(tasks, threads, fold, []) == list(range(60))
    assert most[0] <= max(1, 4 * threads)
    assert fold_parallel([], threads, fold, [7]) == [7]


# --------------------------------------------------------------------------- whole merges, fused vs reference


def _family(root: Path, dtype: torch.dtype) -> tuple[Path, list[Path]]:
    g = torch.Generator().manual_seed(7)
    shapes = {"embed.weight": (301, 40), "layer.weight": (64, 64), "layer.bias": (64,), "norm.weight": (64,)}
    base = {k: (torch.randn(s, generator=g) * 0.02).to(dtype) for k, s in shapes.items()}
    folders = []
    for i, name in enumerate(["base", "a0", "a1", "a2"]):
        tensors = base if i == 0 else {}
        for k, v in base.items():
            if i:
                moved = torch.rand(v.shape, generator=g) < (0.03, 0.46, 0.54)[i - 1]
                tensors[k] = (v.float() + 2e-3 * torch.randn(v.shape, generator=g) * moved).to(dtype)
        (root / name).mkdir(parents=True)
        save_file(tensors, str(root / name / "model.safetensors"))
        folders.append(root / name)
    return folders[0], folders[1:]


@needs_numba
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    ("method", "params", "weights"),
    [
        ("ram", {}, None),
        ("ram_plus", {}, None),
        ("ram_plus", {"scope": "tensor"}, None),
        ("linear", {}, [1.0, 2.0, 0.5]),
        ("task_arithmetic", {"lambda": 0.6}, [1.0, 0.3, 0.2]),
        ("ties", {}, None),
        ("ties", {"density": 0.6, "lambda": 0.9}, [1.0, 2.0, 0.5]),
        ("dare_ties", {}, None),
        ("dare_ties", {"density": 0.3, "p": 0.2}, [1.0, 0.3, 0.2]),
        ("dare_linear", {"p": 0.6}, None),
        ("ties", {"_overrides": [{"pattern": "layer.*", "params": {"density": 1.0}}]}, None),
        ("dare_ties", {"_overrides": [{"pattern": "embed*", "params": {"density": 0.05, "p": 0.9}}]}, None),
        ("breadcrumbs", {}, [1.0, 2.0, 0.5]),
        ("breadcrumbs", {"density": 0.5, "gamma": 0.2}, None),
        ("ram_ties", {}, None),
        ("ram_ties", {"keep": 0.5, "epsilon": 1e-4}, None),
    ],
)
def test_merge_output_identical_with_and_without_fused(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    dtype: torch.dtype,
    method: str,
    params: dict[str, object],
    weights: list[float] | None,
) -> None:
    base, agents = _family(tmp_path / "fam", dtype)
    specs = [ModelSpec(path=str(a), weight=w) for a, w in zip(agents, weights or [1.0] * 3, strict=True)]
    params = dict(params)
    overrides = params.pop("_overrides", [])  # per-tensor parameters (one tensor dense, one trimmed harder)
    cfg = MergeConfig(
        method=method, base=str(base), models=specs, params=params, overrides=overrides, chunk_size=1000, threads=2
    )
    outputs = {}
    for flag in ("1", "0"):
        monkeypatch.setenv("AGENTMERGE_FUSED", flag)
        result = merge(cfg, tmp_path / f"out{flag}", quiet=True)
        outputs[flag] = ((tmp_path / f"out{flag}" / "model.safetensors").read_bytes(), result.model_hist)
    assert outputs["1"] == outputs["0"]


@needs_numba
@pytest.mark.parametrize("method", ["ram", "ties", "dare_ties"])
@pytest.mark.parametrize("chunk_size", [None, 1000])
def test_fused_merge_names_a_non_finite_input(tmp_path: Path, method: str, chunk_size: int | None) -> None:
    base, agents = _family(tmp_path / "fam", torch.bfloat16)
    from safetensors.torch import load_file

    tensors = load_file(str(agents[1] / "model.safetensors"))
    tensors["layer.weight"][3, 3] = float("nan")
    save_file(tensors, str(agents[1] / "model.safetensors"))
    models = [ModelSpec(path=str(a)) for a in agents]
    cfg = MergeConfig(method=method, base=str(base), models=models, chunk_size=chunk_size)
    with pytest.raises(MergeError, match="a1"):
        merge(cfg, tmp_path / "out", quiet=True)
    assert not (tmp_path / "out").exists()


@needs_numba
@pytest.mark.parametrize("method", ["ties", "dare_ties", "dare_linear", "breadcrumbs", "ram_ties"])
def test_fused_per_model_params_merge_identical(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    """Per-model densities and drop rates on multi-chunk tensors: fused and reference merges agree byte for byte."""
    base, agents = _family(tmp_path / "fam", torch.bfloat16)
    takes = {p.name for p in METHODS[method].params}
    own = [
        {"density": 0.1, "p": 0.3, "gamma": 0.0, "keep": 0.2},
        {"density": 0.9, "p": 0.5, "gamma": 0.05, "keep": 0.9},
        {"density": 1.0, "p": 0.0, "gamma": 0.0, "keep": 0.05},
    ]
    own = [{k: v for k, v in o.items() if k in takes} for o in own]
    weights = [1.0, 0.5, 2.0] if METHODS[method].uses_weights else [1.0] * 3
    specs = [ModelSpec(path=str(a), weight=w, params=o) for a, w, o in zip(agents, weights, own, strict=True)]
    cfg = MergeConfig(method=method, base=str(base), models=specs, chunk_size=1000, threads=2, seed=3)
    outputs = []
    for flag in ("1", "0"):
        monkeypatch.setenv("AGENTMERGE_FUSED", flag)
        merge(cfg, tmp_path / f"out{flag}", quiet=True)
        outputs.append((tmp_path / f"out{flag}" / "model.safetensors").read_bytes())
    assert outputs[0] == outputs[1]


# --------------------------------------------------------------------------- memory bound

_MEASURE = textwrap.dedent(
    """
    import json, sys, threading, time
    from agentmerge.config.schema import MergeConfig, ModelSpec
    from agentmerge.engine.merge import merge

    def status(key):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))

    def run(family, out, budget):
        base, *agents = family
        cfg = MergeConfig(method=sys.argv[1], base=base, models=[ModelSpec(path=a) for a in agents],
                          max_memory=budget, threads=2)
        merge(cfg, out, quiet=True)

    small, big, budget, out = json.loads(sys.argv[2])
    run(small, out + "-warm", budget)  # imports, compiled kernels, thread pools: the baseline
    before_anon, before_hwm = status("RssAnon:"), status("VmHWM:")
    peak, done = [before_anon], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], status("RssAnon:"))
            time.sleep(0.002)

    t = threading.Thread(target=sample)
    t.start()
    run(big, out, budget)
    done.set()
    t.join()
    print(json.dumps({"anon": peak[0] - before_anon, "hwm": status("VmHWM:") - before_hwm}))
    """
)


def _big_family(root: Path, rows: int, cols: int) -> list[str]:
    """A base and three bf16 agents holding one ``rows x cols`` tensor (written directly: fast)."""
    g = torch.Generator().manual_seed(0)
    base = (torch.randn(rows, cols, generator=g) * 0.02).to(torch.bfloat16)
    folders = []
    for i in range(4):
        t = base if i == 0 else (base.float() + 2e-3 * torch.randn(rows, cols, generator=g)).to(torch.bfloat16)
        (root / str(i)).mkdir(parents=True)
        save_file({"w": t}, str(root / str(i) / "model.safetensors"))
        folders.append(str(root / str(i)))
        del t
    return folders


@pytest.mark.parametrize("fast", ["1", "0"])
def test_peak_memory_is_bounded_by_the_budget_not_the_model(tmp_path: Path, fast: str) -> None:
    """A 64 MB-per-input tensor merged with a 24 MB budget: the peak grows by O(budget), not O(model).

    Unchunked, the merge would hold >= 4 x 64 MB of raw reads plus their float32 copies (~1 GB).
    """
    if fast == "1" and not available():
        pytest.skip("numba not installed")
    budget = 24 * 1024 * 1024
    small = _big_family(tmp_path / "small", 64, 64)
    big = _big_family(tmp_path / "big", 8192, 4096)  # 32 M elements, 64 MB per input in bf16
    args = json.dumps([small, big, budget, str(tmp_path / "out")])
    env = {"AGENTMERGE_FUSED": fast, "AGENTMERGE_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURE, "ram", args], capture_output=True, text=True, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    grew = json.loads(proc.stdout.strip().splitlines()[-1])
    bound = 2 * budget + 48 * 1024 * 1024  # the budget, allocator slack, per-thread kernel blocks
    assert grew["anon"] < bound, grew
    assert grew["hwm"] < bound, grew


@needs_numba
def test_fused_ties_takes_the_compiled_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The TIES merge really runs the fused statistics pass: one first-pass count per chunk of every tensor."""
    base, agents = _family(tmp_path / "fam", torch.bfloat16)
    seen: list[int] = []
    upper = ft.upper_counts

    def spy(raw: fk.RawChunk, drop: ft.Drop, eps: float = -1.0) -> tuple[torch.Tensor, bool]:
        seen.append(raw.models.shape[1])
        return upper(raw, drop, eps)

    monkeypatch.setattr(ft, "upper_counts", spy)
    cfg = MergeConfig(method="ties", base=str(base), models=[ModelSpec(path=str(a)) for a in agents], chunk_size=1000)
    merge(cfg, tmp_path / "out", quiet=True)
    # 301x40 and 64x64 in chunks of 1000 (13 + 5), the two 64-element tensors whole
    assert sorted(seen) == sorted([1000] * 12 + [40] + [1000] * 4 + [96] + [64, 64])


@needs_numba
@pytest.mark.parametrize(
    ("start", "stop", "rows"),
    [
        (0, 1 << 20, 3),
        (0, 5, 1),
        (1000, 1 << 20, 2),
        ((1 << 20) - 7, (1 << 20) + 9, 4),
        (3 << 20, (3 << 20) + 1, 1),
        (9, 9, 2),
    ],
)
def test_compiled_draws_are_torch_rand_bit_for_bit(start: int, stop: int, rows: int) -> None:
    """The compiled MT19937 stream gives exactly ``deltas.seeded_uniform`` (torch.rand per seeded block)."""
    from agentmerge.methods.deltas import seeded_uniform

    for seed, name in [(0, "model.embed_tokens.weight"), (12345, "w")]:
        expected = seeded_uniform(seed, name, start, stop, rows)
        got = torch.from_numpy(frng.seeded_uniform(seed, name, start, stop, rows))
        assert got.shape == expected.shape and torch.equal(got, expected)
