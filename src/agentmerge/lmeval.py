"""Hand a merged checkpoint to EleutherAI's lm-evaluation-harness (``pip install 'agentmerge[eval]'``).

    results = run_lm_eval("merged", ["hellaswag", "arc_easy"], limit=100)
    results["results"]["arc_easy"]["acc,none"]

The checkpoint is loaded by lm-eval's Hugging Face backend from the local folder agentmerge wrote
(config.json, safetensors, tokenizer files). Remote code is never trusted. ``include_path`` adds a
folder of task YAML files (local tasks, e.g. on private data). Unknown task names are refused before
the model is loaded, with the closest known name suggested.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentmerge.errors import CheckpointError, ConfigError
from agentmerge.userinput import did_you_mean

INSTALL_HINT = "lm-eval is not installed: pip install 'agentmerge[eval]' (or pip install 'lm-eval[hf]>=0.4,<0.5')"


def lm_eval_available() -> bool:
    """Whether the optional ``lm_eval`` package can be imported."""
    return importlib.util.find_spec("lm_eval") is not None


def model_args(checkpoint: Path, dtype: str | None = None) -> dict[str, Any]:
    """lm-eval ``model_args`` for the HF backend: the local folder, its dtype, no remote code."""
    args: dict[str, Any] = {"pretrained": str(checkpoint), "trust_remote_code": False}
    if dtype is not None:
        args["dtype"] = dtype
    return args


def run_lm_eval(
    checkpoint: str | Path,
    tasks: Sequence[str],
    *,
    limit: int | float | None = None,
    include_path: str | Path | None = None,
    num_fewshot: int | None = None,
    batch_size: int = 1,
    device: str = "cpu",
    dtype: str | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Evaluate ``checkpoint`` on lm-eval ``tasks``; returns lm-eval's result dict (JSON-serialisable parts)."""
    if not lm_eval_available():
        raise ConfigError(INSTALL_HINT)
    folder = Path(checkpoint).expanduser()
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{folder}: not a model folder (no config.json); pass a merged output folder")
    if not tasks:
        raise ConfigError("no tasks given; pass --tasks T1,T2 (see `lm-eval ls tasks`)")
    import lm_eval
    from lm_eval.tasks import TaskManager

    manager = _task_manager(TaskManager, include_path, tasks)
    known = tuple(manager.all_tasks)
    for t in tasks:
        if t not in known:
            raise ConfigError(f"unknown lm-eval task {t!r}{did_you_mean(t, known)}")
    try:
        out = lm_eval.simple_evaluate(
            model="hf",
            model_args=model_args(folder, dtype),
            tasks=list(tasks),
            num_fewshot=num_fewshot,
            batch_size=batch_size,
            device=device,
            limit=limit,
            task_manager=manager,
            log_samples=False,
            random_seed=seed,
            numpy_random_seed=seed,
            torch_random_seed=seed,
            fewshot_random_seed=seed,
        )
    except ModuleNotFoundError as e:  # lm-eval installed without its Hugging Face backend's dependencies
        raise ConfigError(f"lm-eval's Hugging Face backend needs {e.name!r}: pip install 'agentmerge[eval]'") from None
    if out is None:  # lm-eval returns None on non-zero ranks only
        raise ConfigError("lm-eval returned no results")
    kept: dict[str, Any] = json.loads(
        json.dumps({k: out[k] for k in ("results", "versions", "n-shot") if k in out}, default=str)
    )
    return kept


def _task_manager(cls: Any, include_path: str | Path | None, tasks: Sequence[str]) -> Any:
    """lm-eval's task index; only ``include_path`` when it holds every task (indexing all tasks takes seconds)."""
    if include_path is not None:
        local = cls(include_path=str(include_path), include_defaults=False)
        if all(t in local.all_tasks for t in tasks):
            return local
    return cls(include_path=str(include_path) if include_path is not None else None)


def results_table(results: dict[str, Any]) -> str:
    """Markdown: one row per task and metric."""
    lines = ["| task | metric | value |", "|---|---|---|"]
    for task, metrics in sorted(results.get("results", {}).items()):
        for key, value in sorted(metrics.items()):
            metric = "," in key and "stderr" not in key  # lm-eval names metrics "metric,filter"
            if metric and isinstance(value, int | float) and not isinstance(value, bool):
                lines.append(f"| {task} | {key} | {value:.4f} |")
    return "\n".join(lines)
