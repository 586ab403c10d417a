"""Steps after any method's kernel that rewrite a tensor's merged delta from its task vectors (no torch here).

A method's kernel returns the merged delta ``tau*`` of a chunk; a *post-step* then maps ``(chunk, tau*)`` to a
new ``tau*`` before the driver adds the base and casts. A step's parameters are fields of every parameter
record (``params.MethodParams``, listed in ``params.POST_STEP_PARAMS``), so every method takes them; here it
says when a tensor's parameters turn it on, which tensors it changes and, when it needs whole matrices, a
``WholeTensor`` (the plan then makes those tensors one chunk, like an SVD method's). The plan names the steps
each tensor runs (``TensorJob.steps``) and the driver applies them in the order of ``POST_STEPS``, by name,
on the reference path. LiNeS, a per-layer scale with one alpha for the whole model, comes after them
(``engine.lines_pass``).

SVC, spectral calibration (arXiv 2602.05536, fusion_bench's ``singular_value_calibration``), is the first:
``calibrate: svc`` calibrates every 2-D merged delta (``calibration.svc``; embeddings and LM head unless
``svd_embeddings`` is false), with ``svc_floor`` defaulting per base method as fusion_bench's configs do
(the method's record may redeclare its default: ``methods.svd``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from agentmerge.methods.hooks import WholeTensor
from agentmerge.methods.matrices import SVC_WHOLE, is_matrix
from agentmerge.methods.params import Params
from agentmerge.methods.spec import Lazy

if TYPE_CHECKING:
    import torch

    from agentmerge.methods.spec import Chunk


@dataclass(frozen=True)
class PostStep:
    """One step after the kernel: when it is on, which tensors it changes and needs whole, what it does."""

    name: str
    on: Callable[[Params], bool]  # whether a tensor's resolved parameters turn the step on
    applies: Callable[[str, tuple[int, ...], Params], bool]  # (name, shape, params): whether it changes this tensor
    apply: Callable[[Chunk, torch.Tensor], torch.Tensor]  # (chunk, merged delta) -> new merged delta (a ``Lazy``)
    whole: WholeTensor | None = None  # the tensors it applies to are merged whole (one chunk)
    needs_base: bool = True  # it reads the task vectors against a real base model

    def active(self, name: str, shape: tuple[int, ...], params: Params) -> bool:
        """Whether this step runs on tensor ``name``."""
        return self.on(params) and self.applies(name, shape, params)


SVC = PostStep(
    name="svc",
    on=lambda params: params.get("calibrate", "none") == "svc",
    applies=is_matrix,
    apply=Lazy("agentmerge.methods.svc:svc"),
    whole=SVC_WHOLE,
)

POST_STEPS: tuple[PostStep, ...] = (SVC,)
STEPS: Mapping[str, PostStep] = MappingProxyType({s.name: s for s in POST_STEPS})


def active_steps(name: str, shape: tuple[int, ...], params: Params) -> tuple[PostStep, ...]:
    """The post-steps that run on this tensor, in order."""
    return tuple(s for s in POST_STEPS if s.active(name, shape, params))


def check_base(method: str, param_sets: Iterable[Mapping[str, Any]], has_base: bool) -> None:
    """A step that reads task vectors needs a base model: refuse it without one (ValueError)."""
    if has_base:
        return
    for params in param_sets:
        for step in POST_STEPS:
            if step.needs_base and step.on(params):
                raise ValueError(f"{method}: the {step.name} step reads task vectors; it needs a base (base: PATH)")
