"""Steps after any method's kernel: they rewrite the merged delta of the tensors they apply to (no torch here).

A method's kernel returns the merged delta ``tau*`` of a chunk; a *post step* then maps ``(chunk, tau*)`` to a
new ``tau*`` before the driver adds the base and casts. Each step brings parameters that every method accepts
(``registry.with_post_steps`` appends them to each entry, skipping names the method already has), a test of
whether a tensor's parameters turn it on, and, when it needs whole matrices, a ``WholeTensor`` (the plan then
makes those tensors one chunk, like an SVD method's). Steps run in the order of ``POST_STEPS``.

SVC, spectral calibration (arXiv 2602.05536, fusion_bench's ``singular_value_calibration``), is the first:
``calibrate: svc`` calibrates every 2-D merged delta (``calibration.svc``; embeddings and LM head unless
``svd_embeddings`` is false), with ``svc_alpha`` defaulting per base method as fusion_bench's configs do
(``SVC_ALPHA``; 0.1 for any other method).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from agentmerge.methods.spec import Lazy, Param, Params, WholeTensor
from agentmerge.methods.spectral_rules import SVD_EMBEDDINGS, held, is_matrix, one_svd

if TYPE_CHECKING:
    import torch

    from agentmerge.methods.spec import Chunk


@dataclass(frozen=True)
class PostStep:
    """One step after the kernel: its parameters, when it is on, which tensors it needs whole, what it does."""

    name: str
    params: Callable[[str], tuple[Param, ...]]  # method name -> the step's parameters (defaults may depend on it)
    on: Callable[[Params], bool]  # whether a tensor's resolved parameters turn the step on
    applies: Callable[[str, tuple[int, ...], Params], bool]  # (name, shape, params): whether it changes this tensor
    apply: Callable[[Chunk, torch.Tensor], torch.Tensor]  # (chunk, merged delta) -> new merged delta (a ``Lazy``)
    whole: WholeTensor | None = None  # the tensors it applies to are merged whole (one chunk)
    needs_base: bool = True  # it reads the task vectors against a real base model

    def active(self, name: str, shape: tuple[int, ...], params: Params) -> bool:
        """Whether this step runs on tensor ``name``."""
        return self.on(params) and self.applies(name, shape, params)


# --------------------------------------------------------------------------- SVC

# fusion_bench's SVC configs (config/method/singular_value_calibration/*.yaml): alpha per base method
SVC_ALPHA: Mapping[str, float] = MappingProxyType({"tsv": 1.0, "iso_c": 0.1, "iso_cts": 0.2})
SVC_ALPHA_DEFAULT = 0.1  # task arithmetic, TIES, DARE, the average, and every method the configs do not name


def svc_params(method: str) -> tuple[Param, ...]:
    return (
        Param(
            "calibrate",
            "none",
            "svc: after the method, spectral calibration of every 2-D merged delta (SVC, arXiv 2602.05536); "
            "none: the method's result as it is",
            choices=("none", "svc"),
        ),
        Param(
            "svc_alpha",
            SVC_ALPHA.get(method, SVC_ALPHA_DEFAULT),
            "SVC's alpha: gamma_r = N / sum_i max(alpha, s_r^i) per singular direction of the merged delta "
            "(default per base method as fusion_bench: 1.0 tsv, 0.2 iso_cts, 0.1 otherwise)",
            low=0.0,
            low_open=True,
        ),
        SVD_EMBEDDINGS,
    )


SVC = PostStep(
    name="svc",
    params=svc_params,
    on=lambda params: params.get("calibrate", "none") == "svc",
    applies=is_matrix,
    apply=Lazy("agentmerge.methods.calibration:svc"),
    whole=WholeTensor(wanted=is_matrix, svds=one_svd, copies=held(6.0)),
)

POST_STEPS: tuple[PostStep, ...] = (SVC,)


def step_params(method: str, own: Iterable[str]) -> tuple[Param, ...]:
    """The parameters every post step adds to ``method`` (whose own parameter names are ``own``), each once."""
    seen = set(own)
    out = []
    for step in POST_STEPS:
        for p in step.params(method):
            if p.name not in seen:
                seen.add(p.name)
                out.append(p)
    return tuple(out)


def step_param_names() -> frozenset[str]:
    """Every post-step parameter name (mergekit has none of them)."""
    return frozenset(p.name for step in POST_STEPS for p in step.params(""))


def active_steps(name: str, shape: tuple[int, ...], params: Params) -> tuple[PostStep, ...]:
    """The post steps that run on this tensor, in order."""
    return tuple(s for s in POST_STEPS if s.active(name, shape, params))


def check_base(method: str, param_sets: Iterable[Mapping[str, Any]], has_base: bool) -> None:
    """A step that reads task vectors needs a base model: refuse it without one (ValueError)."""
    if has_base:
        return
    for params in param_sets:
        for step in POST_STEPS:
            if step.needs_base and step.on(params):
                raise ValueError(f"{method}: the {step.name} step reads task vectors; it needs a base (base: PATH)")
