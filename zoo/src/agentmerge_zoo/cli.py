"""Command-line pieces of the zoo: ``agentmerge zoo build``, ``zoo bench`` and ``zoo many``.

The main ``agentmerge`` parser calls :func:`register` to add these subcommands (entry point
``agentmerge.commands: zoo``); ``eval --suite zoo`` is the evaluator plug-in of ``suite``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentmerge.api import input_arg, output_arg
from agentmerge_zoo.cli_common import (
    DEFAULT_WORK,
    DEFAULT_ZOO,
    common_options,
    set_threads,
    steps_option,
    zoo_config,
)

if TYPE_CHECKING:
    from agentmerge.api import RaySession
    from agentmerge_zoo.build import Logger

CORE_METHODS = ("linear", "task_arithmetic", "ties", "dare_ties", "ram", "ram_plus")


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add ``zoo {build,bench}`` to the main parser's subcommands (``eval`` is the main parser's own)."""
    zoo = subparsers.add_parser("zoo", help="build the CPU agent zoo and benchmark merge methods on it")
    zoo_sub = zoo.add_subparsers(dest="zoo_command", required=True)
    _build_parser(zoo_sub)
    _bench_parser(zoo_sub)
    _many_parser(zoo_sub)
    from agentmerge_zoo.check_cli import check_parser
    from agentmerge_zoo.real.cli import register_real

    check_parser(zoo_sub)

    register_real(zoo_sub)


def _build_parser(sub: Any) -> None:
    p = sub.add_parser("build", help="pretrain the base and RL-train one agent per domain (cached, resumable)")
    output_arg(p, "--out", kind="into", default=DEFAULT_ZOO, help=f"zoo folder (default {DEFAULT_ZOO})")
    p.add_argument("--seed", type=int, default=0, help="pipeline seed (default 0)")
    p.add_argument("--regime", default="bf16", help="precision regime of the agents (default bf16; see docs/zoo.md)")
    p.add_argument(
        "--suite",
        choices=("core", "six"),
        default="core",
        help="core: code, tool, memory (default); six: also math, sort, search, on their own base (under OUT/six)",
    )
    steps_option(p)
    common_options(p)
    p.set_defaults(func=cmd_build)


def _bench_parser(sub: Any) -> None:
    p = sub.add_parser("bench", help="merge the zoo agents with every method and write docs/results.{md,json}")
    input_arg(p, "--zoo", default=DEFAULT_ZOO, help=f"zoo folder (default {DEFAULT_ZOO})")
    p.add_argument("--work", default=DEFAULT_WORK, help=f"merges and evaluation cache (default {DEFAULT_WORK})")
    output_arg(p, "--docs", kind="into", default="docs", help="where results.md and results.json go (default docs)")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated pipeline seeds (default 0,1,2)")
    p.add_argument(
        "--regimes",
        default=None,
        help="comma-separated precision regimes (bf16, fp32_bf16, fp32_fp32, paper_like; default all; "
        "with --smoke: bf16,fp32_fp32,paper_like); results of other regimes already in results.json are kept",
    )
    p.add_argument("--no-pairs", action="store_true", help="skip the three 2-agent merges")
    p.add_argument("--no-ablation", action="store_true", help="skip the RAM+ ablation of the paper-like regime")
    p.add_argument(
        "--methods",
        default=None,
        help="comma-separated method labels of the 3-agent table (default: all; 'core' = "
        + ",".join(CORE_METHODS)
        + ")",
    )
    p.add_argument(
        "--variants",
        action="store_true",
        help="also the RAM variants of docs/methods.md (labels v_*: mask grids, valley epsilon, elected signs, "
        "grouped RAM+, ram_fisher), compared with RAM, RAM+ and the best baseline",
    )
    p.add_argument("--render-only", action="store_true", help="only re-render results.md from results.json")
    p.add_argument(
        "--max-concurrent",
        type=int,
        default=None,
        help="merge trials in flight at once (default: cores / --threads); each trial uses --threads CPUs",
    )
    p.add_argument(
        "--no-fair",
        action="store_true",
        help="only task arithmetic's lambda tuned (the older protocol) instead of a defaults and a tuned table",
    )
    p.add_argument("--no-check", action="store_true", help="skip the convergence check of the agents")
    p.add_argument("--check-n", type=int, default=None, help="validation prompts per task of the check (default 3000)")
    steps_option(p)
    common_options(p)
    p.set_defaults(func=cmd_bench)


def _many_parser(sub: Any) -> None:
    p = sub.add_parser(
        "many", help="the many-agent study: merges of 2, 3, 4 and 6 agents of the six-domain zoo (docs/many)"
    )
    input_arg(
        p, "--zoo", default=DEFAULT_ZOO, help=f"zoo folder; the six-domain zoo lives in ZOO/six (default {DEFAULT_ZOO})"
    )
    p.add_argument("--work", default=DEFAULT_WORK, help=f"merges and evaluation cache (default {DEFAULT_WORK})")
    output_arg(
        p,
        "--docs",
        kind="into",
        default="docs/many",
        help="where results.{md,json} and many-agents.png go (default docs/many)",
    )
    p.add_argument("--seeds", default="0,1,2", help="comma-separated pipeline seeds (default 0,1,2)")
    p.add_argument("--regime", default="fp32_bf16", help="precision regime of the agents (default fp32_bf16)")
    p.add_argument("--sizes", default="2,3,4,6", help="comma-separated numbers of agents per merge (default 2,3,4,6)")
    p.add_argument("--per-size", type=int, default=5, help="subsets per size, the same in every seed (default 5)")
    p.add_argument("--render-only", action="store_true", help="only re-render results.md from results.json")
    p.add_argument("--max-concurrent", type=int, default=None, help="merge trials in flight at once")
    p.add_argument(
        "--no-fair",
        action="store_true",
        help="only task arithmetic's lambda and RAM's scale tuned (the older protocol) instead of a defaults and a "
        "tuned table",
    )
    steps_option(p)
    common_options(p)
    p.set_defaults(func=cmd_many)


def cmd_many(args: argparse.Namespace) -> int:
    from agentmerge_zoo.build import stderr_logger
    from agentmerge_zoo.many import ManyPlan, run_many, smoke_plan
    from agentmerge_zoo.many_report import aggregate_many, write_many

    docs = Path(args.docs)
    if args.render_only:
        saved = json.loads((docs / "results.json").read_text())
        res = aggregate_many(saved["records"], saved["meta"]) | {"records": saved["records"]}
        print(f"wrote {write_many(res, docs)[1]}")
        return 0
    seeds = tuple(int(s) for s in args.seeds.split(",") if s.strip())
    sizes = tuple(int(s) for s in args.sizes.split(",") if s.strip())
    plan = smoke_plan(seeds) if args.smoke else ManyPlan(seeds=seeds, sizes=sizes, per_size=args.per_size)
    plan = replace(plan, fair=not args.no_fair)
    threads = set_threads(args.threads)
    started = time.perf_counter()
    cfg = zoo_config(args.smoke, args.regime, "six", args.steps)
    log = stderr_logger(args.quiet)
    records = run_many(cfg, plan, Path(args.zoo), Path(args.work), log, threads, args.max_concurrent, args.quiet)
    meta = {"command": _many_command(args), "regime": args.regime, "config": cfg.to_dict(), "threads": threads}
    meta["plan"] = {"sizes": plan.sizes, "per_size": plan.per_size, "grid": plan.grid, "ta_grid": plan.ta_grid}
    meta["plan"] |= {"n_val": plan.n_val}
    meta["plan"] |= {"n_test": plan.n_test, "methods": [r.label for r in plan.runs()], "fair": plan.fair}
    meta["steps"] = {r.domain: r.steps for r in cfg.recipes}
    meta["wall_seconds"] = time.perf_counter() - started
    json_path, md_path = write_many(aggregate_many(records, meta) | {"records": records}, docs)
    print(f"wrote {md_path} and {json_path}", flush=True)
    return 0


def _many_command(args: argparse.Namespace) -> str:
    parts = ["agentmerge", "zoo", "many", "--zoo", args.zoo, "--work", args.work, "--docs", args.docs]
    parts += ["--seeds", args.seeds, "--regime", args.regime, "--sizes", args.sizes, "--per-size", str(args.per_size)]
    parts += ["--no-fair"] if args.no_fair else []
    parts += ["--steps", args.steps] if args.steps else []
    parts += ["--smoke"] if args.smoke else []
    parts += ["--threads", str(args.threads)] if args.threads else []
    return shlex.join(parts)


def _regimes(args: argparse.Namespace) -> list[str]:
    from agentmerge_zoo.config import REGIMES

    default = "bf16,fp32_fp32,paper_like" if args.smoke else ",".join(REGIMES)
    names = [r.strip() for r in (args.regimes or default).split(",") if r.strip()]
    unknown = [r for r in names if r not in REGIMES]
    if unknown:
        from agentmerge import ConfigError

        raise ConfigError(f"--regimes: unknown regime(s) {', '.join(unknown)}; use {', '.join(REGIMES)}")
    return names


def cmd_build(args: argparse.Namespace) -> int:
    from agentmerge_zoo.build import build_zoo, stderr_logger

    threads = set_threads(args.threads)
    paths = build_zoo(
        zoo_config(args.smoke, args.regime, args.suite, args.steps),
        Path(args.out),
        args.seed,
        threads=threads,
        log=stderr_logger(args.quiet),
    )
    for name, path in paths.items():
        print(f"{name}\t{path}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from agentmerge import ConfigError
    from agentmerge_zoo.bench_sweeps import bench_session
    from agentmerge_zoo.build import stderr_logger
    from agentmerge_zoo.regime_report import render_combined_from_json

    docs = Path(args.docs)
    if args.render_only:
        print(f"wrote {render_combined_from_json(docs)}")
        return 0
    if args.max_concurrent is not None and args.max_concurrent < 1:
        raise ConfigError(f"--max-concurrent must be at least 1 (got {args.max_concurrent})")
    if args.methods:
        method_labels(args.methods)  # an unknown label fails here, before anything runs
    threads = set_threads(args.threads)
    seeds = tuple(int(s) for s in args.seeds.split(",") if s.strip())
    log = stderr_logger(args.quiet)
    with bench_session(threads, args.quiet) as session:  # one Ray runtime for every regime's sweeps
        for regime in _regimes(args):
            _bench_regime(args, regime, seeds, threads, log, session)
    return 0


def _bench_regime(
    args: argparse.Namespace, regime: str, seeds: tuple[int, ...], threads: int, log: Logger, session: RaySession
) -> None:
    """Bench one regime and write it into the docs folder's results (the other regimes there are kept)."""
    from agentmerge_zoo.bench import run_bench
    from agentmerge_zoo.regime_report import load_combined, write_combined
    from agentmerge_zoo.results import aggregate

    docs = Path(args.docs)
    cfg = zoo_config(args.smoke, regime, steps=args.steps)
    started = time.perf_counter()
    plan = _plan(args.smoke, seeds, regime, not args.no_pairs)
    plan = replace(plan, fair=not args.no_fair, check=not args.no_check)
    plan = replace(plan, check_n=args.check_n or plan.check_n)
    if args.methods:
        keep = method_labels(args.methods)
        plan = replace(plan, methods=tuple(m for m in plan.methods if m.label in keep))
    if getattr(args, "variants", False):
        from agentmerge_zoo.benchplan import VARIANT_RUNS

        plan = replace(plan, methods=plan.methods + VARIANT_RUNS)
    if args.no_ablation:
        plan = replace(plan, ablation=())
    zoo, work = Path(args.zoo), Path(args.work)
    records = run_bench(cfg, plan, zoo, work, log, threads, args.max_concurrent, args.quiet, session)
    meta = {
        "command": _command(args),
        "regime": regime,
        "config": cfg.to_dict(),
        "threads": threads,
        "wall_seconds": time.perf_counter() - started,
    }
    with _docs_lock(docs):  # several bench processes (e.g. one per seed) may share a docs folder
        combined = load_combined(docs)
        combined["regimes"][regime] = aggregate(records, meta)
        json_path, md_path = write_combined(combined, docs)
    print(f"[{regime}] wrote {md_path} and {json_path}", flush=True)


@contextlib.contextmanager
def _docs_lock(docs: Path) -> Iterator[None]:
    import fcntl

    docs.mkdir(parents=True, exist_ok=True)
    with (docs / ".results.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def method_labels(text: str) -> set[str]:
    """``--methods``: 'core' or comma-separated labels of the 3-agent table; an unknown one is a ConfigError."""
    from agentmerge import ConfigError
    from agentmerge.api import did_you_mean
    from agentmerge_zoo.benchplan import METHOD_RUNS

    if text.strip() == "core":
        return set(CORE_METHODS)
    known = [m.label for m in METHOD_RUNS]
    labels = {m.strip() for m in text.split(",") if m.strip()}
    for label in sorted(labels):
        if label not in known:
            raise ConfigError(
                f"--methods: no method labelled {label!r}{did_you_mean(label, known)}; known: {', '.join(known)}"
            )
    if not labels:
        raise ConfigError("--methods: name at least one method label (or 'core')")
    return labels


def _plan(smoke: bool, seeds: tuple[int, ...], regime: str, pairs: bool) -> Any:
    """The full plan (the RAM+ ablation in the paper-like regime), or a small one that exercises each piece."""
    from agentmerge_zoo.benchplan import METHOD_RUNS, BenchPlan, ram_plus_ablation

    ablation = ram_plus_ablation() if regime == "paper_like" else ()
    if not smoke:
        return BenchPlan(seeds=seeds, ablation=ablation, pairs=pairs)
    keep = {"linear", "task_arithmetic", "ties", "fisher", "ram", "ram_plus"}
    methods = tuple(m for m in METHOD_RUNS if m.label in keep)
    small = tuple(r for r in ablation if r.label in {"ram_plus_r0_a1", "ram_plus_authors_R1.2"})
    return BenchPlan(
        seeds=seeds,
        check_n=8,
        fisher_prompts=4,
        scales=(0.5, 1.0),
        methods=methods,
        ablation=small,
        pairs=pairs,
        pair_methods=("linear", "task_arithmetic", "ram"),
    )


def _command(args: argparse.Namespace) -> str:
    parts = ["agentmerge", "zoo", "bench", "--zoo", args.zoo, "--work", args.work, "--docs", args.docs]
    parts += ["--seeds", args.seeds]
    if args.regimes:
        parts += ["--regimes", args.regimes]
    if getattr(args, "variants", False):
        parts.append("--variants")
    if args.no_pairs:
        parts.append("--no-pairs")
    if args.methods:
        parts += ["--methods", args.methods]
    if args.no_ablation:
        parts.append("--no-ablation")
    parts += ["--no-fair"] if args.no_fair else []
    parts += ["--no-check"] if args.no_check else []
    parts += ["--check-n", str(args.check_n)] if args.check_n else []
    parts += ["--steps", args.steps] if args.steps else []
    if args.smoke:
        parts.append("--smoke")
    if args.threads:
        parts += ["--threads", str(args.threads)]
    if args.max_concurrent:
        parts += ["--max-concurrent", str(args.max_concurrent)]
    return shlex.join(parts)
