"""Which evaluators there are: the library's own kinds and the installed plug-ins' (``plugins.EVALUATORS``).

A spec ``KIND`` or ``KIND:ARG`` (a sweep file's ``evaluate``) names one; :func:`parse` finds its class and
checks the spec, :func:`evaluator_class` looks a kind up by its word (``agentmerge eval --suite KIND``).
Plug-ins are listed first (``zoo, lm-eval:TASKS, ...``); a plug-in may not take a built-in kind's word.
"""

from __future__ import annotations

from agentmerge import plugins
from agentmerge.errors import ConfigError
from agentmerge.evaluation.bfcl.bfcl_evaluator import BfclEvaluator
from agentmerge.evaluation.evaluator import Evaluator
from agentmerge.evaluation.humaneval import HumanEvalEvaluator
from agentmerge.evaluation.lmeval import LmEvalEvaluator
from agentmerge.evaluation.pyfunction import PythonEvaluator
from agentmerge.evaluation.scoring import TaskFileEvaluator

BUILT_IN: tuple[type[Evaluator], ...] = (
    LmEvalEvaluator,
    PythonEvaluator,
    TaskFileEvaluator,
    BfclEvaluator,
    HumanEvalEvaluator,
)


def plugin_kinds() -> dict[str, str]:
    """The installed evaluator plug-ins: kind -> ``"module:Class"`` (not imported yet)."""
    own = {c.kind for c in BUILT_IN}
    return {k: v for k, v in sorted(plugins.entry_points(plugins.EVALUATORS).items()) if k not in own}


def evaluator_class(kind: str, where: str = "evaluate") -> type[Evaluator]:
    """The evaluator class of ``kind``, a plug-in's imported now; a ``ConfigError`` naming the known kinds."""
    own = {c.kind: c for c in BUILT_IN}
    if kind in own:
        return own[kind]
    found = plugin_kinds()
    if kind not in found:
        known = ", ".join([*found, *own])
        raise ConfigError(f"{where}: no evaluator {kind!r} (installed: {known})")
    cls = plugins.load(plugins.EVALUATORS, kind, found[kind])
    if not (isinstance(cls, type) and issubclass(cls, Evaluator)) or cls.kind != kind:
        raise ConfigError(f"{where}: plug-in {kind!r} ({found[kind]}) is not an Evaluator of kind {kind!r}")
    return cls


def parse(spec: str) -> tuple[type[Evaluator], str]:
    """``"lm-eval:hellaswag"`` -> ``(LmEvalEvaluator, "hellaswag")``, the spec checked; else a ``ConfigError``."""
    kind, _, arg = spec.partition(":")
    names = [*plugin_kinds(), *(c.kind for c in BUILT_IN)]
    if kind not in names:
        usages = [_usage(k) for k in names]
        raise ConfigError(f"evaluate: {spec!r} is not one of {', '.join(usages)}")
    cls = evaluator_class(kind)
    cls.check_spec(spec, arg)
    return cls, arg


def _usage(kind: str) -> str:
    """How ``kind``'s spec is written (its word alone when its plug-in cannot be loaded)."""
    try:
        return evaluator_class(kind).usage
    except ConfigError:
        return kind
