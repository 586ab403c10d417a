"""mergekit's method names mapped onto ours: ``MERGEKIT``, collected from each method's own ``MethodMap``.

A method declares its mergekit names in its own module (``Method.mergekit``, e.g. ``methods/ties/__init__.py``);
this module gathers them for the mergekit config reader (``mergekit``) and writer (``mergekit_export``), with
mergekit's methods that map to a method this version does not implement, and those we have no counterpart for.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from agentmerge.methods.mergekit_map import MethodMap, Scalar
from agentmerge.methods.registry import METHODS

__all__ = ["MERGEKIT", "MERGEKIT_WITHOUT_COUNTERPART", "MethodMap", "Scalar"]

# mergekit methods whose counterpart would be a variant we do not implement (the reader says so by name)
_NOT_IMPLEMENTED = (
    MethodMap("breadcrumbs_ties", "breadcrumbs_ties", normalize=False, rescale=False),
    MethodMap("della_linear", "della_linear", normalize=False, rescale=True),
)

MERGEKIT: Mapping[str, MethodMap] = MappingProxyType(
    {mm.name: mm for mm in (*(mm for m in METHODS.values() for mm in m.mergekit), *_NOT_IMPLEMENTED)}
)

# mergekit methods we know of but have no counterpart for (a clearer message than "unknown").
MERGEKIT_WITHOUT_COUNTERPART = ("nearswap", "arcee_fusion", "passthrough")
