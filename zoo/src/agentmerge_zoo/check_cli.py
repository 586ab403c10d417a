"""``agentmerge zoo check``: the convergence check of a regime's agents, and with ``--rounds`` the loop that gives
the failing ones more steps (``converge.py``), on its own (``zoo bench`` runs the check as a stage too).

Prints the rounds' table and, last, ``steps: code=..,tool=..,memory=..`` (what ``zoo bench --steps`` takes; the
status is 0 whatever the verdicts, as for ``agentmerge converge``);
writes ``--out`` (default ``WORK/{regime}/convergence.json``; ``--suite six``, the many-agent study's zoo:
``WORK/many/{regime}/convergence.json``) and its Markdown next to it.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any


def check_parser(sub: Any) -> None:
    from agentmerge.api import input_arg, output_arg
    from agentmerge_zoo.checksizes import CHECK_N, GROWTH
    from agentmerge_zoo.cli_common import DEFAULT_WORK, DEFAULT_ZOO, common_options, steps_option

    p = sub.add_parser(
        "check",
        help="the convergence check of a regime's agents (own domain at base + s*tau); --rounds gives failing "
        "agents more steps until they pass",
    )
    input_arg(p, "--zoo", default=DEFAULT_ZOO, help=f"zoo folder (default {DEFAULT_ZOO})")
    p.add_argument("--work", default=DEFAULT_WORK, help=f"evaluation cache and scratch (default {DEFAULT_WORK})")
    p.add_argument("--regime", default="bf16", help="precision regime of the agents (default bf16)")
    p.add_argument(
        "--suite",
        choices=("core", "six"),
        default="core",
        help="core: the code, tool and memory agents (default); six: the six-domain zoo of `zoo many` (ZOO/six)",
    )
    p.add_argument("--seeds", default="0,1,2", help="comma-separated pipeline seeds (default 0,1,2)")
    p.add_argument("--n", type=int, default=None, help=f"validation prompts per task (default {CHECK_N})")
    p.add_argument("--rounds", type=int, default=0, help="extensions at most (default 0: only check)")
    p.add_argument(
        "--growth", type=float, default=GROWTH, help=f"an extension adds growth x the steps (default {GROWTH:g})"
    )
    output_arg(p, "--out", default=None, help="the rounds as JSON (default WORK/{regime}/convergence.json)")
    steps_option(p)
    common_options(p)
    p.set_defaults(func=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    from agentmerge import ConfigError
    from agentmerge_zoo.build import stderr_logger
    from agentmerge_zoo.checksizes import CHECK_N
    from agentmerge_zoo.cli_common import set_threads, zoo_config
    from agentmerge_zoo.config import regime_dir
    from agentmerge_zoo.converge import converge, steps_text
    from agentmerge_zoo.converge_report import rounds_lines, write_rounds

    if args.rounds < 0 or args.growth <= 0 or (args.n is not None and args.n < 2):
        raise ConfigError("zoo check: --rounds must be >= 0, --growth > 0 and --n >= 2")
    seeds = tuple(int(s) for s in args.seeds.split(",") if s.strip())
    threads = set_threads(args.threads)
    cfg = zoo_config(args.smoke, args.regime, args.suite, args.steps)
    n = args.n or (8 if args.smoke else CHECK_N)
    work = Path(args.work)
    log = stderr_logger(args.quiet)
    final, history = converge(
        cfg, seeds, Path(args.zoo), work, log, n=n, rounds=args.rounds, growth=args.growth, threads=threads
    )
    out = Path(args.out) if args.out else regime_dir(cfg, work) / "convergence.json"
    md = write_rounds(out, args.regime, history, steps_text(final), _check_command(args))
    print("\n".join(rounds_lines(args.regime, history)))
    print(f"wrote {out} and {md}")
    print(f"steps: {steps_text(final)}", flush=True)
    if history[-1]["failing"]:
        print(f"still failing the check: {', '.join(history[-1]['failing'])}")
    return 0


def _check_command(args: argparse.Namespace) -> str:
    parts = ["agentmerge", "zoo", "check", "--zoo", args.zoo, "--work", args.work, "--regime", args.regime]
    parts += ["--suite", args.suite] if args.suite != "core" else []
    parts += ["--seeds", args.seeds, "--rounds", str(args.rounds), "--growth", f"{args.growth:g}"]
    parts += ["--n", str(args.n)] if args.n else []
    parts += ["--steps", args.steps] if args.steps else []
    parts += ["--smoke"] if args.smoke else []
    parts += ["--threads", str(args.threads)] if args.threads else []
    return shlex.join(parts)
