"""The merge rows of one seed's bench, and making one of them again after the bench (which keeps no merge).

A *row* is a method at its defaults (``"ties"``) or at the output scale the bench tuned for it (``"ties.tuned"``).
Later stages that score a few rows on a costlier set (HumanEval, BFCL's whole test) choose them here: the ``k``
best methods by the bench's objective (the mean strict score over the trained skills on test), each at its better
row, and make each merge again from its test trial into a scratch folder that is deleted after scoring.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from agentmerge_zoo.real.aggregate import has_scale, trained_mean
from agentmerge_zoo.real.bench import SeedInputs

T = TypeVar("T")


def merge_rows(bench: dict[str, Any]) -> list[str]:
    """The report's merge rows of one seed: every benched method at its defaults, then each tuned one."""
    reports = bench["reports"]
    defaults = [m for m in bench["methods"] if m in reports]
    return [*defaults, *(f"{m}.tuned" for m in defaults if has_scale(m) and f"{m}.tuned" in reports)]


def top_rows(reports: dict[str, Any], names: Sequence[str], trained: Sequence[str], k: int) -> list[str]:
    """The ``k`` best methods by the bench's objective (trained-skill mean on test), each at its better row
    (ties: the defaults row, then the name), best first."""
    ranked = sorted(names, key=lambda n: (-trained_mean(reports[n], trained), n.endswith(".tuned"), n))
    out: list[str] = []
    for name in ranked:
        if len(out) < k and name.split(".")[0] not in {o.split(".")[0] for o in out}:
            out.append(name)
    return out


def row_params(bench: dict[str, Any], name: str) -> dict[str, Any]:
    """The parameters of a merge row: none for a defaults row, the chosen output scale for a tuned one."""
    if not name.endswith(".tuned"):
        return {}
    choice = bench["tuning"].get(name.removesuffix(".tuned"), {})
    return {} if choice.get("value") is None else {choice["param"]: choice["value"]}


@contextmanager
def merged_row(inputs: SeedInputs, bench: dict[str, Any], name: str, scratch: Path, threads: int) -> Iterator[Path]:
    """The merge of row ``name``, made again from its test trial into ``scratch`` and deleted on leaving."""
    from agentmerge_zoo.real.kept import merge_again

    shutil.rmtree(scratch, ignore_errors=True)
    try:
        yield merge_again(inputs, name.split(".")[0], scratch, threads, row_params(bench, name), name)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def score_rows(names: Sequence[str], score: Callable[[str], T], failed: dict[str, str]) -> dict[str, T]:
    """``score(name)`` of each row; a row whose merge or scoring fails is named in ``failed`` with its error, and
    the others are still scored (one merge's failure must not lose the rest)."""
    out: dict[str, T] = {}
    for name in names:
        try:
            out[name] = score(name)
        except Exception as e:
            failed[name] = f"{type(e).__name__}: {e}"
    return out
