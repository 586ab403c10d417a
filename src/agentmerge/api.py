"""The public API for code built on agentmerge: the names a client (such as the agent zoo) may import.

``agentmerge`` itself exports the everyday names (``merge``, ``probe``, ``evaluate``, ``MergeConfig``,
``METHODS``, the errors). This module adds what a larger client needs to build on the engine: the sweep runner,
the evaluator interface, the convergence check, the Fisher estimate, the BFCL checker, the task-vector
statistics, the fair protocol's choice and a few helpers for command lines and files. A client imports from
``agentmerge`` and ``agentmerge.api`` only, never from a module deeper down (``tests/test_layers.py`` holds
the zoo to this), so the library's modules can move without breaking it: a name here keeps its meaning.

Each name is imported on first use (like ``agentmerge``'s own), so ``import agentmerge.api`` costs nothing.
A few are spelled more fully than in their module, so that a flat list reads well (``sweep_grid`` is
``sweep.sweepfile.grid``; the ``bfcl_`` names are the BFCL evaluator's).

Sweeps (docs/sweep.md)
    ``SweepConfig``, ``TrialEntry``, ``sweep_from_dict``: a sweep file, one explicit trial, a sweep from a dict.
    ``sweep_grid(cfg)``, ``sweep_settings(cfg)``: the settings of the grid, or of the file's ``search`` choice.
    ``sweep_trials(cfg, settings)``, ``trial_merge_config(cfg, trial)``: the trials (settings x seeds) and one
    trial's ``MergeConfig``. ``run_sweep``, ``RaySession``: run them on Ray (one session shared by several sweeps).
    ``choose_scale({scale: score})``: the fair protocol's one rule for the best output scale, the one the sweep's
    page uses too (``agentmerge.sweep.fair_choice``: best score, ties to the scale nearest 1, then the smaller).
Evaluators (docs/evaluate.md)
    ``Evaluator``, ``Score``, ``Context``: the interface a plug-in evaluator implements; ``set_threads``;
    ``Early``: what ``Evaluator.score_early`` returns (a search's ``early_stop``).
    ``quiet_transformers()``: transformers' warnings off while a checkpoint is scored.
Convergence (docs/convergence.md)
    ``check_agent``, ``AgentCheck``, ``ScalePoint``, ``scaled_model``, ``CONVERGENCE_SCALES``: an agent's score
    along ``base + s * (agent - base)``.
Fisher (``agentmerge fisher``)
    ``estimate_fisher``, ``diagonal_fisher``, ``FisherSample``, ``transformers_step``, ``check_causal_lm_folder``;
    ``FISHER_MARK``, ``is_fisher``: the file mark of a Fisher folder.
BFCL (docs/evaluate.md)
    ``bfcl_load_category``, ``bfcl_subset``, ``BfclItem``, ``BFCL_LIVE_AST``, ``BFCL_NON_LIVE_AST``: the data;
    ``bfcl_decode``, ``BfclCall``, ``BfclDecodeError``: a model's answer as calls; ``bfcl_verdict``,
    ``bfcl_normalised``, ``bfcl_mode_of``: the checker; ``bfcl_render_call``, ``bfcl_system_prompt``: the prompt.
HumanEval (docs/evaluate.md)
    ``HumanEvalEvaluator``, ``HumanEvalSettings``: the suite (its problems, chat prompts, completion cutting,
    program assembly and sandbox), for a client that chooses which problems each checkpoint is scored on.
Task vectors (docs/methods.md)
    ``task_vectors``, ``update_mask``, ``overlap_count``, ``kept_by_count``; ``retention``: how much of each
    agent's update a merged checkpoint kept.
Command lines and files
    ``input_arg``, ``output_arg``: argparse types that check paths; ``check_report_path``: a report's path
    checked before work starts; ``did_you_mean``: the nearest known name; ``dumps_json``: strict JSON text.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentmerge.config.userinput import did_you_mean
    from agentmerge.engine.retention import retention
    from agentmerge.evaluation.bfcl.checker import mode_of as bfcl_mode_of
    from agentmerge.evaluation.bfcl.checker import normalised as bfcl_normalised
    from agentmerge.evaluation.bfcl.checker import verdict as bfcl_verdict
    from agentmerge.evaluation.bfcl.data import LIVE_AST as BFCL_LIVE_AST
    from agentmerge.evaluation.bfcl.data import NON_LIVE_AST as BFCL_NON_LIVE_AST
    from agentmerge.evaluation.bfcl.data import Item as BfclItem
    from agentmerge.evaluation.bfcl.data import load_category as bfcl_load_category
    from agentmerge.evaluation.bfcl.data import subset as bfcl_subset
    from agentmerge.evaluation.bfcl.decode import Call as BfclCall
    from agentmerge.evaluation.bfcl.decode import DecodeError as BfclDecodeError
    from agentmerge.evaluation.bfcl.decode import decode as bfcl_decode
    from agentmerge.evaluation.bfcl.prompt import render_call as bfcl_render_call
    from agentmerge.evaluation.bfcl.prompt import system_prompt as bfcl_system_prompt
    from agentmerge.evaluation.convergence import SCALES as CONVERGENCE_SCALES
    from agentmerge.evaluation.convergence import AgentCheck, ScalePoint, check_agent, scaled_model
    from agentmerge.evaluation.evaluator import Context, Early, Evaluator, Score, set_threads
    from agentmerge.evaluation.fisher import Sample as FisherSample
    from agentmerge.evaluation.fisher import check_causal_lm_folder, diagonal_fisher, estimate_fisher, transformers_step
    from agentmerge.evaluation.generation import quiet_transformers
    from agentmerge.evaluation.humaneval import HumanEvalEvaluator
    from agentmerge.evaluation.humaneval import Settings as HumanEvalSettings
    from agentmerge.io.formats.roles import FISHER_MARK, is_fisher
    from agentmerge.io.guards.jsontext import dumps as dumps_json
    from agentmerge.io.guards.pathargs import input_arg, output_arg
    from agentmerge.io.guards.safety import check_report_path
    from agentmerge.methods.deltas import kept_by_count, overlap_count, task_vectors, update_mask
    from agentmerge.sweep.fair_choice import choose_scale
    from agentmerge.sweep.run import RaySession, run_sweep
    from agentmerge.sweep.sweepfile import SweepConfig, TrialEntry, sweep_from_dict
    from agentmerge.sweep.sweepfile import choose as sweep_settings
    from agentmerge.sweep.sweepfile import grid as sweep_grid
    from agentmerge.sweep.sweepfile import merge_config as trial_merge_config
    from agentmerge.sweep.sweepfile import trials as sweep_trials


def _same(module: str, *names: str) -> dict[str, tuple[str, str]]:
    return {name: (module, name) for name in names}


# api name -> (module, name in that module); the TYPE_CHECKING block above says the same for type checkers
_WHERE: dict[str, tuple[str, str]] = {
    **_same("agentmerge.config.userinput", "did_you_mean"),
    **_same("agentmerge.engine.retention", "retention"),
    "bfcl_mode_of": ("agentmerge.evaluation.bfcl.checker", "mode_of"),
    "bfcl_normalised": ("agentmerge.evaluation.bfcl.checker", "normalised"),
    "bfcl_verdict": ("agentmerge.evaluation.bfcl.checker", "verdict"),
    "BFCL_LIVE_AST": ("agentmerge.evaluation.bfcl.data", "LIVE_AST"),
    "BFCL_NON_LIVE_AST": ("agentmerge.evaluation.bfcl.data", "NON_LIVE_AST"),
    "BfclItem": ("agentmerge.evaluation.bfcl.data", "Item"),
    "bfcl_load_category": ("agentmerge.evaluation.bfcl.data", "load_category"),
    "bfcl_subset": ("agentmerge.evaluation.bfcl.data", "subset"),
    "BfclCall": ("agentmerge.evaluation.bfcl.decode", "Call"),
    "BfclDecodeError": ("agentmerge.evaluation.bfcl.decode", "DecodeError"),
    "bfcl_decode": ("agentmerge.evaluation.bfcl.decode", "decode"),
    "bfcl_render_call": ("agentmerge.evaluation.bfcl.prompt", "render_call"),
    "bfcl_system_prompt": ("agentmerge.evaluation.bfcl.prompt", "system_prompt"),
    "CONVERGENCE_SCALES": ("agentmerge.evaluation.convergence", "SCALES"),
    **_same("agentmerge.evaluation.convergence", "AgentCheck", "ScalePoint", "check_agent", "scaled_model"),
    **_same("agentmerge.evaluation.evaluator", "Context", "Early", "Evaluator", "Score", "set_threads"),
    "FisherSample": ("agentmerge.evaluation.fisher", "Sample"),
    **_same(
        "agentmerge.evaluation.fisher",
        "check_causal_lm_folder",
        "diagonal_fisher",
        "estimate_fisher",
        "transformers_step",
    ),
    **_same("agentmerge.evaluation.generation", "quiet_transformers"),
    **_same("agentmerge.evaluation.humaneval", "HumanEvalEvaluator"),
    "HumanEvalSettings": ("agentmerge.evaluation.humaneval", "Settings"),
    "dumps_json": ("agentmerge.io.guards.jsontext", "dumps"),
    **_same("agentmerge.io.guards.pathargs", "input_arg", "output_arg"),
    **_same("agentmerge.io.guards.safety", "check_report_path"),
    **_same("agentmerge.io.formats.roles", "FISHER_MARK", "is_fisher"),
    **_same("agentmerge.methods.deltas", "kept_by_count", "overlap_count", "task_vectors", "update_mask"),
    **_same("agentmerge.sweep.fair_choice", "choose_scale"),
    **_same("agentmerge.sweep.run", "RaySession", "run_sweep"),
    **_same("agentmerge.sweep.sweepfile", "SweepConfig", "TrialEntry", "sweep_from_dict"),
    "sweep_settings": ("agentmerge.sweep.sweepfile", "choose"),
    "sweep_grid": ("agentmerge.sweep.sweepfile", "grid"),
    "trial_merge_config": ("agentmerge.sweep.sweepfile", "merge_config"),
    "sweep_trials": ("agentmerge.sweep.sweepfile", "trials"),
}


def __getattr__(name: str) -> Any:
    """An API name, imported from its module when first asked for."""
    if name in _WHERE:
        module, attribute = _WHERE[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'agentmerge.api' has no attribute {name!r}")


__all__ = [
    "BFCL_LIVE_AST",
    "BFCL_NON_LIVE_AST",
    "CONVERGENCE_SCALES",
    "FISHER_MARK",
    "AgentCheck",
    "BfclCall",
    "BfclDecodeError",
    "BfclItem",
    "Context",
    "Early",
    "Evaluator",
    "FisherSample",
    "HumanEvalEvaluator",
    "HumanEvalSettings",
    "RaySession",
    "ScalePoint",
    "Score",
    "SweepConfig",
    "TrialEntry",
    "bfcl_decode",
    "bfcl_load_category",
    "bfcl_mode_of",
    "bfcl_normalised",
    "bfcl_render_call",
    "bfcl_subset",
    "bfcl_system_prompt",
    "bfcl_verdict",
    "check_agent",
    "check_causal_lm_folder",
    "check_report_path",
    "choose_scale",
    "diagonal_fisher",
    "did_you_mean",
    "dumps_json",
    "estimate_fisher",
    "input_arg",
    "is_fisher",
    "kept_by_count",
    "output_arg",
    "overlap_count",
    "quiet_transformers",
    "retention",
    "run_sweep",
    "scaled_model",
    "set_threads",
    "sweep_from_dict",
    "sweep_grid",
    "sweep_settings",
    "sweep_trials",
    "task_vectors",
    "transformers_step",
    "trial_merge_config",
    "update_mask",
]
