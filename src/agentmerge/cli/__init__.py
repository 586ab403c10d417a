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
"""

from __future__ import annotations

import argparse
import errno
import importlib.util
import sys
from collections.abc import Sequence

from agentmerge import __version__
from agentmerge.cli.common import heavy_imports, parse_value
from agentmerge.cli.evaluating import _eval_parser, _fisher_parser, _lm_eval_parser, _sweep_parser
from agentmerge.cli.merging import (
    _convert_parser,
    _convert_weights_parser,
    _merge_parser,
    _methods_parser,
    _probe_parser,
)
from agentmerge.errors import AgentMergeError
from agentmerge.io.safety import Terminated, interrupted_message, terminate_as_exception

__all__ = ["build_parser", "heavy_imports", "main", "parse_value"]


# --------------------------------------------------------------------------- main


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentmerge", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"agentmerge {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _merge_parser(sub)
    _probe_parser(sub)
    _methods_parser(sub)
    _fisher_parser(sub)
    _convert_parser(sub)
    _convert_weights_parser(sub)
    _lm_eval_parser(sub)
    _eval_parser(sub)
    _sweep_parser(sub)
    if importlib.util.find_spec("agentmerge_zoo.cli") is not None:
        from agentmerge_zoo.cli import register

        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with terminate_as_exception():
            return int(args.func(args))
    except AgentMergeError as e:
        print(f"agentmerge: error: {e}", file=sys.stderr)
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
