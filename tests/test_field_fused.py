"""The compiled MagMax and Consensus kernels (``fused/field.py``) against the reference kernels, bit for bit."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from agentmerge.methods import stats
from agentmerge.methods.deltas import histogram_from_patterns, overlap_histogram, task_vectors, update_mask
from agentmerge.methods.fused.jit import BLOCK, available
from agentmerge.methods.registry import METHODS
from agentmerge.methods.spec import Chunk, ChunkSpec, TensorStats

CASES: list[tuple[str, dict[str, Any]]] = [
    ("magmax", {}),
    ("magmax", {"lambda": 1.37}),
    ("magmax", {"lambda": -0.5}),
    ("consensus", {}),
    ("consensus", {"k": 0}),
    ("consensus", {"k": 1, "tall_lambda": 0.2, "lambda": 1.1}),
    ("consensus", {"k": 9}),
    ("sce", {}),
    ("karcher", {}),
    ("karcher", {"max_iter": 2}),
    ("multislerp", {}),
    ("multislerp", {"normalize_weights": False}),
    ("nuslerp", {}),
]


def inputs(n: int, e: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A base and sparse agents on a coarse grid: exact ties of |tau| and of the TALL comparison occur."""
    g = torch.Generator().manual_seed(seed)
    ref = (torch.randn(e, generator=g) * 0.02).to(dtype)
    steps = torch.randint(-4, 5, (n, e), generator=g).float() * 2.0**-9
    moved = torch.rand(n, e, generator=g) < 0.6
    models = (ref.float() + torch.where(moved, steps, 0.0)).to(dtype)
    if e > 4:
        models[:, 0] = ref[0]  # nobody moved
        models[:, 1] = -0.0
    return ref, models


@pytest.mark.skipif(not available(), reason="numba not installed")
@pytest.mark.parametrize(("method", "params"), CASES)
@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
def test_compiled_equals_reference_bit_for_bit(method: str, params: dict[str, Any], n: int, dtype: torch.dtype) -> None:
    if method == "nuslerp":
        n = 2
    e = 2 * BLOCK + 99
    ref, models = inputs(n, e, dtype, seed=n)
    full = {**METHODS[method].defaults(), **params}
    mp = tuple({**full, "tall_lambda": 0.3 + 0.1 * i} for i in range(n)) if method == "consensus" else ()
    weights = torch.linspace(0.5, 2.0, n) if METHODS[method].uses_weights else torch.ones(n)
    spec = ChunkSpec(name="t", start=0, stop=e, params=full, weights=weights, shape=(e,), model_params=mp)
    compiled = METHODS[method].compiled
    assert compiled is not None
    result = compiled.kernel(ref, models, spec)
    tau = task_vectors(ref, models)
    chunk = Chunk(**{**spec.__dict__, "stats": TensorStats()}, base=ref.float(), tau=tau)
    expected = ref.float() + METHODS[method].kernel(chunk)
    assert result.finite and result.merged is not None
    assert torch.equal(result.merged.view(torch.int32), expected.view(torch.int32))
    assert torch.equal(histogram_from_patterns(result.patterns), overlap_histogram(update_mask(tau, 1e-5)))


@pytest.mark.skipif(not available(), reason="numba not installed")
def test_compiled_reports_non_finite_inputs() -> None:
    ref, models = inputs(3, 100, torch.float32, seed=0)
    models[1, 50] = float("nan")
    spec = ChunkSpec(name="t", start=0, stop=100, params=METHODS["magmax"].defaults(), weights=torch.ones(3))
    compiled = METHODS["magmax"].compiled
    assert compiled is not None and not compiled.kernel(ref, models, spec).finite


@pytest.mark.skipif(not available(), reason="numba not installed")
@pytest.mark.parametrize(("k", "e"), [(1, 5), (2, 1024), (3, 3001), (5, 3 * 1024 + 17)])
def test_compiled_block_dot_products_are_the_torch_bits(k: int, e: int) -> None:
    """``fused.gram`` (Gram statistics of model_stock, slerp, the spherical methods, SCE) against ``stats``' torch."""
    g = torch.Generator().manual_seed(k * e)
    v = torch.randn(k, e, generator=g) * torch.logspace(-20, 20, k)[:, None]
    v[:, :3] = torch.tensor([0.0, -0.0, 1e-45])
    want = stats._dot_blocks_torch(v, 0)
    assert torch.equal(stats._dot_blocks(v, 0).view(torch.int64), want.view(torch.int64))
    squares = torch.stack([stats.block_sums(r.double() * r.double(), 0) for r in v])
    assert torch.equal(stats.square_blocks(v, 0).view(torch.int64), squares.view(torch.int64))
    with pytest.raises(ValueError, match="multiple of"):
        stats._dot_blocks(v, 3)


def test_exact_square_sums() -> None:
    """``square_parts`` adds the block sums of tau^2 exactly, in any order; the compiled count: the same buckets."""
    from fractions import Fraction

    from agentmerge.methods.exactsum import value
    from agentmerge.methods.field.compiled import square_counts
    from agentmerge.methods.field.kernels import square_parts

    ref, models = inputs(3, 3 * BLOCK + 5, torch.float32, seed=9)
    models[0, :4] = torch.tensor([1e-38, -3e38, 1.5e-45, 7.0])
    tau = task_vectors(ref, models)
    blocks = torch.stack([stats.block_sums(r.double() * r.double(), 0) for r in tau])
    want = [sum((Fraction(x) for x in row.tolist()), Fraction(0)) for row in blocks]
    parts = square_parts(tau, 0)
    assert [value(row) for row in parts] == want
    assert [value(row) for row in square_parts(tau[:, :1024], 0) + square_parts(tau[:, 1024:], 1024)] == want
    if available():
        counted, finite = square_counts(ref, models, None, None)  # type: ignore[arg-type]
        assert finite and torch.equal(counted, parts)


@pytest.mark.skipif(not available(), reason="numba not installed")
@pytest.mark.parametrize("method", ["multislerp", "nuslerp"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_compiled_spherical_without_a_base(method: str, dtype: torch.dtype) -> None:
    """No base: the first model is the reference and the raw weights are interpolated, both paths the same bits."""
    n = 2 if method == "nuslerp" else 3
    ref, models = inputs(n, BLOCK + 7, dtype, seed=3)
    models[0] = ref
    full = METHODS[method].defaults()
    spec = ChunkSpec(
        name="t", start=0, stop=BLOCK + 7, params=full, weights=torch.linspace(1.0, 2.0, n), shape=(BLOCK + 7,),
        has_base=False,
    )  # fmt: skip
    compiled = METHODS[method].compiled
    assert compiled is not None
    result = compiled.kernel(ref, models, spec)
    chunk = Chunk(**{**spec.__dict__, "stats": TensorStats()}, base=ref.float(), tau=task_vectors(ref, models))
    expected = ref.float() + METHODS[method].kernel(chunk)
    assert result.merged is not None and torch.equal(result.merged.view(torch.int32), expected.view(torch.int32))


def test_exact_gram_adds_the_block_sums_exactly() -> None:
    from fractions import Fraction

    from agentmerge.methods.exactsum import pairs_of, product_parts, value

    g = torch.Generator().manual_seed(4)
    v = torch.randn(3, 5000, generator=g) * torch.tensor([[1e-30], [1.0], [1e30]])
    parts = product_parts(v, pairs_of(3), 0)
    split = product_parts(v[:, :2048], pairs_of(3), 0) + product_parts(v[:, 2048:], pairs_of(3), 2048)
    assert torch.equal(parts, split)
    for row, (a, b) in enumerate(pairs_of(3)):
        blocks = stats.block_sums(v[a].double() * v[b].double(), 0)
        assert value(parts[row]) == sum((Fraction(x) for x in blocks.tolist()), Fraction(0))
