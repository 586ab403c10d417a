"""The merge methods: one package per method (or family), each holding everything about it, and what they share.

A method's package (``ram/``, ``arithmetic/``, ``ties/``, ``model_stock/``, ``slerp/``, ``fisher/``, ``field/``,
``spherical/``, ``svd/``) holds its typed parameter record, its registry entry and its mergekit names in
``__init__.py`` (no torch), its reference kernel in ``kernels.py`` and its compiled form in ``compiled.py``;
``registry.py`` lists the entries. Below them, shared and never importing a method: the types between driver and
kernels (``spec``), typed parameters (``params``), hooks and the entry type (``hooks``, ``method``,
``mergekit_map``), tensor primitives (``deltas``, ``masks``, ``stats``, ``groups``, ``exactsum``, ``linalg``,
``matrices``, ``lowrank``), the post-steps of every method (``lines``, ``poststeps``, ``svc``) and the shared
compiled loops (``fused/``). Pure tensor math: nothing here reads or writes a file.

The names below are the package's public surface (torch-free): other layers import records from here.
"""

from agentmerge.methods.arithmetic import TaskArithmeticParams
from agentmerge.methods.field import ConsensusParams, MagMaxParams, SceParams
from agentmerge.methods.fisher import FisherParams
from agentmerge.methods.mergekit_map import MethodMap
from agentmerge.methods.method import Method
from agentmerge.methods.params import POST_STEP_NAMES, POST_STEP_PARAMS, MethodParams, Param, Params, ParamValue
from agentmerge.methods.ram import RamFisherParams, RamParams, RamPlusParams, UniqueOnlyParams, paper_scale
from agentmerge.methods.registry import METHODS
from agentmerge.methods.slerp import SlerpParams
from agentmerge.methods.spec import MaskedParams
from agentmerge.methods.spherical import KarcherParams, MultiSlerpParams, NuSlerpParams
from agentmerge.methods.svd import CartParams, IsoCParams, IsoCtsParams, ResMergeParams, TsvParams
from agentmerge.methods.ties import (
    BreadcrumbsParams,
    DareLinearParams,
    DareTiesParams,
    DellaParams,
    RamTiesParams,
    TiesParams,
)

__all__ = [
    "METHODS",
    "POST_STEP_NAMES",
    "POST_STEP_PARAMS",
    "BreadcrumbsParams",
    "CartParams",
    "ConsensusParams",
    "DareLinearParams",
    "DareTiesParams",
    "DellaParams",
    "FisherParams",
    "IsoCParams",
    "IsoCtsParams",
    "KarcherParams",
    "MagMaxParams",
    "MaskedParams",
    "Method",
    "MethodMap",
    "MethodParams",
    "MultiSlerpParams",
    "NuSlerpParams",
    "Param",
    "ParamValue",
    "Params",
    "RamFisherParams",
    "RamParams",
    "RamPlusParams",
    "RamTiesParams",
    "ResMergeParams",
    "SceParams",
    "SlerpParams",
    "TaskArithmeticParams",
    "TiesParams",
    "TsvParams",
    "UniqueOnlyParams",
    "paper_scale",
]
