"""Reference kernel of SLERP.

Two models A, B: ``omega = arccos(<A, B> / (|A| |B|))`` over the whole tensor's weights;
``theta = sin((1-t) omega)/sin(omega) A + sin(t omega)/sin(omega) B``, and ``(1 - t) A + t B`` when
``|cos omega| > colinear`` or a norm is 0. ``t = 0`` / ``t = 1`` return A / B exactly.
"""

from __future__ import annotations

import math

import torch

from agentmerge.methods.slerp import SlerpParams
from agentmerge.methods.spec import Chunk
from agentmerge.methods.stats import gram_prepare, tensor_gram


def _endpoints(c: Chunk) -> torch.Tensor:
    """``[2, E]`` the two models' weights."""
    return c.base[None, :] + c.tau


def slerp(c: Chunk) -> torch.Tensor:
    p = SlerpParams.of(c.params)
    t = p.t
    if t == 0.0:
        return c.tau[0].clone()
    if t == 1.0:
        return c.tau[1].clone()
    g = tensor_gram(c, _endpoints)
    a, b = _endpoints(c)
    na, nb = math.sqrt(float(g[0, 0])), math.sqrt(float(g[1, 1]))
    cos = float(g[0, 1]) / (na * nb) if na > 0 and nb > 0 else 1.0
    merged: torch.Tensor
    if abs(cos) > p.colinear:
        merged = (1.0 - t) * a + t * b
    else:
        omega = math.acos(max(-1.0, min(1.0, cos)))
        s = math.sin(omega)
        merged = (math.sin((1.0 - t) * omega) / s) * a + (math.sin(t * omega) / s) * b
    return merged - c.base


slerp_prepare = gram_prepare(_endpoints)
