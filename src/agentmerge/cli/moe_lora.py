"""Command line of the two ways past one static merge: ``moe`` (agents as experts) and ``extract-lora``.

agentmerge moe BASE --model A1 --prompts P1.txt --model A2 --prompts P2.txt -o OUT [--method ram] [--dry-run]
agentmerge moe CONFIG.yaml -o OUT                   (experts, prompts and the static merge in a file)
agentmerge extract-lora MODEL --base BASE -o OUT (--rank R | --energy E) [--extras save|skip] [--json FILE]

Arguments and configs are checked before torch is imported, so mistakes answer at once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from agentmerge.cli.common import parse_params
from agentmerge.errors import CheckpointError, ConfigError
from agentmerge.io.guards import jsontext
from agentmerge.io.guards.pathargs import input_arg, output_arg
from agentmerge.io.guards.safety import check_report_path, write_report


def register(sub: Any) -> None:
    """Add ``moe`` and ``extract-lora`` to the main parser's subcommands."""
    _moe_parser(sub)
    _extract_parser(sub)


# --------------------------------------------------------------------------- moe


def _moe_parser(sub: Any) -> None:
    p = sub.add_parser(
        "moe", help="one mixture-of-experts model whose experts are the agents (Mixtral / Qwen2-MoE / Qwen3-MoE)"
    )
    input_arg(p, "source", help="base model folder, or a moe YAML config (docs/moe-lora.md)")
    output_arg(p, "-o", "--output", kind="folder", required=True, help="output folder")
    input_arg(p, "--model", action="append", default=[], help="an agent: its MLP becomes an expert (repeat)")
    input_arg(
        p, "--prompts", kind="file", action="append", default=[], help="prompts file of each --model, in order (repeat)"
    )
    p.add_argument("--method", help="static merge of attention, embeddings, norms (default ram)")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="static merge parameter")
    input_arg(p, "--static", help="use this existing merge of the base instead of merging")
    p.add_argument("--experts-per-token", type=int, help="1 or 2 (default 2)")
    p.add_argument("--shared-expert", help="none (default), base or merged: a shared expert (Qwen2-MoE only)")
    p.add_argument("--shared-weight", type=float, help="the shared expert's share of the MLP output (default 0.5)")
    p.add_argument("--router-margin", type=float, help="mean own-expert logit margin on the prompts (default 4)")
    p.add_argument("--chat-template", action="store_true", default=None, help="wrap prompts in the chat template")
    p.add_argument("--dtype", help="output dtype (default: the base's)")
    p.add_argument("--max-shard-size", help="largest output file, e.g. 2GB (default 5GB)")
    p.add_argument("--threads", type=int, help="threads of the static merge and the router pass")
    p.add_argument("--force", action="store_true", help="replace an earlier agentmerge output")
    p.add_argument("--dry-run", action="store_true", help="check everything and print the output's size; write nothing")
    p.add_argument("--json", action="store_true", help="print the result (or the dry run) as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bars or summary")
    p.set_defaults(func=cmd_moe)


_MOE_FLAGS = {
    "static": "static",
    "experts_per_token": "experts_per_token",
    "shared_expert": "shared_expert",
    "shared_weight": "shared_weight",
    "router_margin": "router_margin",
    "chat_template": "chat_template",
    "dtype": "dtype",
    "max_shard_size": "max_shard_size",
    "threads": "threads",
}


def moe_data(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """The moe config dict (file, then flags on top) and where it came from."""
    source = args.source
    is_file = source.endswith((".yaml", ".yml")) or Path(source).is_file()
    from agentmerge.engine.moe.moe_config import merge_section, read_moe_file

    if is_file:
        data = read_moe_file(source)
    else:
        data = {"base": source}
    for attr, key in _MOE_FLAGS.items():
        if getattr(args, attr) is not None:
            data[key] = getattr(args, attr)
    if args.model:
        if len(args.prompts) != len(args.model):
            raise ConfigError(
                f"--model given {len(args.model)} times but --prompts {len(args.prompts)} times: give each agent "
                "its prompts file (one prompt a line), in the same order"
            )
        data["experts"] = [{"path": m, "prompts_file": p} for m, p in zip(args.model, args.prompts, strict=True)]
    elif args.prompts:
        raise ConfigError("--prompts without --model: give them in pairs, --model A1 --prompts P1.txt")
    merge = merge_section(data, source)
    if args.method:
        merge["method"] = args.method
    if args.param:
        merge["params"] = {**(merge.get("params") or {}), **parse_params(args.param)}
    if merge:
        data["merge"] = merge
    return data, source if is_file else "moe"


def cmd_moe(args: argparse.Namespace) -> int:
    from agentmerge.engine.moe.moe_config import moe_config_from_dict
    from agentmerge.io.formats.localpath import missing_local_inputs

    data, source = moe_data(args)
    cfg = moe_config_from_dict(data, source)
    missing = missing_local_inputs([cfg.base, *(e.path for e in cfg.experts), *([cfg.static] if cfg.static else [])])
    if missing:  # before torch is imported
        raise CheckpointError("; ".join(missing))
    if args.dry_run:
        from agentmerge.engine.moe.moe_dryrun import dry_run_text, plan_moe

        plan = plan_moe(cfg, args.output, force=args.force)
        print(jsontext.dumps(plan, indent=2) if args.json else dry_run_text(plan))
        return 0
    from agentmerge.engine.moe.build import build_moe

    result = build_moe(cfg, args.output, force=args.force, quiet=args.quiet)
    if args.json:
        print(jsontext.dumps(result.to_dict(), indent=2))
    elif not args.quiet:
        print(result.summary(), file=sys.stderr)
    return 0


# --------------------------------------------------------------------------- extract-lora


def _extract_parser(sub: Any) -> None:
    p = sub.add_parser("extract-lora", help="a model against its base as a PEFT LoRA adapter (truncated SVD)")
    input_arg(p, "model", help="the model: an agent, a merge (any folder merge reads as a model)")
    input_arg(p, "--base", required=True, help="its base model")
    output_arg(p, "-o", "--output", kind="folder", required=True, help="the adapter folder (new)")
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument("--rank", type=int, help="rank of every module (capped at its smaller dimension)")
    size.add_argument("--energy", type=float, help="per module, the smallest rank keeping this share of sum s^2")
    p.add_argument(
        "--extras",
        choices=("save", "skip"),
        default="save",
        help="changed embeddings, norms, biases: saved whole (modules_to_save; default) or left out",
    )
    p.add_argument("--dtype", default="float32", help="dtype of the LoRA factors (default float32)")
    output_arg(p, "--json", dest="json_out", metavar="FILE", help="write every module's rank and error here")
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    p.set_defaults(func=cmd_extract_lora)


def cmd_extract_lora(args: argparse.Namespace) -> int:
    if args.rank is not None and args.rank < 1:
        raise ConfigError(f"--rank must be at least 1 (got {args.rank})")
    if args.energy is not None and not 0.0 < args.energy <= 1.0:
        raise ConfigError(f"--energy must lie in (0, 1] (got {args.energy}); 1.0 keeps every singular value")
    if args.json_out:
        check_report_path(Path(args.json_out), "--json")
    from agentmerge.engine.extract_lora import extract_lora

    result = extract_lora(
        args.model,
        args.base,
        args.output,
        rank=args.rank,
        energy=args.energy,
        extras=args.extras,
        dtype=args.dtype,
        quiet=args.quiet,
    )
    if args.json_out:
        write_report(args.json_out, jsontext.dumps(result.to_dict(), indent=2) + "\n", "--json")
    if not args.quiet:
        print(result.summary(), file=sys.stderr)
    return 0
