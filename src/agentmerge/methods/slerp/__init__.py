"""SLERP: spherical interpolation of two models' weights per tensor. Record, mergekit name and entry
(no torch); kernel in ``kernels.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentmerge.methods.hooks import STAT_BLOCKS, Needs, TensorPrepare
from agentmerge.methods.mergekit_map import MethodMap
from agentmerge.methods.method import Method
from agentmerge.methods.params import MethodParams, Param, use
from agentmerge.methods.spec import Lazy


@dataclass(frozen=True, eq=False)
class SlerpParams(MethodParams):
    t: float = use(Param("t", 0.5, "interpolation: 0 gives the first model, 1 the second", 0.0, 1.0))
    colinear: float = use(Param("colinear", 0.9995, "|cos| above which plain linear interpolation is used", 0.0, 1.0))


# mergekit's names for these methods (``agentmerge.config.mergekit_names`` collects them)
MERGEKIT_SLERP = MethodMap("slerp", "slerp", endpoints=True, ours_only=("colinear",))  # mergekit's threshold: 0.9995

# --------------------------------------------------------------------------- the entries

SLERP = Method(
    "slerp",
    "spherical interpolation of two models' weights per tensor (lerp when nearly colinear)",
    Lazy("agentmerge.methods.slerp.kernels:slerp"),
    SlerpParams,
    Needs(base=False, models=(2, 2), chunk_multiple=STAT_BLOCKS),
    passes=(TensorPrepare(Lazy("agentmerge.methods.slerp.kernels:slerp_prepare")),),
    mergekit=(MERGEKIT_SLERP,),
)
