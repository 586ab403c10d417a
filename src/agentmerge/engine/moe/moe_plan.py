"""The MoE output planned before any weight is read: every tensor, its dtype and shape, and where it comes from.

Sources: ``static`` (the static merge's tensor of the same name: attention, embeddings, norms, the head),
``expert`` (agent e's MLP projection; ``down_proj`` scaled by ``1 - shared_weight`` when a shared expert
takes its share), ``shared`` (the base's or the static merge's MLP projection, ``down_proj`` scaled by
``2 * shared_weight``: the shared expert's gate is written as zeros, and ``sigmoid(0) = 1/2``), ``router``
(computed per layer, ``router.py``) and ``zeros`` (the shared expert's gate; an empty shared expert).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from agentmerge.engine.moe.arch import ARCHITECTURES, PROJECTIONS, MoeNames, mlp_tensor
from agentmerge.errors import ConfigError, MergeError
from agentmerge.io.formats.tensorfile import TensorInfo
from agentmerge.io.output.shards import PlannedTensor

_LAYER = re.compile(r"^(?P<prefix>.*\.layers\.(?P<layer>\d+)\.)")


@dataclass(frozen=True)
class Slot:
    """One output tensor and where its values come from."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    source: str  # static | expert | shared | router | zeros
    tensor: str = ""  # the dense tensor read (static, expert, shared)
    index: int = -1  # the expert
    scale: float = 1.0

    @property
    def planned(self) -> PlannedTensor:
        return PlannedTensor(self.name, self.dtype, self.shape)


@dataclass
class LayerPlan:
    layer: int
    prefix: str
    static: list[Slot] = field(default_factory=list)  # attention and norms
    router: Slot | None = None
    experts: list[list[Slot]] = field(default_factory=list)  # [expert][projection]
    shared: list[Slot] = field(default_factory=list)  # projections, then the gate (Qwen2-MoE)


@dataclass(frozen=True)
class MoePlan:
    names: MoeNames
    outer: list[Slot]  # embeddings, final norm, head
    layers: list[LayerPlan]

    @property
    def slots(self) -> list[Slot]:
        out = list(self.outer)
        for layer in self.layers:
            assert layer.router is not None
            out += [*layer.static, layer.router, *(s for e in layer.experts for s in e), *layer.shared]
        return out

    @property
    def nbytes(self) -> int:
        return sum(s.planned.nbytes for s in self.slots)


def check_mlp_shapes(base: Mapping[str, TensorInfo], agents: list[tuple[str, Mapping[str, TensorInfo]]]) -> None:
    """Every agent's MLP projections have the base's shapes (an expert replaces the base's MLP)."""
    for name, info in base.items():
        if mlp_tensor(name) is None:
            continue
        for path, tensors in agents:
            other = tensors.get(name)
            if other is None or other.shape != info.shape:
                got = "no such tensor" if other is None else f"shape {list(other.shape)}"
                raise MergeError(
                    f"{path}: MLP tensor {name!r} has {got}, the base has {list(info.shape)}; the experts of one MoE "
                    "must share the base's MLP shapes"
                )


def make_plan(
    static: Mapping[str, TensorInfo], names: MoeNames, n: int, shared: str, weight: float, dtype: torch.dtype | None
) -> MoePlan:
    """The output of ``n`` experts over the dense tensors ``static`` (the static merge's, or the base's for a dry
    run); ``dtype`` overrides the stored dtypes."""
    if shared != "none" and not names.has_shared:
        raise ConfigError(
            f"shared_expert: {ARCHITECTURES[names.family]} has no shared expert; it works with Qwen2 bases "
            "(Qwen2-MoE outputs)"
        )
    outer: list[Slot] = []
    layers: dict[int, LayerPlan] = {}
    for name, info in static.items():
        kind = (dtype or info.dtype) if info.dtype.is_floating_point else info.dtype
        found = mlp_tensor(name)
        m = _LAYER.match(name)
        if m is None:
            outer.append(Slot(name, kind, info.shape, "static", name))
            continue
        layer = layers.setdefault(int(m["layer"]), LayerPlan(int(m["layer"]), m["prefix"]))
        if found is None:
            layer.static.append(Slot(name, kind, info.shape, "static", name))
    for layer in layers.values():
        _moe_slots(layer, static, names, n, shared, weight, dtype)
    return MoePlan(names, outer, [layers[k] for k in sorted(layers)])


def _moe_slots(
    layer: LayerPlan,
    static: Mapping[str, TensorInfo],
    names: MoeNames,
    n: int,
    shared: str,
    weight: float,
    dtype: torch.dtype | None,
) -> None:
    p = layer.prefix
    dense = {proj: static.get(f"{p}mlp.{proj}.weight") for proj in PROJECTIONS}
    if any(info is None for info in dense.values()):
        raise MergeError(f"layer {layer.layer}: no gate_proj / up_proj / down_proj MLP weights to turn into experts")
    gate = dense["gate_proj"]
    assert gate is not None
    kind, hidden = dtype or gate.dtype, gate.shape[1]
    layer.router = Slot(names.gate(p), kind, (n, hidden), "router")
    share = weight if shared != "none" else 0.0
    for e in range(n):
        layer.experts.append(
            [
                Slot(
                    names.expert(p, e, proj),
                    kind,
                    info.shape,
                    "expert",
                    f"{p}mlp.{proj}.weight",
                    e,
                    _scale(proj, 1 - share),
                )
                for proj, info in dense.items()
                if info is not None
            ]
        )
    if names.has_shared:
        layer.shared = _shared_slots(p, dense, names, kind, shared, share)


def _scale(proj: str, down: float) -> float:
    return down if proj == "down_proj" else 1.0


def _shared_slots(
    p: str, dense: Mapping[str, TensorInfo | None], names: MoeNames, kind: torch.dtype, shared: str, share: float
) -> list[Slot]:
    out = []
    for proj, info in dense.items():
        assert info is not None
        if shared == "none":  # an empty shared expert (intermediate size 0): it adds nothing
            shape = (info.shape[0], 0) if proj == "down_proj" else (0, info.shape[1])
            out.append(Slot(names.shared(p, proj), kind, shape, "zeros"))
        else:
            out.append(
                Slot(
                    names.shared(p, proj),
                    kind,
                    info.shape,
                    "shared",
                    f"{p}mlp.{proj}.weight",
                    -1,
                    _scale(proj, 2 * share),
                )
            )
    hidden = dense["gate_proj"].shape[1] if dense["gate_proj"] is not None else 0
    out.append(Slot(names.shared_gate(p), kind, (1, hidden), "zeros"))
    return out


def shared_size(static: Mapping[str, TensorInfo], shared: str) -> int:
    """The shared expert's intermediate size: the dense MLP's, or 0 without a shared expert."""
    if shared == "none":
        return 0
    sizes = {info.shape[0] for name, info in static.items() if name.endswith("mlp.gate_proj.weight")}
    return max(sizes) if sizes else 0
