"""Command line: a thin shell over ``agentmerge.engine.merge``, ``agentmerge.engine.probe`` and the method table.

agentmerge merge CONFIG.yaml OUTDIR [flags that override the file]
agentmerge merge --method ram_plus --base B --model A1 --model A2 -o OUTDIR [--param r=0.1 ...]
agentmerge probe --base B A1 A2 A3 [--json out.json] [--plot out.png] [--markdown out.md]
agentmerge methods [--json]
agentmerge fisher MODEL (--texts FILE.txt | --samples N) --out DIR   (diagonal Fisher for method fisher)
agentmerge merge MERGEKIT.yaml OUTDIR [--dry-run]     (a mergekit config: it has merge_method)
agentmerge convert-config MERGEKIT.yaml               (print the native YAML equivalent)
agentmerge convert-config --to mergekit CONFIG.yaml [-o FILE]   (the reverse, for the methods both tools have)
agentmerge convert SRC DST [--dtype keep|bf16|fp16|fp32]  (verl, DCP, LoRA, .bin -> a safetensors folder)
agentmerge lm-eval OUTDIR --tasks T1,T2 [--limit N] [--include-path DIR]
agentmerge sweep SWEEP.yaml --out DIR [--address ADDR] [--max-concurrent K] [--no-resume]
agentmerge search SEARCH.yaml --out DIR [same flags]   (a space searched on validation, test once: sweep/space.py)
agentmerge moe BASE --model A1 --prompts P1 --model A2 --prompts P2 -o OUT   (cli/moe_lora.py)
agentmerge extract-lora MODEL --base BASE -o OUT (--rank R | --energy E)
"""

from __future__ import annotations

import argparse
import errno
import sys
from collections.abc import Sequence
from typing import Any

from agentmerge import __version__, plugins
from agentmerge.cli.common import heavy_imports, parse_value
from agentmerge.cli.converging import _converge_parser
from agentmerge.cli.evaluating import _eval_parser, _fisher_parser, _lm_eval_parser, _sweep_parser
from agentmerge.cli.merging import (
    _convert_parser,
    _convert_weights_parser,
    _export_gguf_parser,
    _merge_parser,
    _methods_parser,
    _probe_parser,
)
from agentmerge.cli.moe_lora import register as register_moe_lora
from agentmerge.errors import AgentMergeError
from agentmerge.io.guards.pathargs import check_paths
from agentmerge.io.guards.safety import Terminated, interrupted_message, terminate_as_exception

__all__ = ["build_parser", "heavy_imports", "main", "parse_value"]


# --------------------------------------------------------------------------- main


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command-line parser; the plug-ins' commands too, unless ``argv`` names a built-in command."""
    parser = argparse.ArgumentParser(prog="agentmerge", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"agentmerge {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _merge_parser(sub)
    _probe_parser(sub)
    _methods_parser(sub)
    _fisher_parser(sub)
    _convert_parser(sub)
    _convert_weights_parser(sub)
    _export_gguf_parser(sub)
    _lm_eval_parser(sub)
    _eval_parser(sub)
    _sweep_parser(sub)
    _converge_parser(sub)
    register_moe_lora(sub)  # moe, extract-lora
    word = next((a for a in argv if not a.startswith("-")), None) if argv is not None else None
    if word is None or word not in sub.choices:
        _plugin_commands(sub)
    return parser


def _plugin_commands(sub: Any) -> None:
    """Let each installed ``agentmerge.commands`` plug-in add its subcommands (a broken one is named, and skipped)."""
    for name, target in plugins.entry_points(plugins.COMMANDS).items():
        try:
            plugins.load(plugins.COMMANDS, name, target)(sub)
        except AgentMergeError as e:
            print(f"agentmerge: warning: {e}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    try:
        check_paths(args)  # no command writes over an input (io/guards/pathargs.py)
        with terminate_as_exception():
            return int(args.func(args))
    except AgentMergeError as e:
        print(f"agentmerge: error: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:  # code the command ran (an evaluator, a plug-in) exited: never a silent success
        print(
            f"agentmerge: error: {args.command}: code it ran (an evaluator, a plug-in) called sys.exit({e.code!r}) "
            "before the command finished; its results are missing or incomplete",
            file=sys.stderr,
        )
        return 2
    except OSError as e:  # a name no file system holds, wherever it was asked about: one line, not a traceback
        if e.errno != errno.ENAMETOOLONG:
            raise
        name = str(e.filename or "")
        print(f"agentmerge: error: {name[:60]}... ({len(name)} characters): too long for a file name", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Terminated) as e:  # cleanup already ran on the way out
        line, status = interrupted_message(e)
        print(line, file=sys.stderr)
        return status


if __name__ == "__main__":
    sys.exit(main())
