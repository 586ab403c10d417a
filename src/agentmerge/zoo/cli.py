"""Command-line pieces of the zoo: ``agentmerge zoo build``, ``agentmerge zoo bench`` and ``agentmerge eval``.

The main ``agentmerge`` parser calls :func:`register` to add these subcommands.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import time
from pathlib import Path
from typing import Any

from agentmerge.safety import check_report_path, write_report

DEFAULT_ZOO = ".zoo-cache"
DEFAULT_WORK = "bench-work"


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``zoo {build,bench}`` and ``eval`` to the main parser's subcommands."""
    zoo = subparsers.add_parser("zoo", help="build the CPU agent zoo and benchmark merge methods on it")
    zoo_sub = zoo.add_subparsers(dest="zoo_command", required=True)
    _build_parser(zoo_sub)
    _bench_parser(zoo_sub)
    _eval_parser(subparsers)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--smoke", action="store_true", help="tiny sizes: checks the pipeline runs, not who wins")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def _build_parser(sub: Any) -> None:
    p = sub.add_parser("build", help="pretrain the base and RL-train one agent per domain (cached, resumable)")
    p.add_argument("--out", default=DEFAULT_ZOO, help=f"zoo folder (default {DEFAULT_ZOO})")
    p.add_argument("--seed", type=int, default=0, help="pipeline seed (default 0)")
    _common(p)
    p.set_defaults(func=cmd_build)


def _bench_parser(sub: Any) -> None:
    p = sub.add_parser("bench", help="merge the zoo agents with every method and write docs/results.{md,json}")
    p.add_argument("--zoo", default=DEFAULT_ZOO, help=f"zoo folder (default {DEFAULT_ZOO})")
    p.add_argument("--work", default=DEFAULT_WORK, help=f"merges and evaluation cache (default {DEFAULT_WORK})")
    p.add_argument("--docs", default="docs", help="where results.md and results.json go (default docs)")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated pipeline seeds (default 0,1,2)")
    p.add_argument("--render-only", action="store_true", help="only re-render results.md from results.json")
    _common(p)
    p.set_defaults(func=cmd_bench)


def _eval_parser(sub: Any) -> None:
    p = sub.add_parser("eval", help="score a checkpoint folder on an evaluation suite (greedy, batched)")
    p.add_argument("checkpoint", help="model folder (transformers causal LM with its tokenizer)")
    p.add_argument("--suite", default="zoo", choices=("zoo",), help="evaluation suite (default zoo)")
    p.add_argument("--split", default="test", choices=("val", "test"))
    p.add_argument("--n", type=int, default=None, help="prompts per task (default 1000 test, 300 val)")
    p.add_argument("--tasks", default=None, help="comma-separated task names (default: all)")
    p.add_argument("--batch-size", type=int, default=250)
    p.add_argument("--json", dest="json_out", default=None, help="write the report as JSON here")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_eval)


def _threads(n: int | None) -> int:
    import torch

    count = n or os.cpu_count() or 1
    torch.set_num_threads(count)
    return count


def _config(smoke: bool) -> Any:
    from agentmerge.zoo.config import full_config, smoke_config

    return smoke_config() if smoke else full_config()


def cmd_build(args: argparse.Namespace) -> int:
    from agentmerge.zoo.build import build_zoo, stderr_logger

    threads = _threads(args.threads)
    paths = build_zoo(_config(args.smoke), Path(args.out), args.seed, threads=threads, log=stderr_logger(args.quiet))
    for name, path in paths.items():
        print(f"{name}\t{path}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from agentmerge.zoo.bench import BenchPlan, run_bench
    from agentmerge.zoo.build import stderr_logger
    from agentmerge.zoo.results import aggregate, render_from_json, write_results

    if args.render_only:
        print(f"wrote {render_from_json(Path(args.docs))}")
        return 0
    threads = _threads(args.threads)
    seeds = tuple(int(s) for s in args.seeds.split(",") if s.strip())
    cfg = _config(args.smoke)
    started = time.perf_counter()
    plan = BenchPlan(seeds=seeds, fisher_prompts=4, ta_lambdas=(0.5, 1.0)) if args.smoke else BenchPlan(seeds=seeds)
    records = run_bench(cfg, plan, Path(args.zoo), Path(args.work), stderr_logger(args.quiet), threads)
    meta = {
        "command": _command(args),
        "config": cfg.to_dict(),
        "threads": threads,
        "wall_seconds": time.perf_counter() - started,
    }
    json_path, md_path = write_results(aggregate(records, meta), Path(args.docs))
    print(f"wrote {md_path} and {json_path}")
    return 0


def _command(args: argparse.Namespace) -> str:
    parts = ["agentmerge", "zoo", "bench", "--zoo", args.zoo, "--work", args.work, "--docs", args.docs]
    parts += ["--seeds", args.seeds]
    if args.smoke:
        parts.append("--smoke")
    if args.threads:
        parts += ["--threads", str(args.threads)]
    return shlex.join(parts)


def cmd_eval(args: argparse.Namespace) -> int:
    from agentmerge.zoo.evaluate import evaluate

    check_eval_args(args)
    _threads(args.threads)
    n = args.n or (1000 if args.split == "test" else 300)
    tasks = [t for t in args.tasks.split(",") if t] if args.tasks else None
    report = evaluate(args.checkpoint, split=args.split, n=n, tasks=tasks, batch_size=args.batch_size, quiet=args.quiet)
    for metric, value in report.metrics.items():
        print(f"{metric:<16} {value * 100:6.2f} ± {report.stderr[metric] * 100:.2f}  (n={report.count[metric]})")
    if args.json_out:
        write_report(args.json_out, json.dumps(report.to_dict(), indent=2) + "\n", "--json")
    return 0


def check_eval_args(args: argparse.Namespace) -> None:
    """Counts must be positive, and the checkpoint a loadable causal LM with a tokenizer (one-line errors)."""
    from agentmerge.errors import ConfigError
    from agentmerge.fisher import _transformers_step, check_causal_lm_folder

    for flag, value in (("--n", args.n), ("--batch-size", args.batch_size), ("--threads", args.threads)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} must be at least 1 (got {value})")
    if args.json_out:
        check_report_path(Path(args.json_out), "--json")
    check_causal_lm_folder(args.checkpoint)

    def tokenizer() -> object:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(args.checkpoint))

    _transformers_step(args.checkpoint, "load its tokenizer", tokenizer)
