"""The fair protocol of the zoo bench: every method at its defaults, and every method with an output scale tuned
alike.

- **defaults**: each method of the main table with the bench's own parameters (``MethodRun.params``), its output
  scale at the method's default (task arithmetic at lambda 1).
- **tuned**: each method with an output scale (``Method.output_scale`` of the registry: TA / TIES / DARE /
  Breadcrumbs / DELLA / MagMax / Consensus ``lambda``, RAM / RAM+ ``scale``, and whatever a new method declares)
  gets that parameter chosen from ONE shared grid (the plan's ``scales``) by ONE rule, the library's
  ``agentmerge.api.choose_scale`` (the same rule the sweep's report uses): the highest validation agentic average,
  a tie going to the value nearest 1 (then the smaller). A method without an output scale is its defaults row in
  the tuned table too.

A seed's record keeps the defaults rows under their labels and the tuned rows under ``LABEL.tuned``;
:func:`tuned_view` renames them so that every table and paired difference can be computed for the tuned table
the same way as for the defaults.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentmerge import METHODS

TUNED = ".tuned"
# results keys under their output-scale names, and what results files written before the rename call them
OLD_KEYS = {"task_arithmetic_scale": "task_arithmetic_lambda", "ta_scale": "ta_lambda"}


def output_scale(method: str) -> str | None:
    """The method's output-scale parameter (the registry's ``Method.output_scale``); None when it has none or the
    engine does not have the method."""
    return METHODS[method].output_scale if method in METHODS else None


def merges_models(method: str, n: int) -> bool:
    """Whether the registry's method takes ``n`` models (False when the engine does not have it)."""
    if method not in METHODS:
        return False
    spec = METHODS[method]
    return spec.min_models <= n and (spec.max_models is None or n <= spec.max_models)


def resolved(method: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` over the method's defaults: two settings merge alike when these are equal."""
    return {**METHODS[method].defaults(), **params} if method in METHODS else dict(params)


def chosen_scale(entry: Mapping[str, Any]) -> float | None:
    """The output scale chosen on validation in a seed's ``val`` entry: ``best`` (``best_lambda`` in task
    arithmetic's entries of results written before the rename); None when none was chosen."""
    value = entry.get("best", entry.get("best_lambda"))
    return float(value) if isinstance(value, int | float) else None


def read_key(results: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """``results[key]``, or its name in older results files (``OLD_KEYS``), else ``default``."""
    if key in results:
        return results[key]
    return results.get(OLD_KEYS.get(key, key), default)


def is_tuned(label: str) -> bool:
    return label.endswith(TUNED)


def tuned_view(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records as the tuned table sees them: ``LABEL.tuned`` rows replace ``LABEL`` (methods without an output
    scale keep their defaults row); pairs alike."""
    out = []
    for record in records:
        view = _renamed(record)
        if record.get("pairs"):
            view["pairs"] = {name: _renamed(sub) for name, sub in record["pairs"].items()}
        out.append(view)
    return out


def _renamed(record: dict[str, Any]) -> dict[str, Any]:
    rows = dict(record["rows"])
    for label in [x for x in rows if is_tuned(x)]:
        rows[label.removesuffix(TUNED)] = rows.pop(label)
    return {**record, "rows": rows}


def defaults_view(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records without their tuned rows (the defaults table)."""
    out = []
    for record in records:
        view = {**record, "rows": {k: v for k, v in record["rows"].items() if not is_tuned(k)}}
        if record.get("pairs"):
            view["pairs"] = {
                name: {**sub, "rows": {k: v for k, v in sub["rows"].items() if not is_tuned(k)}}
                for name, sub in record["pairs"].items()
            }
        out.append(view)
    return out


def has_tuned(records: Sequence[dict[str, Any]]) -> bool:
    """Whether the records come from a fair bench (some tuned row)."""
    return any(is_tuned(label) for r in records for label in r["rows"])
