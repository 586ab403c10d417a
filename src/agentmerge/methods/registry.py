"""Every merge method in one list: each entry (a ``Method``) is defined in its method's own package.

``METHODS`` is the only registry: the config, the CLI (`agentmerge methods`), the driver and the mergekit
translation all read it. A method's package holds everything about it: its typed parameter record, its entry
(kernel, hooks, compiled form, paper) and its mergekit names in ``__init__.py`` (no torch), its reference kernel in
``kernels.py``, its compiled form in ``compiled.py``. The entries name kernels, hooks and compiled forms as
``Lazy`` references (``Lazy("agentmerge.methods.ties.kernels:ties")``), imported on first use, so this list and
everything that only reads it (`agentmerge methods`, config checks) load without torch or numba. Adding a method
is one new package and one line below (docs/engine.md, "Adding a method").
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import agentmerge.methods.arithmetic as arithmetic
import agentmerge.methods.field as field
import agentmerge.methods.fisher as fisher
import agentmerge.methods.model_stock as model_stock
import agentmerge.methods.ram as ram
import agentmerge.methods.slerp as slerp
import agentmerge.methods.spherical as spherical
import agentmerge.methods.svd as svd
import agentmerge.methods.ties as ties
from agentmerge.methods.method import Method

ALL: tuple[Method, ...] = (
    ram.RAM,
    ram.RAM_PLUS,
    ram.RAM_FISHER,
    ram.UNIQUE_ONLY,
    arithmetic.LINEAR,
    arithmetic.TASK_ARITHMETIC,
    ties.TIES,
    ties.DARE_LINEAR,
    ties.DARE_TIES,
    ties.BREADCRUMBS,
    ties.DELLA,
    model_stock.MODEL_STOCK,
    slerp.SLERP,
    ties.RAM_TIES,
    fisher.FISHER,
    field.MAGMAX,
    field.CONSENSUS,
    field.SCE,
    spherical.KARCHER,
    spherical.MULTISLERP,
    spherical.NUSLERP,
    svd.TSV,
    svd.ISO_C,
    svd.ISO_CTS,
    svd.CART,
    svd.RESMERGE,
)

METHODS: Mapping[str, Method] = MappingProxyType({m.name: m for m in ALL})
