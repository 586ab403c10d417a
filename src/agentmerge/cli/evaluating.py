"""The evaluation commands: fisher, lm-eval, eval, sweep."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from agentmerge.cli.common import check_fisher_args, heavy_imports
from agentmerge.errors import ConfigError
from agentmerge.io.guards import jsontext
from agentmerge.io.guards.pathargs import check_paths, input_arg, output_arg
from agentmerge.io.guards.safety import (
    write_report,
)

# --------------------------------------------------------------------------- fisher


def _fisher_parser(sub: Any) -> None:
    p = sub.add_parser("fisher", help="estimate a model's diagonal Fisher (input of method fisher)")
    input_arg(p, "model", help="model folder (transformers causal LM)")
    input_arg(p, "--texts", kind="file", help="text file, one sample per line (default: sample from the model itself)")
    p.add_argument("--samples", type=int, help="number of samples (default: every text, or 64 sampled)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per sample (default 64)")
    input_arg(p, "--tokenizer", help="tokenizer folder for --texts (default: the model's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="stored dtype")
    output_arg(p, "--out", kind="folder", required=True, help="output folder (must hold no safetensors yet)")
    p.set_defaults(func=cmd_fisher)


def cmd_fisher(args: argparse.Namespace) -> int:
    from agentmerge.evaluation.fisher import estimate_fisher

    check_fisher_args(args)
    texts = None
    if args.texts:
        try:
            texts = [line for line in Path(args.texts).read_text().splitlines() if line.strip()]
        except OSError as e:
            raise ConfigError(f"{args.texts}: cannot read ({e.strerror})") from None
    out = estimate_fisher(
        args.model,
        args.out,
        texts=texts,
        samples=args.samples,
        max_tokens=args.max_tokens,
        seed=args.seed,
        dtype=args.dtype,
        tokenizer=args.tokenizer,
    )
    print(f"wrote the diagonal Fisher of {args.model} to {out}", file=sys.stderr)
    return 0


# --------------------------------------------------------------------------- lm-evaluation-harness


def _lm_eval_parser(sub: Any) -> None:
    p = sub.add_parser("lm-eval", help="evaluate a checkpoint with lm-evaluation-harness (optional extra 'eval')")
    input_arg(p, "checkpoint", help="model folder (e.g. a merge output)")
    p.add_argument("--tasks", required=True, help="comma-separated lm-eval task names")
    p.add_argument("--limit", type=float, help="examples per task (an int), or a fraction below 1")
    input_arg(p, "--include-path", help="folder of extra task YAML files")
    p.add_argument("--num-fewshot", type=int)
    p.add_argument("--chat-template", action="store_true", help="wrap requests in the checkpoint's chat template")
    p.add_argument("--system", help="system instruction (the chat template's system turn)")
    p.add_argument("--fewshot-as-multiturn", action="store_true", help="few-shot examples as chat turns")
    p.add_argument("--gen-kwargs", help="generation settings, e.g. max_gen_toks=256,temperature=0")
    output_arg(p, "--log-samples", kind="into", metavar="DIR", help="write every prompt, response and score to DIR")
    p.add_argument("--backend", default="hf", choices=("hf", "vllm"), help="hf (default) or vllm (when installed)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", help="load dtype, e.g. bfloat16 (default: the checkpoint's)")
    output_arg(p, "--json", dest="json_out", help="write the results as JSON here")
    p.set_defaults(func=cmd_lm_eval)


def cmd_lm_eval(args: argparse.Namespace) -> int:
    from agentmerge.evaluation.lmeval import LmEvalEvaluator, LmEvalOptions, has_chat_template, results_table

    options = LmEvalOptions(
        limit=None if args.limit is None else (int(args.limit) if args.limit >= 1 else args.limit),
        include_path=args.include_path,
        num_fewshot=args.num_fewshot,
        batch_size=args.batch_size,
        device=args.device,
        dtype=args.dtype,
        chat_template=args.chat_template,
        system=args.system,
        fewshot_as_multiturn=args.fewshot_as_multiturn,
        gen_kwargs=args.gen_kwargs,
        backend=args.backend,
        log_samples=args.log_samples,
    )
    if not args.chat_template and has_chat_template(args.checkpoint):
        print(
            f"agentmerge: note: {args.checkpoint} has a chat template, not used; pass --chat-template "
            "(instruct models usually need it for generative tasks)",
            file=sys.stderr,
        )
    evaluator = LmEvalEvaluator([t.strip() for t in args.tasks.split(",") if t.strip()], options)
    results = evaluator.score(args.checkpoint).record
    print(results_table(results))
    for path in results.get("samples_files", []):
        print(f"samples: {path}")
    if args.json_out:
        write_report(args.json_out, jsontext.dumps(results, indent=2) + "\n", "--json")
    return 0


# --------------------------------------------------------------------------- eval on the user's own tasks


def _eval_parser(sub: Any) -> None:
    p = sub.add_parser("eval", help="score checkpoints on your own tasks (JSONL) or a plug-in's suite; greedy, batched")
    input_arg(
        p,
        "checkpoints",
        nargs="*",
        help="model folders: BASE, then specialists and merges (merge.json); none with --outputs",
    )
    input_arg(
        p,
        "--tasks",
        kind="file",
        help="FILE.jsonl of prompts and references (docs/evaluate.md); with --suite zoo: names",
    )
    p.add_argument(
        "--suite", metavar="NAME", help="a suite instead of a task file: bfcl[:CATEGORIES] or a plug-in's (zoo)"
    )
    p.add_argument("--no-chat-template", action="store_true", help="use prompts as written, not in the chat template")
    p.add_argument("--system", help="system prompt (overrides the task file's)")
    p.add_argument("--samples", type=int, default=0, metavar="N", help="show N prompts with output per task")
    p.add_argument("--limit", type=int, help="first N examples of each task")
    p.add_argument("--max-new-tokens", type=int, help="override every example's max_new_tokens")
    p.add_argument("--batch-size", type=int, default=None, help="prompts per generate call (default 16; zoo 250)")
    p.add_argument("--device", default="cpu", help="torch device, e.g. cuda (default cpu)")
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16", "auto"),
        help="compute dtype (default: float32 for --tasks, the checkpoint's own (auto) for --suite humaneval)",
    )
    output_arg(p, "--json", dest="json_out", metavar="PATH", help="write the scores as JSON here ('-': stdout)")
    output_arg(p, "--markdown", metavar="PATH", help="write the markdown table here")
    p.add_argument("--split", default="test", choices=("val", "test"), help="suite: split")
    p.add_argument("--n", type=int, default=None, help="suite: prompts per task (zoo: default 1000 test, 300 val)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--few-shot", type=int, default=None, metavar="K", help="bfcl: K demonstrations (from live, unscored)"
    )
    input_arg(
        p, "--outputs", kind="file", metavar="FILE.jsonl", help="bfcl: score generations made elsewhere (no model)"
    )
    output_arg(
        p, "--log-samples", kind="into", metavar="DIR", help="suite: write every prompt, output and verdict to DIR"
    )
    p.add_argument(
        "--allow-code-execution", action="store_true", help="humaneval: run the model's code (in a limited process)"
    )
    p.add_argument("--samples-per-task", type=int, metavar="N", help="humaneval: N sampled answers each, pass@k")
    p.add_argument("--seed", type=int, default=0, help="humaneval: torch seed of the sampled answers (default 0)")
    p.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    from agentmerge.evaluation.scoring import check_counts

    check_counts(
        limit=args.limit, samples=args.samples, batch_size=1 if args.batch_size is None else args.batch_size,
        max_new_tokens=args.max_new_tokens, threads=args.threads,
    )  # fmt: skip
    if args.suite:
        return _eval_suite(args)
    suite_only = [
        flag
        for flag, v in (("--outputs", args.outputs), ("--few-shot", args.few_shot), ("--log-samples", args.log_samples))
        if v
    ]
    if suite_only:
        raise ConfigError(f"eval: {suite_only[0]} goes with --suite bfcl")
    if not args.checkpoints:
        raise ConfigError("eval: name at least one model folder")
    if not args.tasks:
        raise ConfigError("eval: pass --tasks FILE.jsonl (your prompts and references) or --suite zoo")
    from agentmerge.evaluation.scoring import TaskFileEvaluator

    evaluator = TaskFileEvaluator(  # a mistake in the file is refused before any model loads
        args.tasks,
        threads=args.threads,
        chat_template=not args.no_chat_template,
        system=args.system,
        batch_size=16 if args.batch_size is None else args.batch_size,
        samples=args.samples,
        limit=args.limit,
        max_new_tokens=args.max_new_tokens,
        device=args.device,
        dtype=args.dtype or "float32",
        quiet=args.quiet,
    )
    with heavy_imports():
        import torch  # noqa: F401  (loaded here, without collector pauses)

        from agentmerge.evaluation.eval_report import eval_markdown
    run = evaluator.run(args.checkpoints)
    text = eval_markdown(run)
    if args.json_out == "-":
        print(jsontext.dumps(run.to_dict(), indent=2))
    else:
        print(text, end="")
        if args.json_out:
            write_report(args.json_out, jsontext.dumps(run.to_dict(), indent=2) + "\n", "--json")
    if args.markdown:
        write_report(args.markdown, text, "--markdown")
    return 0


def _eval_suite(args: argparse.Namespace) -> int:
    """``eval CKPT ... --suite KIND``: an evaluator plug-in's suite, each checkpoint's metrics in percent."""
    from agentmerge.evaluation.kinds import evaluator_class

    if bool(args.outputs) == bool(args.checkpoints):
        raise ConfigError("eval --suite: name model folders, or --outputs FILE.jsonl (generations made elsewhere)")
    cls = evaluator_class(args.suite.partition(":")[0], "eval --suite")
    with heavy_imports():
        evaluator = cls.from_command(args)
    records = []
    for ckpt in [args.outputs] if args.outputs else args.checkpoints:
        score = evaluator.score_outputs(Path(ckpt)) if args.outputs else evaluator.score(Path(ckpt))
        print(f"{ckpt}:")
        width = max(16, *map(len, score.metrics))
        for metric, value in score.metrics.items():
            known = metric in score.stderr and metric in score.count
            spread = f" ± {score.stderr[metric] * 100:.2f}  (n={score.count[metric]})" if known else ""
            print(f"  {metric:<{width}} {value * 100:6.2f} %{spread}")
        for note in score.record.get("notes", []):
            print(f"  {note}")
        records.append(score.record)
    if args.json_out:
        text = jsontext.dumps(records[0] if len(records) == 1 else records, indent=2) + "\n"
        write_report(args.json_out, text, "--json")
    return 0


# --------------------------------------------------------------------------- sweeps


def _sweep_parser(sub: Any) -> None:
    p = sub.add_parser("sweep", help="merge-and-evaluate sweep on Ray (pip install 'agentmerge[sweep]')")
    input_arg(p, "config", kind="file", help="sweep YAML file (base, models, methods, evaluate, ...)")
    _sweep_flags(p, "folder for results.jsonl, results.md and kept merges")
    p.set_defaults(func=cmd_sweep)
    p = sub.add_parser(
        "search", help="search a merge's per-agent, per-layer-group parameters on validation, then test once (Ray)"
    )
    input_arg(p, "config", kind="file", help="search YAML file (base, models, space, search, evaluate, test, baseline)")
    _sweep_flags(p, "folder for results.jsonl, results.md, search.json, best.yaml and the best merge")
    p.set_defaults(func=cmd_sweep, search=True)


def _sweep_flags(p: Any, out_help: str) -> None:
    output_arg(p, "--out", kind="into", required=True, help=out_help)
    p.add_argument("--address", help="join this Ray cluster (default: start Ray on this machine)")
    p.add_argument("--max-concurrent", type=int, help="trials in flight at most (default: CPUs / cpus per trial)")
    p.add_argument(
        "--resume", action=argparse.BooleanOptionalAction, default=True, help="skip recorded trials (default)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def cmd_sweep(args: argparse.Namespace) -> int:
    from agentmerge.sweep.run import run_sweep
    from agentmerge.sweep.search_report import search_lines
    from agentmerge.sweep.sweep_report import extrapolation_note
    from agentmerge.sweep.sweepfile import load_sweep

    if args.max_concurrent is not None and args.max_concurrent < 1:
        raise ConfigError(f"--max-concurrent must be at least 1 (got {args.max_concurrent})")
    cfg = load_sweep(args.config)
    check_paths(args, models=[m for m in (cfg.base, *cfg.models) if m])  # --out not inside a model it merges
    if getattr(args, "search", False) and cfg.space is None:
        raise ConfigError(
            f"{args.config}: a search file needs space: (docs/search.md); a grid runs with agentmerge sweep"
        )
    outcome = run_sweep(
        cfg, args.out, source=args.config, address=args.address, max_concurrent=args.max_concurrent,
        resume=args.resume, quiet=args.quiet,
    )  # fmt: skip
    best = outcome.best
    summary = (
        f"{'search' if cfg.space is not None else 'sweep'}: {len(outcome.records)} trials recorded "
        f"({outcome.ran} run now, {outcome.skipped} already done, "
        f"{outcome.failed} failed now) in {outcome.seconds:.1f} s; results in {Path(args.out) / 'results.md'}"
    )
    if best is not None:
        value = best["metrics"].get(outcome.objective or "")
        summary += f"\nbest: {best['method']} {best['params']} on {best['models']}: {outcome.objective} = {value}"
        summary += "".join(f"\n{n}" for n in search_lines(Path(args.out)) if cfg.space is not None)
        note = extrapolation_note(best["method"], best["params"])
        summary += f"\n{note}" if note else ""
    print(summary, file=sys.stderr)
    return 0
