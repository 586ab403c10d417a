"""Hand a merged checkpoint to EleutherAI's lm-evaluation-harness (``pip install 'agentmerge[eval]'``).

    results = run_lm_eval("merged", ["hellaswag", "arc_easy"], LmEvalOptions(limit=100))
    results["results"]["arc_easy"]["acc,none"]

Instruct models answer generative tasks in their chat template: ``LmEvalOptions(chat_template=True,
system="...")``; ``log_samples=DIR`` keeps every prompt and response to see why a score is what it is.

The checkpoint is loaded by lm-eval's Hugging Face backend from the local folder agentmerge wrote
(config.json, safetensors, tokenizer files), or by its vLLM backend (``backend="vllm"``, when vllm is
installed). Remote code is never trusted. ``include_path`` adds a
folder of task YAML files (local tasks, e.g. on private data). Unknown task names are refused before
the model is loaded, with the closest known name suggested.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agentmerge.config.userinput import did_you_mean
from agentmerge.errors import CheckpointError, ConfigError
from agentmerge.evaluation.evaluator import Context, Evaluator, Score
from agentmerge.io.guards import jsontext

BACKENDS = ("hf", "vllm")
INSTALL_HINT = "lm-eval is not installed: pip install 'agentmerge[eval]' (or pip install 'lm-eval[hf]>=0.4.3,<0.5')"


def lm_eval_available() -> bool:
    """Whether the optional ``lm_eval`` package can be imported."""
    return importlib.util.find_spec("lm_eval") is not None


def model_args(checkpoint: Path, dtype: str | None = None) -> dict[str, Any]:
    """lm-eval ``model_args`` for the HF backend: the local folder, its dtype, no remote code."""
    args: dict[str, Any] = {"pretrained": str(checkpoint), "trust_remote_code": False}
    if dtype is not None:
        args["dtype"] = dtype
    return args


@dataclass(frozen=True)
class LmEvalOptions:
    """How lm-eval runs: prompts (chat template, system prompt), generation settings, backend, samples."""

    limit: int | float | None = None
    include_path: str | Path | None = None
    num_fewshot: int | None = None
    batch_size: int = 1
    device: str = "cpu"
    dtype: str | None = None
    seed: int = 0
    chat_template: bool = False  # wrap every request in the checkpoint's chat template (lm-eval's default: off)
    system: str | None = None  # system instruction (with the chat template, its system turn)
    fewshot_as_multiturn: bool = False
    gen_kwargs: str | None = None  # e.g. "max_gen_toks=256,temperature=0" for generative tasks
    backend: str = "hf"  # or "vllm" when installed
    log_samples: str | Path | None = None  # folder for one samples_<task>.jsonl per task


def run_lm_eval(
    checkpoint: str | Path, tasks: Sequence[str], options: LmEvalOptions | None = None, **settings: Any
) -> dict[str, Any]:
    """Evaluate ``checkpoint`` on lm-eval ``tasks``; returns lm-eval's result dict (JSON-serialisable parts).

    ``settings`` are fields of ``LmEvalOptions`` (``limit=100``), applied over ``options``.

    With ``options.log_samples`` every request's prompt, response and score is written to that folder
    (``samples_<task>.jsonl``) and ``result["samples_files"]`` lists the files.
    """
    opts = replace(options or LmEvalOptions(), **settings)
    folder = _checked(checkpoint, tasks, opts)
    import lm_eval
    from lm_eval.tasks import TaskManager

    manager = _task_manager(TaskManager, opts.include_path, tasks)
    known = tuple(manager.all_tasks)
    for t in tasks:
        if t not in known:
            raise ConfigError(f"unknown lm-eval task {t!r}{did_you_mean(t, known)}")
    try:
        out = lm_eval.simple_evaluate(**_evaluate_kwargs(folder, tasks, opts), task_manager=manager)
    except ModuleNotFoundError as e:  # lm-eval installed without its backend's dependencies
        raise ConfigError(
            f"lm-eval's {opts.backend} backend needs {e.name!r}: pip install 'agentmerge[eval]'"
        ) from None
    if out is None:  # lm-eval returns None on non-zero ranks only
        raise ConfigError("lm-eval returned no results")
    kept: dict[str, Any] = json.loads(
        jsontext.dumps({k: out[k] for k in ("results", "versions", "n-shot", "config") if k in out}, default=str)
    )
    if opts.log_samples is not None:
        kept["samples_files"] = write_samples(out.get("samples") or {}, Path(opts.log_samples))
    return kept


class LmEvalEvaluator(Evaluator):
    """lm-eval tasks (``evaluate: lm-eval:T1,T2``, ``agentmerge lm-eval``): metrics ``task.metric``.

    ``Score.record`` is :func:`run_lm_eval`'s result; the metrics are its numbers, standard errors aside, each
    named by the task and the metric without lm-eval's filter (``arc_easy.acc``).
    """

    kind = "lm-eval"
    usage = "lm-eval:TASKS"

    def __init__(self, tasks: Sequence[str], options: LmEvalOptions | None = None) -> None:
        self.tasks = list(tasks)
        self.lm_options = options or LmEvalOptions()

    @property
    def name(self) -> str:
        return f"lm-eval:{','.join(self.tasks)}"

    def score(self, checkpoint: Path) -> Score:
        results = run_lm_eval(checkpoint, self.tasks, self.lm_options)
        metrics = {}
        for task, values in results.get("results", {}).items():
            for name, value in values.items():
                if isinstance(value, int | float) and not isinstance(value, bool) and "stderr" not in name:
                    metrics[f"{task}.{name.split(',')[0]}"] = float(value)
        return Score(metrics, record=results)

    @classmethod
    def check_spec(cls, spec: str, arg: str) -> None:
        if not arg:
            raise ConfigError(f"evaluate: {spec!r}: name the tasks, e.g. lm-eval:hellaswag,arc_easy")

    @classmethod
    def from_spec(cls, arg: str, options: Mapping[str, Any], context: Context) -> LmEvalEvaluator:
        return cls([t for t in arg.split(",") if t])


def _checked(checkpoint: str | Path, tasks: Sequence[str], opts: LmEvalOptions) -> Path:
    if not lm_eval_available():
        raise ConfigError(INSTALL_HINT)
    if opts.backend not in BACKENDS:
        raise ConfigError(f"unknown lm-eval backend {opts.backend!r}; use one of {', '.join(BACKENDS)}")
    if opts.backend == "vllm" and importlib.util.find_spec("vllm") is None:
        raise ConfigError("the vllm backend needs vllm: pip install vllm (a CUDA machine), or use --backend hf")
    folder = Path(checkpoint).expanduser()
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{folder}: not a model folder (no config.json); pass a merged output folder")
    if not tasks:
        raise ConfigError("no tasks given; pass --tasks T1,T2 (see `lm-eval ls tasks`)")
    if opts.gen_kwargs is not None:
        for item in opts.gen_kwargs.split(","):
            if "=" not in item or not item.partition("=")[0].strip():
                raise ConfigError(f"--gen-kwargs {opts.gen_kwargs!r}: write KEY=VALUE pairs, e.g. max_gen_toks=256")
    return folder


def _evaluate_kwargs(folder: Path, tasks: Sequence[str], opts: LmEvalOptions) -> dict[str, Any]:
    seed = opts.seed
    return {
        "model": opts.backend,
        "model_args": model_args(folder, opts.dtype),
        "tasks": list(tasks),
        "num_fewshot": opts.num_fewshot,
        "batch_size": opts.batch_size,
        "device": opts.device,
        "limit": opts.limit,
        "log_samples": opts.log_samples is not None,
        "apply_chat_template": opts.chat_template,
        "system_instruction": opts.system,
        "fewshot_as_multiturn": opts.fewshot_as_multiturn,
        "gen_kwargs": opts.gen_kwargs,
        "random_seed": seed,
        "numpy_random_seed": seed,
        "torch_random_seed": seed,
        "fewshot_random_seed": seed,
    }


def write_samples(samples: dict[str, Any], folder: Path) -> list[str]:
    """One ``samples_<task>.jsonl`` per task (lm-eval's per-request records); returns the paths."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for task, rows in sorted(samples.items()):
        path = folder / f"samples_{task}.jsonl"
        path.write_text("".join(jsontext.dumps(r, default=str, ensure_ascii=False) + "\n" for r in rows))
        written.append(str(path))
    return written


def has_chat_template(checkpoint: str | Path) -> bool:
    """Whether the folder's tokenizer config (or a chat_template.jinja) holds a chat template."""
    folder = Path(checkpoint).expanduser()
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and bool(config.get("chat_template"))


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
