"""LiNeS depth scaling (Wang et al., ICLR 2025, arXiv 2410.17146): the merged task vector scaled by layer depth.

A post-step on any method's merged task vector tau* (every method has one: the merged chunk minus the base,
in float32, so both kernel paths give the same bits). The tensor of decoder layer l (of L) is written as

    theta = theta_0 + lambda(l) * tau*,      lambda(l) = alpha + beta * l / (L - 1)

with l read from the name by ``\\.layers\\.(\\d+)\\.`` (the authors' rule ``.{i}.`` gives the same index on dense
Hugging Face decoders, and can match an expert index on MoE models); tensors outside the decoder layers
(embeddings, final norm, lm_head) get lambda = alpha, as in the reference. L is the number of decoder
layers of the checkpoint (largest index + 1); LiNeS needs L >= 2 (the reference divides by L - 1).

alpha is the reference's multi-task value unless ``lines_shallow`` sets one:

    alpha = ||sum_i tau_i||_1 / (N ||tau*||_1)          (both L1 norms over every merged tensor)

which makes the shallowest layers move like the plain average of the task vectors. For task arithmetic
with equal model weights w it is 1 / (N lambda w) (1/N at lambda = w = 1, the reference's value) and for the
linear average 1; any other method needs a pre-pass over the whole model (``lines_pass``). beta has no
data-free default (the authors tune it over 0.1 .. 1.0); ``lines_beta`` = 0 and ``lines_shallow`` = 0 leave
the method untouched. Parameters only here; the passes and the scaling live in ``lines_pass`` (torch).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from fractions import Fraction

from agentmerge.errors import MergeError
from agentmerge.methods.params import LINES_BETA, LINES_SHALLOW, MethodParams, Params

LAYER = re.compile(r"\.layers\.(\d+)\.")

LINES_PARAMS = (LINES_BETA, LINES_SHALLOW)  # fields of every method's record (``params.MethodParams``)
LINES_NAMES = tuple(p.name for p in LINES_PARAMS)


def lines_on(params: Params) -> bool:
    """Whether a tensor's parameters ask for depth scaling."""
    p = MethodParams.of(params)
    return p.lines_beta > 0.0 or p.lines_shallow > 0.0


def auto_alpha(params: Params) -> bool:
    """Whether a tensor scales with the reference's alpha (LiNeS on, ``lines_shallow`` left at 0)."""
    return lines_on(params) and MethodParams.of(params).lines_shallow == 0.0


def layer_of(name: str) -> int | None:
    """The decoder-layer index of a tensor name (``model.layers.3.mlp...`` -> 3), None outside the layers."""
    found = LAYER.search(name)
    return int(found.group(1)) if found else None


def layer_count(names: Iterable[str]) -> int:
    """L: the number of decoder layers (largest index + 1; 0 when no name has one)."""
    return max((i for i in map(layer_of, names) if i is not None), default=-1) + 1


def depth_scale(name: str, layers: int, alpha: float, beta: float) -> float:
    """``alpha + beta * l / (L - 1)`` for the tensor ``name`` (``alpha`` outside the layers)."""
    layer = layer_of(name)
    if layer is None or beta == 0.0:
        return alpha
    return alpha + beta * layer / (layers - 1)


def check_layers(layers: int, where: str) -> None:
    """LiNeS divides by L - 1: a checkpoint with fewer than two decoder layers is refused (``MergeError``)."""
    if layers < 2:
        raise MergeError(
            f"{where}: LiNeS (lines_beta / lines_shallow) scales by decoder-layer depth, but the checkpoint has "
            f"{layers} layer(s) named '.layers.N.'; remove lines_beta and lines_shallow"
        )


def closed_form_alpha(n_models: int, multiples: Collection[Fraction | None]) -> float | None:
    """The reference's alpha ``1 / (N c)`` when ``tau* = c sum_i tau_i`` with one c on every tensor, ``multiples``
    each tensor's c as its record gives it (``MethodParams.sum_multiple``: task arithmetic's ``scale * w`` with
    equal model weights w, the linear average's 1/N); None when a tensor has none or they differ."""
    if len(multiples) != 1:
        return None
    c = next(iter(multiples))
    return None if c is None or c == 0 else float(Fraction(1) / (n_models * c))
