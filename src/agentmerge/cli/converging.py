"""``agentmerge converge``: the convergence check of each agent (``evaluation.convergence``) on any evaluator."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from agentmerge.cli.common import check_threads, heavy_imports
from agentmerge.errors import ConfigError
from agentmerge.io.guards import jsontext
from agentmerge.io.guards.pathargs import check_paths, input_arg, output_arg
from agentmerge.io.guards.safety import check_report_path, write_report


def _converge_parser(sub: Any) -> None:
    p = sub.add_parser(
        "converge",
        help="is each agent converged? its own metric at base + s * task vector, s = 0.5, 1, 1.5, 2 (validation)",
    )
    input_arg(p, "base", help="the base model folder the agents were trained from")
    input_arg(p, "agents", nargs="+", help="agent model folders")
    p.add_argument(
        "--evaluate",
        required=True,
        metavar="SPEC",
        help="the evaluator, as in a sweep file: tasks:FILE.jsonl, lm-eval:TASKS, python:MODULE:FUNCTION, zoo, ...",
    )
    p.add_argument(
        "--metric",
        action="append",
        default=[],
        metavar="[AGENT=]METRIC",
        help="each agent's own-domain metric: METRIC for all, AGENT=METRIC for one (AGENT: its folder's name); "
        "default: the evaluator's objective",
    )
    p.add_argument(
        "--options", default="{}", metavar="JSON", help="the evaluator's options (a sweep's evaluate_options)"
    )
    p.add_argument("--scales", default="0.5,1,1.5,2", help="comma-separated scales s (must include 1 and 1.5)")
    p.add_argument("--work", help="folder for the scaled copies, one at a time (default: a temporary folder)")
    output_arg(p, "--json", dest="json_out", metavar="PATH", help="write the checks as JSON here ('-': stdout)")
    p.add_argument("--threads", type=int, default=None, help="threads of each merge and of torch in the evaluation")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_converge)


def agent_metrics(agents: list[str], given: list[str], default: str | None) -> dict[str, str]:
    """Each agent's metric from ``--metric`` entries (``METRIC`` or ``NAME=METRIC``), else ``default``."""
    names = {Path(a).name: a for a in agents}
    common, own = default, {}
    for entry in given:
        key, sep, metric = entry.rpartition("=")
        if not sep:
            common = entry
        elif key in names:
            own[names[key]] = metric
        else:
            raise ConfigError(
                f"converge: --metric {entry!r}: no agent folder named {key!r} (agents: {', '.join(names)})"
            )
    missing = [a for a in agents if a not in own and not common]
    if missing:
        raise ConfigError(f"converge: the evaluator has no default metric; pass --metric METRIC (for {missing[0]})")
    return {a: own.get(a) or str(common) for a in agents}


def _parse_scales(text: str) -> list[float]:
    try:
        return [float(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"converge: --scales {text!r} must be comma-separated numbers, e.g. 0.5,1,1.5,2") from None


def _options(text: str) -> dict[str, Any]:
    try:
        options = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"converge: --options is not JSON ({exc.msg}); e.g. '{{\"n\": 300}}'") from None
    if not isinstance(options, dict):
        raise ConfigError("converge: --options must be a JSON object, e.g. '{\"n\": 300}'")
    return options


def cmd_converge(args: argparse.Namespace) -> int:
    from agentmerge.evaluation.convergence import check_agent, check_scales, markdown
    from agentmerge.evaluation.evaluator import Context
    from agentmerge.evaluation.kinds import parse

    scales = check_scales(_parse_scales(args.scales))
    check_threads(args.threads)
    if args.work is not None and not Path(args.work).is_dir():
        raise ConfigError(f"converge: --work {args.work}: not an existing folder; create it, or leave --work out")
    if args.json_out and args.json_out != "-":
        check_report_path(Path(args.json_out).expanduser(), "--json")  # before the long part
    options = _options(args.options)
    cls, arg = parse(args.evaluate)
    check_paths(args, files=[arg, arg.rpartition(":")[0]])  # --json must not overwrite the evaluator's own file
    cls.check_options(options)
    cls.check_inputs(arg, (str(Path.cwd()),))
    metrics = agent_metrics(args.agents, args.metric, cls.objective)
    with heavy_imports():
        evaluator = cls.from_spec(arg, options, Context((str(Path.cwd()),), args.threads, args.quiet))
    log = (lambda _m: None) if args.quiet else (lambda m: print(f"converge: {m}", file=sys.stderr))
    with tempfile.TemporaryDirectory(prefix="agentmerge-converge-", dir=args.work) as tmp:
        checks = [
            check_agent(Path(args.base), Path(a), metrics[a], evaluator, Path(tmp), scales, args.threads, log)
            for a in args.agents
        ]
    text = jsontext.dumps([c.as_dict() for c in checks], indent=2) + "\n"
    if args.json_out == "-":
        print(text, end="")
        return 0
    if args.json_out:
        write_report(args.json_out, text, "--json")
    print(markdown(checks))
    return 0
