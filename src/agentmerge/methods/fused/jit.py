"""Whether the compiled kernels can run, and the decorator that compiles them.

numba is a core dependency; ``AGENTMERGE_FUSED=0`` switches the compiled kernels off (the reference
torch kernels then run, with the same results, bit for bit). Where numba cannot be imported, ``jit``
leaves functions as plain Python, which ``available()`` keeps the driver from calling.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

from agentmerge.methods.deltas import MAX_PATTERN_AGENTS

F = TypeVar("F", bound=Callable[..., Any])

MAX_AGENTS = MAX_PATTERN_AGENTS  # the loops count update patterns in 2**N bins
BLOCK = 2048  # elements widened at a time (fits L1/L2 with N+1 rows)
FINITE_BITS = 0x7F800000  # float32 exponent all ones: Inf or NaN

try:
    import numba

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - depends on the environment
    HAVE_NUMBA = False


def available(n_models: int = 1) -> bool:
    """Whether the compiled kernels can merge ``n_models`` agents here (numba present and not switched off)."""
    return HAVE_NUMBA and os.environ.get("AGENTMERGE_FUSED", "1") != "0" and n_models <= MAX_AGENTS


def jit(fn: F) -> F:
    """Compile ``fn`` with numba (no GIL, cached, IEEE arithmetic: no fast-math); plain Python without numba."""
    if not HAVE_NUMBA:  # pragma: no cover
        return fn
    compiled: F = numba.njit(nogil=True, cache=True, fastmath=False, error_model="numpy")(fn)  # type: ignore[assignment]
    return compiled
