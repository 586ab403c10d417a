"""Groups of tensors: the layer and module type of a tensor name, and RAM+'s rescaling groups.

One classifier serves the probe's per-layer / per-module breakdown and RAM+'s grouped rescaling
(``scope``), so both always put a tensor in the same group. RAM+ counts its overlap-unique ratio
``rho_i = |S_i| / |U_i|`` over the tensors of one group ``G``:

    rho_i(G) = sum_{t in G} sum_{k>=1} H_t[i, k] / sum_{t in G} H_t[i, 0]

with ``H_t`` tensor t's overlap histogram, and scales agent i's unique updates in ``G`` by
``lambda_i(G)``. The group of a tensor, by ``scope``:

- ``global``: one group, the whole model (``model``); ``tensor``: each tensor alone (its name);
- ``layer``: the transformer layer index parsed from the name (``layer 3``); a tensor outside numbered
  layers (embeddings, final norm, head) is a group of its own (its name);
- ``module``: ``module_type`` (attention, mlp, embedding, norm, other);
- ``pattern``: the first of the ``groups`` patterns that matches the name (the pattern's text), else ``rest``.

``groups`` is a whitespace-separated list of patterns (tensor names hold no spaces); a pattern is an
fnmatch glob matched against the whole name (as ``overrides`` are), or, prefixed with ``re:``, a Python
regular expression searched in the name. Pure Python: no torch, so configs are checked without it.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Mapping

from agentmerge.methods.spec import ParamValue

MODULE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("embedding", re.compile(r"embed|wte|wpe|lm_head|word_embeddings|tok_embeddings|\boutput\.weight")),
    ("norm", re.compile(r"norm|\bln_|\bln\d|layer_norm")),
    ("attention", re.compile(r"attn|attention|[qkvo]_proj|qkv|query|key|value")),
    ("mlp", re.compile(r"mlp|ffn|feed_forward|gate_proj|up_proj|down_proj|fc\d|c_fc|c_proj|experts")),
)
_LAYER = re.compile(r"(?:^|\.)(?:layers|layer|h|blocks|block)\.(\d+)\.")
REGEX_PREFIX = "re:"
REST = "rest"  # the group of tensors no pattern matches
GROUPED_SCOPES = ("layer", "module", "pattern")  # scopes whose histograms are summed over a group of tensors


def module_type(name: str) -> str:
    """``model.layers.3.self_attn.q_proj.weight`` -> ``attention`` (embedding, norm, attention, mlp, other)."""
    lowered = name.lower()
    return next((kind for kind, pat in MODULE_PATTERNS if pat.search(lowered)), "other")


def layer_of(name: str) -> str:
    """``model.layers.3.mlp.up_proj.weight`` -> ``"3"``; tensors outside numbered blocks -> ``"-"``."""
    m = _LAYER.search(name)
    return m.group(1) if m else "-"


def split_patterns(text: str) -> tuple[str, ...]:
    """The ``groups`` parameter -> its patterns, in order."""
    return tuple(text.split())


@functools.cache
def _regex(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as e:
        raise ValueError(
            f"groups: pattern {REGEX_PREFIX}{pattern!r} is not a valid regular expression ({e}); fix or drop it"
        ) from None


def matches(pattern: str, name: str) -> bool:
    """Whether tensor ``name`` matches one ``groups`` pattern (glob, or ``re:`` regex searched in the name)."""
    if pattern.startswith(REGEX_PREFIX):
        return _regex(pattern[len(REGEX_PREFIX) :]).search(name) is not None
    return fnmatch.fnmatchcase(name, pattern)


def check_patterns(text: str) -> None:
    """Every ``re:`` pattern of ``groups`` compiles; else ``ValueError`` naming it."""
    for pattern in split_patterns(text):
        if pattern.startswith(REGEX_PREFIX):
            _regex(pattern[len(REGEX_PREFIX) :])


def group_of(name: str, params: Mapping[str, ParamValue]) -> str:
    """The rescaling group of tensor ``name`` under its ``scope`` (and ``groups``) parameters."""
    scope = str(params.get("scope", "global"))
    if scope == "global":
        return "model"
    if scope == "layer":
        layer = layer_of(name)
        return name if layer == "-" else f"layer {layer}"
    if scope == "module":
        return module_type(name)
    if scope == "pattern":
        return next((p for p in split_patterns(str(params.get("groups", ""))) if matches(p, name)), REST)
    return name  # scope: tensor
