"""The merge methods: the types between driver and kernels (``spec``), a method's entry (``method``: its typed
parameters ``params`` / ``records``, its hooks ``hooks``), the one table of methods (``registry``), one reference
kernel module per family (``ram``, ``baselines``), what they report (``scales``), their tensor primitives
(``deltas``, ``masks``, ``stats``, ``groups``) and compiled twins (``fused``). Pure tensor math: nothing here
reads or writes a file.
"""

from agentmerge.methods.method import Method
from agentmerge.methods.params import POST_STEP_NAMES, POST_STEP_PARAMS, MethodParams, Param, Params, ParamValue
from agentmerge.methods.records import RamPlusParams
from agentmerge.methods.registry import METHODS

__all__ = [
    "METHODS",
    "POST_STEP_NAMES",
    "POST_STEP_PARAMS",
    "Method",
    "MethodParams",
    "Param",
    "ParamValue",
    "Params",
    "RamPlusParams",
]
