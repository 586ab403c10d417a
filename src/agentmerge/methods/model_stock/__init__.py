"""Model Stock (arXiv 2403.19522): the models' average pulled toward the base by their task vectors' mean
cosine. Entry and mergekit name (no torch); kernel in ``kernels.py``.
"""

from __future__ import annotations

from agentmerge.methods.hooks import STAT_BLOCKS, Needs, TensorPrepare
from agentmerge.methods.mergekit_map import MethodMap
from agentmerge.methods.method import Method
from agentmerge.methods.spec import Lazy

# mergekit's names for these methods (``agentmerge.config.mergekit_names`` collects them)
MERGEKIT_MODEL_STOCK = MethodMap("model_stock", "model_stock")

# --------------------------------------------------------------------------- the entries

MODEL_STOCK = Method(
    "model_stock",
    "Model Stock: average of the models pulled toward the base by their task vectors' mean cosine",
    Lazy("agentmerge.methods.model_stock.kernels:model_stock"),
    needs=Needs(chunk_multiple=STAT_BLOCKS),
    passes=(TensorPrepare(Lazy("agentmerge.methods.model_stock.kernels:model_stock_prepare")),),
    paper="2403.19522",
    mergekit=(MERGEKIT_MODEL_STOCK,),
)
