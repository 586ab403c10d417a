"""How one of mergekit's methods maps onto ours (no torch): each method's module declares its own ``MethodMap``.

The mergekit config reader (``config.mergekit``) and writer (``config.mergekit_export``) read them through
``config.mergekit_names.MERGEKIT``, collected from the registry's entries (``Method.mergekit``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

Scalar = bool | int | float | str


@dataclass(frozen=True)
class MethodMap:
    """How one mergekit method maps onto ours.

    ``name``: mergekit's name (``merge_method``). ``target``: our method name. ``fixed``: parameters implied by
    the mergekit method itself.
    ``defaults``: mergekit's defaults (its names and values, as in mergekit 0.1.5), applied when the config
    leaves a parameter out, each with a note, so a config means what it means in mergekit.
    ``normalize`` / ``rescale``: mergekit's defaults for those flags (None: it has no such flag);
    ``ours_normalize``: what our method computes (weighted mean: True, weighted sum: False).
    ``convert``: mergekit name -> (our name, a, b), our value = a + b * mergekit's value.
    ``endpoints``: the base model becomes the first of two models (SLERP: t = 0 gives the base).
    ``ours_only``: our parameters the mergekit method does not have; what mergekit computes is our default,
    so a config exports to mergekit only with them at their defaults.
    """

    name: str  # mergekit's name of the method
    target: str  # ours
    fixed: Mapping[str, Scalar] = field(default_factory=dict)
    defaults: Mapping[str, Scalar] = field(default_factory=dict)
    normalize: bool | None = None
    ours_normalize: bool | None = None
    rescale: bool | None = None
    convert: Mapping[str, tuple[str, float, float]] = field(default_factory=dict)
    endpoints: bool = False
    uses_base: bool = True  # False: mergekit ignores base_model (an entry of models that is the base is averaged)
    ours_only: tuple[str, ...] = ()
    base_joins: bool = False  # mergekit's planner adds base_model as one more input model (karcher)
    weights_required: bool = False
