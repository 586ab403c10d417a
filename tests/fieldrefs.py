"""Slow, obviously correct per-tensor references of the field's methods, and tiny real-layout families.

The references follow the spec (../shared/field-methods.md) and mergekit's code on whole flattened tensors:
MagMax and Consensus per element in IEEE float32 (numpy scalars, as the authors' float32 code computes),
SCE and the spherical methods in float64 with torch, written the way mergekit writes them (vectors, not
Gram matrices). The families: Qwen2 with tied embeddings (``agentmerge.synthetic``), Qwen2 untied, and a Llama
written by transformers, in bf16 or float32.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from agentmerge.synthetic import Architecture, write_family

F32 = np.float32


# --------------------------------------------------------------------------- families


def qwen2_family(root: Path, dtype: torch.dtype, *, tied: bool = True, delta_std: float = 2e-3) -> tuple[Path, list]:
    arch = Architecture(vocab=96, hidden=32, intermediate=64, layers=3, heads=4, kv_heads=2, tie_embeddings=tied)
    return write_family(root, arch, [0.1, 0.45, 0.6], seed=7, dtype=dtype, delta_std=delta_std)


def llama_family(root: Path, dtype: torch.dtype, n: int = 3, delta_std: float = 5e-3) -> tuple[Path, list[Path]]:
    """A 2-layer Llama (untied head) from transformers and ``n`` agents: sparse Gaussian deltas, stored in dtype."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=40,
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=False,
    )
    torch.manual_seed(3)
    model = LlamaForCausalLM(config).to(dtype)
    model.save_pretrained(root / "base")
    base = load_file(root / "base" / "model.safetensors")
    agents = []
    for i in range(n):
        g = torch.Generator().manual_seed(50 + i)
        out = {}
        for name, t in sorted(base.items()):
            keep = torch.rand(t.shape, generator=g) < 0.3 + 0.2 * i
            out[name] = (t.float() + torch.where(keep, torch.randn(t.shape, generator=g) * delta_std, 0.0)).to(dtype)
        folder = root / f"agent{i}"
        folder.mkdir()
        save_file(out, str(folder / "model.safetensors"), metadata={"format": "pt"})
        (folder / "config.json").write_text((root / "base" / "config.json").read_text())
        agents.append(folder)
    return root / "base", agents


def tensors(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def config_json(folder: Path) -> dict[str, object]:
    return json.loads((folder / "config.json").read_text())


# --------------------------------------------------------------------------- comparing


def bf16_step(x: torch.Tensor) -> torch.Tensor:
    """One bf16 rounding step (ulp) at each |x| (float64)."""
    _, e = torch.frexp(x.double().abs())
    return torch.ldexp(torch.ones_like(x, dtype=torch.float64), e - 8)


def assert_within_bf16_step(name: str, out: torch.Tensor, ref: torch.Tensor) -> None:
    """``out`` (any float dtype) within one bf16 step of the float64 reference, or within 1e-6 of its scale."""
    ref64 = ref.double().reshape(out.shape)
    diff = (out.double() - ref64).abs()
    floor = 1e-6 * float(ref64.abs().max()) if ref64.numel() else 0.0
    bad = diff > torch.clamp(bf16_step(ref64), min=floor)
    assert not bool(bad.any()), f"{name}: {int(bad.sum())} elements off, worst {float(diff.max()):.3g}"


def cast_like(values: np.ndarray | torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Float32 reference values cast once to the stored dtype, as the engine writes them."""
    t = torch.from_numpy(np.asarray(values, dtype=F32)) if isinstance(values, np.ndarray) else values.float()
    return t.reshape(like.shape).to(like.dtype)


# --------------------------------------------------------------------------- element-wise references (float32)


def _f32(t: torch.Tensor) -> list[np.float32]:
    return [F32(v) for v in t.float().reshape(-1).tolist()]


def task_vectors32(base: torch.Tensor, models: list[torch.Tensor]) -> list[list[np.float32]]:
    b = _f32(base)
    return [[F32(x - y) for x, y in zip(_f32(m), b, strict=True)] for m in models]


def magmax_ref(base: torch.Tensor, models: list[torch.Tensor], lam: float) -> np.ndarray:
    """theta_0 + lambda * tau_{t*}: per element, the last agent with the largest |tau| (float32)."""
    taus = task_vectors32(base, models)
    out = []
    for p, b in enumerate(_f32(base)):
        vals = [t[p] for t in taus]
        biggest = max(abs(v) for v in vals)
        chosen = [v for v in vals if abs(v) == biggest][-1]
        out.append(F32(b + F32(F32(chosen) * F32(lam))))
    return np.array(out, dtype=F32)


def consensus_ref(base: torch.Tensor, models: list[torch.Tensor], k: int, tall: list[float], lam: float) -> np.ndarray:
    """theta_0 + lambda * tau_MTL where at least k TALL masks |tau_t| > tall_t |tau_MTL - tau_t| hold (float32)."""
    taus = task_vectors32(base, models)
    out = []
    for p, b in enumerate(_f32(base)):
        vals = [t[p] for t in taus]
        total = F32(0.0)
        for v in vals:
            total = F32(total + v)
        votes = sum(1 for v, lt in zip(vals, tall, strict=True) if abs(v) > F32(abs(F32(total - v)) * F32(lt)))
        delta = F32(total * F32(lam)) if votes >= k else F32(0.0)
        out.append(F32(b + delta))
    return np.array(out, dtype=F32)


# --------------------------------------------------------------------------- SCE (float64, as mergekit writes it)


def sce_ref(base: torch.Tensor, models: list[torch.Tensor], select_topk: float) -> torch.Tensor:
    b = base.double()
    tvs = torch.stack([m.double() - b for m in models])
    if select_topk < 1:
        var = torch.var(tvs, dim=0, unbiased=False)
        k = int(int(torch.count_nonzero(var)) * select_topk) if select_topk > 0 else 0
        mask = torch.zeros_like(var)
        if k > 0:  # torch.topk picks among positions tied at the k-th value; the spec keeps them all
            kth = torch.topk(var.abs().view(-1), k=k).values[-1]
            mask = (var.abs() >= kth).double()
        tvs = tvs * mask[None]
    sign = tvs.sign()
    majority = (tvs.sum(0) >= 0).double() * 2 - 1
    erase = (sign == majority[None]).double()
    means = (tvs**2).reshape(tvs.shape[0], -1).mean(1)
    weights = torch.ones_like(means) / means.numel() if abs(float(means.sum())) < 1e-6 else means / means.sum()
    w = weights.reshape(-1, *([1] * (tvs.dim() - 1))) * erase
    return b + (tvs * w).sum(0) / w.sum(0).clamp(min=1e-6)


# --------------------------------------------------------------------------- spherical (float64, mergekit's steps)


def karcher_ref(xs: list[torch.Tensor], max_iter: int = 10, tol: float = 1e-5) -> torch.Tensor:
    if len(xs) == 1:
        return xs[0].double()
    vs = [x.double().reshape(-1) for x in xs]
    alphas = [1.0 / len(vs)] * len(vs)
    norms = [float(v.norm()) for v in vs]
    units = [v / n if n > 0 else torch.zeros_like(v) for v, n in zip(vs, norms, strict=True)]
    valid = [i for i, n in enumerate(norms) if n > tol]
    if not valid:
        return torch.zeros_like(xs[0], dtype=torch.float64)
    a = [alphas[i] / sum(alphas[j] for j in valid) for i in valid]
    us = [units[i] for i in valid]
    u = sum(ai * ui for ai, ui in zip(a, us, strict=True))
    u = us[0].clone() if float(u.norm()) < tol else u / u.norm()
    for _ in range(max_iter):
        step = torch.zeros_like(u)
        for ai, ui in zip(a, us, strict=True):
            dot = max(-1.0, min(1.0, float(u @ ui)))
            theta = math.acos(dot)
            if theta >= tol:
                step += ai * (theta / math.sin(theta)) * (ui - dot * u)
        size = float(step.norm())
        if size < tol:
            break
        u = math.cos(size) * u + math.sin(size) * step / size
        if float(u.norm()) > tol:
            u = u / u.norm()
    return (sum(ai * n for ai, n in zip(alphas, norms, strict=True)) * u).reshape(xs[0].shape)


def multislerp_ref(
    models: list[torch.Tensor], weights: list[float], base: torch.Tensor | None, normalize: bool = True
) -> torch.Tensor:
    eps = 1e-8
    if len(models) == 1:
        return models[0].double()
    x = torch.stack([m.double() for m in models])
    if base is not None:
        x = x - base.double()
    flat = x.reshape(x.shape[0], -1)
    w = torch.tensor(weights, dtype=torch.float64)
    w = w / w.sum() if normalize else w
    norms = flat.norm(dim=-1, keepdim=True)
    unit = flat / (norms + eps)
    mean = (unit * w[:, None]).sum(0)
    mean = mean / mean.norm()
    tangent = unit - (unit * mean).sum(-1, keepdim=True) * mean
    t = (tangent * w[:, None]).sum(0)
    size = t.norm() + eps
    res = (mean * torch.cos(size) + t * torch.sin(size) / size) * (norms.squeeze(-1) * w).sum()
    res = res.reshape(x.shape[1:])
    return res + base.double() if base is not None else res


def nuslerp_ref(t: float, v0: torch.Tensor, v1: torch.Tensor, flatten: bool, row_wise: bool) -> torch.Tensor:
    shape = v0.shape
    a, b = v0.double(), v1.double()
    if flatten:
        a, b = a.reshape(-1), b.reshape(-1)
    elif row_wise:
        a, b = a.transpose(0, -1), b.transpose(0, -1)
    au = a / a.norm(dim=-1, keepdim=True).clamp(min=1e-7)
    bu = b / b.norm(dim=-1, keepdim=True).clamp(min=1e-7)
    cos = (au * bu).sum(-1, keepdim=True).clamp(-1, 1)
    colinear = (1 - cos.square()) <= 1e-16  # mergekit 0.1.5
    theta = torch.acos(torch.where(colinear, 0, cos))
    res = (torch.sin((1 - t) * theta) * a + torch.sin(t * theta) * b) / torch.sin(theta)
    res = torch.where(colinear, (1 - t) * a + t * b, res)
    if row_wise and not flatten:
        res = res.transpose(0, -1)
    return res.reshape(shape)
