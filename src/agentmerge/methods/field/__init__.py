"""The field's elementwise methods: MagMax, Consensus TA, SCE. Records, mergekit name and entries (no torch);
kernels in ``kernels.py``, compiled forms in ``compiled.py``. (The spherical methods: ``methods.spherical``.)

Defaults are the references' (``../shared/field-methods.md``): MagMax's lambda 0.5 (the authors'), the
data-free placeholders of Consensus (k 2, TALL lambda 0.6, lambda 0.3), mergekit's for the rest. Pure Python:
no torch, so listing methods and checking configs stay fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from agentmerge.methods.hooks import STAT_BLOCKS, Needs, TensorPrepare
from agentmerge.methods.mergekit_map import MethodMap
from agentmerge.methods.method import Method
from agentmerge.methods.params import MethodParams, Param, use
from agentmerge.methods.spec import Lazy


@dataclass(frozen=True, eq=False)
class MagMaxParams(MethodParams):
    output_scale: ClassVar[str | None] = "scale"
    scale: float = use(
        Param(
            "scale",
            0.5,
            "scaling coefficient of the selected task vector (the authors' lambda 0.5; lambda still accepted)",
            tune="the selected updates are not averaged; tune scale on validation data like task arithmetic's",
            aliases=("lambda",),
        )
    )


@dataclass(frozen=True, eq=False)
class ConsensusParams(MethodParams):
    output_scale: ClassVar[str | None] = "scale"
    k: int = use(
        Param("k", 2, "an element is kept when at least k agents' TALL masks hold (0: task arithmetic)", low=0)
    )
    tall_lambda: float = use(
        Param(
            "tall_lambda",
            0.6,
            "TALL mask of agent t: |tau_t| > tall_lambda * |sum_i tau_i - tau_t| (the authors tune it per task)",
            low=0.0,
            per_model=True,
        )
    )
    scale: float = use(
        Param(
            "scale",
            0.3,
            "scaling coefficient of the masked sum (the paper's lambda, still accepted as lambda)",
            tune="the authors choose it on validation data from 0.1 .. 1.0; 0.3 is a placeholder",
            aliases=("lambda",),
        )
    )


@dataclass(frozen=True, eq=False)
class SceParams(MethodParams):
    select_topk: float = use(
        Param(
            "select_topk",
            1.0,
            "fraction of the positions of nonzero variance kept, by variance (1: no selection)",
            0.0,
            1.0,
            reference_only=True,
        )
    )


# mergekit's names for these methods (``agentmerge.config.mergekit_names`` collects them)
MERGEKIT_SCE = MethodMap("sce", "sce")  # mergekit's default select_topk 1.0 is ours

# --------------------------------------------------------------------------- the entries

MAGMAX = Method(
    "magmax",
    "MagMax: per element the task vector of largest magnitude, times scale",
    Lazy("agentmerge.methods.field.kernels:magmax"),
    MagMaxParams,
    compiled_at=Lazy("agentmerge.methods.field.compiled:MAGMAX"),
    paper="2407.06322",
)

CONSENSUS = Method(
    "consensus",
    "Consensus TA: scale * sum of task vectors, kept where at least k agents' TALL masks agree",
    Lazy("agentmerge.methods.field.kernels:consensus"),
    ConsensusParams,
    compiled_at=Lazy("agentmerge.methods.field.compiled:CONSENSUS"),
    paper="2405.07813",
)

SCE = Method(
    "sce",
    "SCE (mergekit): select high-variance elements, weight agents by mean square, erase minority signs",
    Lazy("agentmerge.methods.field.kernels:sce"),
    SceParams,
    Needs(chunk_multiple=STAT_BLOCKS),
    passes=(TensorPrepare(Lazy("agentmerge.methods.field.kernels:sce_prepare")),),
    compiled_at=Lazy("agentmerge.methods.field.compiled:SCE"),
    paper="2408.07990",
    mergekit=(MERGEKIT_SCE,),
)
