"""Command line: a thin shell over ``agentmerge.merge``, ``agentmerge.probe`` and the method table.

agentmerge merge CONFIG.yaml OUTDIR [flags that override the file]
agentmerge merge --method ram_plus --base B --model A1 --model A2 -o OUTDIR [--param r=0.1 ...]
agentmerge probe --base B A1 A2 A3 [--json out.json] [--plot out.png] [--markdown out.md]
agentmerge methods [--json]
agentmerge fisher MODEL (--texts FILE.txt | --samples N) --out DIR   (diagonal Fisher for method fisher)
agentmerge merge MERGEKIT.yaml OUTDIR [--dry-run]     (a mergekit config: it has merge_method)
agentmerge convert-config MERGEKIT.yaml               (print the native YAML equivalent)
agentmerge lm-eval OUTDIR --tasks T1,T2 [--limit N] [--include-path DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentmerge import __version__
from agentmerge.config import config_from_dict, native_config, read_yaml
from agentmerge.errors import AgentMergeError, ConfigError
from agentmerge.methods import METHODS, ParamValue
from agentmerge.safety import (
    Terminated,
    check_report_path,
    interrupted_message,
    refuse_overlap,
    refuse_report_inside_inputs,
    terminate_as_exception,
    write_report,
    write_report_with,
)


def parse_value(text: str) -> ParamValue:
    """``"0.1"`` -> 0.1, ``"3"`` -> 3, ``"true"`` -> True, anything else stays a string."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_weights(text: str) -> list[float]:
    """``"1,0.5"`` -> [1.0, 0.5]; anything that is not a number is one clear error."""
    out = []
    for i, item in enumerate(text.split(",")):
        try:
            out.append(float(item))
        except ValueError:
            raise ConfigError(
                f"--weights: value {i + 1} ({item.strip()!r}) is not a number; write e.g. 1,0.5"
            ) from None
    return out


def check_fisher_args(args: argparse.Namespace) -> None:
    """fisher's counts must be positive, and its output must not lie in (or be) an input folder."""
    if args.samples is not None and args.samples < 1:
        raise ConfigError(f"--samples must be at least 1 (got {args.samples})")
    if args.max_tokens < 1:
        raise ConfigError(f"--max-tokens must be at least 1 (got {args.max_tokens}); 0 tokens give an all-zero Fisher")
    refuse_overlap(Path(args.out), [args.model, args.tokenizer], "fisher output folder")


def parse_params(items: Sequence[str]) -> dict[str, ParamValue]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--param {item!r}: write NAME=VALUE, e.g. --param r=0.1")
        out[key.strip()] = parse_value(value)
    return out


# --------------------------------------------------------------------------- merge


def _merge_parser(sub: Any) -> None:
    p = sub.add_parser("merge", help="merge models (from a YAML config and/or flags)")
    p.add_argument("config", nargs="?", help="YAML config file")
    p.add_argument("out", nargs="?", help="output folder (or -o)")
    p.add_argument("-o", "--output", dest="output", help="output folder")
    p.add_argument("--method", help="merge method (see `agentmerge methods`)")
    p.add_argument("--base", help="base model folder or hub id")
    p.add_argument("--model", action="append", default=[], help="a model to merge (repeat)")
    p.add_argument("--weights", help="comma-separated weights, one per --model")
    p.add_argument("--fisher", action="append", default=[], help="Fisher of each --model, in order (method fisher)")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="method parameter (repeat)")
    p.add_argument("--dtype", help="output dtype for floating tensors (default: the base's)")
    p.add_argument("--max-shard-size", help="largest output file, e.g. 2GB (default 5GB)")
    p.add_argument("--seed", type=int, help="seed for random methods (default 0)")
    p.add_argument("--include", action="append", help="merge only tensors matching this glob (repeat)")
    p.add_argument("--exclude", action="append", help="copy tensors matching this glob from the base (repeat)")
    p.add_argument("--tokenizer-source", help="folder whose tokenizer files are copied (default: the base)")
    p.add_argument("--threads", type=int, help="worker threads (default: all cores)")
    p.add_argument("--max-memory", help="memory budget for chunks in flight, e.g. 1GB (default)")
    p.add_argument("--chunk-size", type=int, help="elements per chunk (default: from --max-memory)")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace an earlier agentmerge output (a folder with merge.json and only the files a merge writes)",
    )
    p.add_argument(
        "--force-any",
        action="store_true",
        help="replace whatever is at the output path (never an input, a parent of one, or the current folder)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--dry-run", action="store_true", help="check inputs and print the plan; write nothing")
    p.set_defaults(func=cmd_merge)


_FLAG_KEYS = {
    "method": "method",
    "base": "base",
    "dtype": "dtype",
    "max_shard_size": "max_shard_size",
    "seed": "seed",
    "include": "include",
    "exclude": "exclude",
    "tokenizer_source": "tokenizer_source",
    "threads": "threads",
    "max_memory": "max_memory",
    "chunk_size": "chunk_size",
}


def merge_config_data(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """The config dict (file, then flags on top) and the output folder."""
    config, out = args.config, args.out or args.output
    if config and not out and not config.endswith((".yaml", ".yml")) and not Path(config).is_file():
        config, out = None, config  # `agentmerge merge OUTDIR --method ...`
    data = _read_config_file(config) if config else {}
    for attr, key in _FLAG_KEYS.items():
        value = getattr(args, attr)
        if value is not None:
            data[key] = value
    if args.model:
        data["models"] = [{"path": m} for m in args.model]
    if args.weights:
        weights = parse_weights(args.weights)
        if len(weights) != len(data.get("models", [])):
            raise ConfigError(f"--weights has {len(weights)} values for {len(data.get('models', []))} models")
        data["models"] = [{**m, "weight": w} for m, w in zip(data["models"], weights, strict=True)]
    if args.fisher:
        if len(args.fisher) != len(data.get("models", [])):
            raise ConfigError(f"--fisher given {len(args.fisher)} times for {len(data.get('models', []))} models")
        data["models"] = [{**m, "fisher": f} for m, f in zip(data["models"], args.fisher, strict=True)]
    if args.param:
        data["params"] = {**data.get("params", {}), **parse_params(args.param)}
    if not out:
        raise ConfigError("no output folder: pass OUTDIR after the config, or -o OUTDIR")
    return data, out


def _read_config_file(path: str) -> dict[str, Any]:
    """A native config file as is; a mergekit one (it has ``merge_method``) translated, notes on stderr."""
    from agentmerge.mergekit_compat import from_mergekit, is_mergekit

    raw = read_yaml(Path(path))  # parsed once, within the size and alias bounds of agentmerge.limits
    if not is_mergekit(raw):
        return native_config(raw, Path(path))
    conv = from_mergekit(raw, path)
    for note in conv.notes:
        print(f"agentmerge: mergekit config: {note}", file=sys.stderr)
    return conv.config  # models are already {path: ...} mappings


def cmd_merge(args: argparse.Namespace) -> int:
    from agentmerge.merge import merge

    data, out = merge_config_data(args)
    cfg = config_from_dict(data, args.config or "flags")
    if args.dry_run:
        from agentmerge.dryrun import plan_merge

        plan = plan_merge(cfg, out, force=args.force, force_any=args.force_any)
        print(json.dumps(plan.to_dict(), indent=2) if args.json else plan.text())
        return 0
    result = merge(cfg, out, force=args.force, quiet=args.quiet, force_any=args.force_any)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    elif not args.quiet:
        print(
            f"merged {len(cfg.models)} models with {cfg.method} into {result.out_dir} in {result.seconds:.1f} s",
            file=sys.stderr,
        )
    return 0


# --------------------------------------------------------------------------- probe


def _probe_parser(sub: Any) -> None:
    p = sub.add_parser("probe", help="density and overlap of task vectors")
    p.add_argument("models", nargs="+", help="fine-tuned model folders")
    p.add_argument("--base", required=True, help="base model folder")
    p.add_argument("--epsilon", type=float, default=1e-5, help="update threshold (default 1e-5)")
    p.add_argument("--r", type=float, default=0.1, help="RAM+ r for the reported lambda (default 0.1)")
    p.add_argument("--alpha", type=float, default=2.0, help="RAM+ alpha for the reported lambda (default 2)")
    p.add_argument("--json", dest="json_out", help="write the full result as JSON here")
    p.add_argument("--markdown", help="write the markdown report here")
    p.add_argument("--plot", help="write the figure (PNG) here; needs matplotlib")
    p.add_argument("--threads", type=int)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_probe)


def cmd_probe(args: argparse.Namespace) -> int:
    from agentmerge.probe import probe
    from agentmerge.report import agents_table, plot_probe, probe_markdown

    check_probe_args(args)
    result = probe(
        args.base, args.models, epsilon=args.epsilon, r=args.r, alpha=args.alpha, threads=args.threads, quiet=args.quiet
    )
    print(agents_table(result.agents, result.independent))
    if args.json_out:
        write_report(args.json_out, json.dumps(result.to_dict(), indent=2) + "\n", "--json")
    if args.markdown:
        write_report(args.markdown, probe_markdown(result), "--markdown")
    if args.plot:
        write_report_with(args.plot, "--plot", lambda tmp: plot_probe(result, tmp))
    return 0


def check_probe_args(args: argparse.Namespace) -> None:
    """probe's parameters are checked as merge checks them (ram_plus's ranges), and no report lands in an input."""
    spec = METHODS["ram_plus"]
    for name, value in (("epsilon", args.epsilon), ("r", args.r), ("alpha", args.alpha)):
        param = spec.param(name)
        assert param is not None
        try:
            param.check(value, "probe")
        except ValueError as e:
            raise ConfigError(f"--{name}: {e}") from None
    if args.threads is not None and args.threads < 1:
        raise ConfigError(f"--threads must be at least 1 (got {args.threads})")
    for flag, path in (("--json", args.json_out), ("--markdown", args.markdown), ("--plot", args.plot)):
        if path:
            refuse_report_inside_inputs(Path(path), [args.base, *args.models], flag)
            check_report_path(Path(path), flag)


# --------------------------------------------------------------------------- fisher


def _fisher_parser(sub: Any) -> None:
    p = sub.add_parser("fisher", help="estimate a model's diagonal Fisher (input of method fisher)")
    p.add_argument("model", help="model folder (transformers causal LM)")
    p.add_argument("--texts", help="text file, one sample per line (default: sample from the model itself)")
    p.add_argument("--samples", type=int, help="number of samples (default: every text, or 64 sampled)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per sample (default 64)")
    p.add_argument("--tokenizer", help="tokenizer folder for --texts (default: the model's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="stored dtype")
    p.add_argument("--out", required=True, help="output folder (must hold no safetensors yet)")
    p.set_defaults(func=cmd_fisher)


def cmd_fisher(args: argparse.Namespace) -> int:
    from agentmerge.fisher import estimate_fisher

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


# --------------------------------------------------------------------------- methods


def _methods_parser(sub: Any) -> None:
    p = sub.add_parser("methods", help="list merge methods with their parameters and defaults")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_methods)


def cmd_methods(args: argparse.Namespace) -> int:
    if args.json:
        table = {
            m.name: {"summary": m.summary, "params": {p.name: {"default": p.default, "help": p.help} for p in m.params}}
            for m in METHODS.values()
        }
        print(json.dumps(table, indent=2))
        return 0
    for m in sorted(METHODS.values(), key=lambda m: m.name):
        notes = [] if m.needs_base else ["base optional"]
        notes += ["uses weights"] if m.uses_weights else []
        notes += [f"exactly {m.min_models} models"] if m.max_models == m.min_models else []
        print(f"{m.name}: {m.summary}" + (f" [{', '.join(notes)}]" if notes else ""))
        for p in m.params:
            allowed = f" one of {'/'.join(p.choices)}" if p.choices else ""
            print(f"    {p.name} = {p.default}{allowed}  — {p.help}")
    return 0


# --------------------------------------------------------------------------- mergekit configs


def _convert_parser(sub: Any) -> None:
    p = sub.add_parser("convert-config", help="print the native YAML equivalent of a mergekit config")
    p.add_argument("config", help="mergekit YAML file (with merge_method)")
    p.set_defaults(func=cmd_convert)


def cmd_convert(args: argparse.Namespace) -> int:
    from agentmerge.mergekit_compat import load_mergekit

    conv = load_mergekit(args.config)
    config_from_dict(conv.config, args.config)  # refuse what would not merge
    print(conv.to_yaml(), end="")
    return 0


# --------------------------------------------------------------------------- lm-evaluation-harness


def _lm_eval_parser(sub: Any) -> None:
    p = sub.add_parser("lm-eval", help="evaluate a checkpoint with lm-evaluation-harness (optional extra 'eval')")
    p.add_argument("checkpoint", help="model folder (e.g. a merge output)")
    p.add_argument("--tasks", required=True, help="comma-separated lm-eval task names")
    p.add_argument("--limit", type=float, help="examples per task (an int), or a fraction below 1")
    p.add_argument("--include-path", help="folder of extra task YAML files")
    p.add_argument("--num-fewshot", type=int)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", help="load dtype, e.g. bfloat16 (default: the checkpoint's)")
    p.add_argument("--json", dest="json_out", help="write the results as JSON here")
    p.set_defaults(func=cmd_lm_eval)


def cmd_lm_eval(args: argparse.Namespace) -> int:
    from agentmerge.lmeval import results_table, run_lm_eval

    limit = None if args.limit is None else (int(args.limit) if args.limit >= 1 else args.limit)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    results = run_lm_eval(
        args.checkpoint,
        tasks,
        limit=limit,
        include_path=args.include_path,
        num_fewshot=args.num_fewshot,
        batch_size=args.batch_size,
        device=args.device,
        dtype=args.dtype,
    )
    print(results_table(results))
    if args.json_out:
        write_report(args.json_out, json.dumps(results, indent=2) + "\n", "--json")
    return 0


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
    _lm_eval_parser(sub)
    if importlib.util.find_spec("agentmerge.zoo.cli") is not None:
        from agentmerge.zoo.cli import register

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
    except (KeyboardInterrupt, Terminated) as e:  # cleanup already ran on the way out
        line, status = interrupted_message(e)
        print(line, file=sys.stderr)
        return status


if __name__ == "__main__":
    sys.exit(main())
