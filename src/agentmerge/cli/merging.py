"""The merge commands: merge, probe, methods, convert-config, convert, export-gguf."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from agentmerge.cli.common import check_threads, heavy_imports, parse_params, parse_weights
from agentmerge.errors import CheckpointError, ConfigError
from agentmerge.io.cache.digests import HASH_MODES
from agentmerge.io.guards import jsontext
from agentmerge.io.guards.pathargs import check_paths, input_arg, output_arg
from agentmerge.io.guards.safety import (
    check_report_path,
    write_report,
    write_report_with,
)
from agentmerge.methods import METHODS, POST_STEP_PARAMS, Param, ParamValue, RamPlusParams

# --------------------------------------------------------------------------- merge


def _merge_parser(sub: Any) -> None:
    p = sub.add_parser("merge", help="merge models (from a YAML config and/or flags)")
    input_arg(p, "config", kind="file", nargs="?", help="YAML config file")
    output_arg(p, "out", kind="folder", nargs="?", help="output folder (or -o)")
    output_arg(p, "-o", "--output", kind="folder", dest="output", help="output folder")
    p.add_argument("--method", help="merge method (see `agentmerge methods`)")
    input_arg(p, "--base", help="base model folder or hub id (org/name, org/name@revision)")
    input_arg(
        p, "--model", action="append", default=[], help="a model to merge: folder or org/name[@revision] (repeat)"
    )
    p.add_argument("--weights", help="comma-separated weights, one per --model")
    input_arg(p, "--fisher", action="append", default=[], help="Fisher of each --model, in order (fisher methods)")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="method parameter (repeat)")
    p.add_argument("--dtype", help="output dtype for floating tensors (default: the base's)")
    p.add_argument("--max-shard-size", help="largest output file, e.g. 2GB (default 5GB)")
    p.add_argument("--seed", type=int, help="seed for random methods (default 0)")
    p.add_argument("--include", action="append", help="merge only tensors matching this glob (repeat)")
    p.add_argument("--exclude", action="append", help="copy tensors matching this glob from the base (repeat)")
    input_arg(
        p,
        "--tokenizer-source",
        help="whose tokenizer and chat template the output takes: base, an agent's index (0: the first --model) "
        "or a model folder (default: the base, or the agent that added tokens)",
    )
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
    p.add_argument(
        "--hash",
        choices=HASH_MODES,
        help="digests of the inputs in merge.json: fast (sha256 when free, else xxh3_128; default), sha256, none",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--dry-run", action="store_true", help="check inputs and print the plan; write nothing")
    p.add_argument(
        "--gguf", metavar="TYPE", help="also write model-TYPE.gguf (F16, BF16, Q8_0, Q6_K, ...) in the output"
    )
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
    """A config file (native, or mergekit translated); the notes on it (translation, deprecated keys) go to stderr."""
    from agentmerge.config.schema import read_config

    data, notes = read_config(path)
    for note in notes:
        print(f"agentmerge: note: {path}: {note}", file=sys.stderr)
    return data


def cmd_merge(args: argparse.Namespace) -> int:
    from agentmerge.config.schema import config_from_dict, input_refs
    from agentmerge.io.formats.localpath import missing_local_inputs

    data, out = merge_config_data(args)
    if args.gguf is not None:
        from agentmerge.io.output.gguf_write import check_out_type

        check_out_type(args.gguf, "--gguf")
    cfg = config_from_dict(data, args.config or "flags")
    missing = missing_local_inputs(input_refs(cfg))
    if missing:  # before the engine (torch) is imported
        raise CheckpointError("; ".join(missing))
    with heavy_imports():
        from agentmerge.engine.merge import merge
        from agentmerge.engine.merge_dryrun import plan_merge

        if cfg.spec.compiled_at is not None:
            cfg.spec.compiled_at.get()  # its compiled kernels (numba), loaded with the collector paused too
    if args.dry_run:
        plan = plan_merge(cfg, out, force=args.force, force_any=args.force_any)
        print(jsontext.dumps(plan.to_dict(), indent=2) if args.json else plan.text())
        if args.gguf and not args.json:
            print(f"gguf: also model-{args.gguf.upper()}.gguf, written from the merged folder (streamed)")
        return 0
    result = merge(
        cfg, out, force=args.force, quiet=args.quiet, force_any=args.force_any, hashing=args.hash, gguf=args.gguf
    )
    if args.json:
        print(jsontext.dumps(result.to_dict(), indent=2))
    elif not args.quiet:
        from agentmerge.engine.provenance import input_warnings
        from agentmerge.engine.render import merge_summary

        record = json.loads((result.out_dir / "merge.json").read_text())
        print(merge_summary(cfg, result, input_warnings(cfg, record)), file=sys.stderr)
    return 0


# --------------------------------------------------------------------------- probe


PROBE_FLAGS: dict[str, tuple[type, str]] = {  # the probe's --NAME flags: ram_plus parameters, their type and help
    "epsilon": (float, "update threshold"),
    "mask_dtype": (str, "grid of the update test: none, base, float32, bfloat16, float16"),
    "mask_ulps": (int, "grid rule: an update moves theta_0 by >= k ulps"),
    "epsilon_rule": (str, "fixed (--epsilon), percentile or valley, per agent and tensor"),
    "epsilon_q": (float, "percentile rule: percent counted as no update"),
    "r": (float, "RAM+ r for the reported lambda"),
    "alpha": (float, "RAM+ alpha for the reported lambda"),
}
PROBE_PARAMS = (*PROBE_FLAGS, "form", "rescale_factor")  # what the probe reads of ram_plus's record


def _ram_default(name: str) -> ParamValue:
    """ram_plus's default of parameter ``name`` (the probe's help quotes the record, never a copy)."""
    param = METHODS["ram_plus"].param(name)
    assert param is not None, name
    return param.default


def _probe_parser(sub: Any) -> None:
    p = sub.add_parser("probe", help="density and overlap of task vectors")
    input_arg(p, "models", nargs="+", help="fine-tuned model folders")
    input_arg(p, "--base", required=True, help="base model folder")
    for name, (kind, text) in PROBE_FLAGS.items():  # ram_plus's parameters; defaults: its record's
        p.add_argument(f"--{name.replace('_', '-')}", type=kind, help=f"{text} (default {_ram_default(name)})")
    p.add_argument("--seed", type=int, default=0, help="valley rule: seed of the subsample of large tensors")
    p.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help=f"a ram_plus parameter the probe reads ({', '.join(PROBE_PARAMS)}), e.g. form=authors (repeat)",
    )
    input_arg(
        p,
        "--merged",
        action="append",
        default=[],
        metavar="DIR",
        help="a model merged from these agents (repeatable): how much of each agent's update it kept",
    )
    output_arg(p, "--json", dest="json_out", help="write the full result as JSON here")
    output_arg(p, "--markdown", help="write the markdown report here")
    output_arg(p, "--plot", help="write the figure (PNG) here; needs matplotlib")
    p.add_argument("--threads", type=int)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_probe)


def cmd_probe(args: argparse.Namespace) -> int:
    with heavy_imports():
        from agentmerge.engine.probe import probe
        from agentmerge.engine.render import agents_table, plot_probe, probe_markdown, probe_rule_text, retention_table
        from agentmerge.engine.retention import retention

    ram = check_probe_args(args)
    result = probe(
        args.base, args.models, epsilon=ram.epsilon, ram=ram, threads=args.threads, quiet=args.quiet, mask=ram,
        seed=args.seed,
    )  # fmt: skip
    labels = [a.name for a in result.agents]
    kept = (
        retention(
            args.base,
            args.models,
            args.merged,
            epsilon=ram.epsilon,
            mask=ram,
            labels=labels,
            threads=args.threads,
            quiet=args.quiet,
            seed=args.seed,
        )
        if args.merged
        else []
    )
    print(probe_rule_text(result))
    print(agents_table(result.agents, result.independent))
    for line in result.notes:
        print(f"note: {line}")
    if kept:
        print("\nWhat each merge kept of each agent (<Δ, τ_i> / <τ_i, τ_i>; w.k: with exactly k others):")
        print(retention_table(kept))
    if args.json_out:
        data = result.to_dict() | ({"retention": [k.to_dict() for k in kept]} if kept else {})
        write_report(args.json_out, jsontext.dumps(data, indent=2) + "\n", "--json")
    if args.markdown:
        write_report(args.markdown, probe_markdown(result, kept), "--markdown")
    if args.plot:
        write_report_with(args.plot, "--plot", lambda tmp: plot_probe(result, tmp))
    return 0


def _probe_given(args: argparse.Namespace) -> dict[str, tuple[object, str]]:
    """The ram_plus parameters the probe's flags and ``--param`` items give: ``{name: (value, the flag)}``."""
    given: dict[str, tuple[object, str]] = {
        name: (getattr(args, name), f"--{name.replace('_', '-')}")
        for name in PROBE_FLAGS
        if getattr(args, name) is not None
    }
    for name, item in parse_params(args.param).items():
        if name not in PROBE_PARAMS:
            raise ConfigError(
                f"--param {name}: the probe reads only these ram_plus parameters: {', '.join(PROBE_PARAMS)}"
            )
        given[name] = (item, f"--param {name}")
    return given


def check_probe_args(args: argparse.Namespace) -> RamPlusParams:
    """probe's parameters, checked as merge checks them, as ram_plus's record (its defaults for the ones not given);
    and no report lands in an input.

    Flags (``--r 0.2``) and ``--param NAME=VALUE`` (``form=authors``) both set them; an error names the flag.
    """
    from agentmerge.config.param_table import resolve_record

    spec = METHODS["ram_plus"]
    checked: dict[str, ParamValue] = {}
    for name, (value, flag) in _probe_given(args).items():
        param = spec.param(name)
        assert param is not None, name
        try:
            checked[name] = param.check(value, "probe")
        except ValueError as e:
            raise ConfigError(f"{flag}: {e}") from None
    try:
        record = RamPlusParams.of(resolve_record(spec, checked, len(args.models)))
    except ValueError as e:
        raise ConfigError(f"probe: {e}") from None
    check_threads(args.threads)
    for flag, path in (("--json", args.json_out), ("--markdown", args.markdown), ("--plot", args.plot)):
        if path:
            check_report_path(Path(path), flag)
    return record


# --------------------------------------------------------------------------- methods


def _methods_parser(sub: Any) -> None:
    p = sub.add_parser("methods", help="list merge methods with their parameters and defaults")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_methods)


def cmd_methods(args: argparse.Namespace) -> int:
    if args.json:
        table = {
            m.name: {
                "summary": m.summary,
                "output_scale": m.output_scale,
                "params": {p.name: {"default": p.default, "help": p.help} for p in m.params},
            }
            for m in METHODS.values()
        }
        print(jsontext.dumps(table, indent=2))
        return 0
    for m in sorted(METHODS.values(), key=lambda m: m.name):
        notes = [] if m.needs_base else ["base optional"]
        notes += ["uses weights"] if m.uses_weights else []
        notes += [f"exactly {m.min_models} models"] if m.max_models == m.min_models else []
        notes += [f"output scale: {m.output_scale}"] if m.output_scale else []
        print(f"{m.name}: {m.summary}" + (f" [{', '.join(notes)}]" if notes else ""))
        for p in m.params:
            if p not in POST_STEP_PARAMS:  # those are listed once below; a method's own default of one here
                _print_param(p)
    print("every method (with a base model) also takes these post-steps on its merged task vector:")
    for p in POST_STEP_PARAMS:
        _print_param(p)
    return 0


def _print_param(p: Param) -> None:
    allowed = f" one of {'/'.join(p.choices)}" if p.choices else ""
    print(f"    {p.name} = {p.default}{allowed}  — {p.help}")


# --------------------------------------------------------------------------- mergekit configs


def _convert_parser(sub: Any) -> None:
    p = sub.add_parser(
        "convert-config", help="translate a mergekit config into the native YAML, or (--to mergekit) the reverse"
    )
    input_arg(
        p, "config", kind="file", help="mergekit YAML file (with merge_method); with --to mergekit, a native config"
    )
    p.add_argument(
        "--to", choices=("native", "mergekit"), default="native", help="the format to write (default: native)"
    )
    output_arg(p, "-o", "--output", help="write the YAML to this file instead of stdout")
    p.set_defaults(func=cmd_convert)


def cmd_convert(args: argparse.Namespace) -> int:
    from agentmerge.config.mergekit import load_mergekit
    from agentmerge.config.schema import config_from_dict, input_refs, read_config

    if args.to == "mergekit":
        from agentmerge.config.mergekit_export import to_mergekit

        data, notes = read_config(args.config)  # a mergekit file is read too: its import notes come first
        cfg = config_from_dict(data, args.config)
        exported = to_mergekit(cfg, args.config)
        exported.notes[:0] = notes
        text, notes = exported.to_yaml(), exported.notes
    else:
        conv = load_mergekit(args.config)
        cfg = config_from_dict(conv.config, args.config)  # refuse what would not merge
        text, notes = conv.to_yaml(), conv.notes
    if not args.output:
        print(text, end="")
        return 0
    check_paths(args, models=input_refs(cfg))  # -o must not overwrite a file of a model the config names
    write_report(args.output, text, "-o")
    for note in notes:
        print(f"agentmerge: note: {note}", file=sys.stderr)
    return 0


# --------------------------------------------------------------------------- weights conversion


def _convert_weights_parser(sub: Any) -> None:
    p = sub.add_parser(
        "convert", help="write any readable input (verl, DCP, MODEL+ADAPTER, .bin) as a safetensors model folder"
    )
    input_arg(p, "src", help="verl actor folder (or the step folder holding actor/), DCP folder, model folder")
    output_arg(p, "dst", kind="folder", help="new output folder")
    p.add_argument("--dtype", default="keep", choices=("keep", "bf16", "fp16", "fp32"), help="floating tensors' dtype")
    p.add_argument("--max-shard-size", default="5GB", help="largest output file (default 5GB)")
    input_arg(p, "--model-files", help="folder with config.json and the tokenizer (default: found beside SRC)")
    p.set_defaults(func=cmd_convert_weights)


def cmd_convert_weights(args: argparse.Namespace) -> int:
    from agentmerge.io.guards.units import parse_size

    try:
        parse_size(args.max_shard_size)
    except ValueError as e:
        raise ConfigError(f"--max-shard-size: {e}") from None
    with heavy_imports():
        from agentmerge.engine.convert import convert

    shard = args.max_shard_size
    out = convert(args.src, args.dst, dtype=args.dtype, max_shard_size=shard, model_files=args.model_files)
    print(f"wrote {args.src} as a safetensors model folder: {out}", file=sys.stderr)
    return 0


def _export_gguf_parser(sub: Any) -> None:
    p = sub.add_parser("export-gguf", help="write a model (any readable input) as one GGUF file for llama.cpp")
    input_arg(p, "src", help="model folder (e.g. a merge output), trainer checkpoint or GGUF file")
    output_arg(p, "-o", "--output", required=True, help="the .gguf file to write")
    p.add_argument("--type", default="F16", help="F32, F16 (default), BF16, Q8_0, Q6_K, Q5_1, Q5_0, Q4_1, Q4_0")
    input_arg(p, "--tokenizer-gguf", kind="file", help="copy the tokenizer metadata from this GGUF (e.g. the base's)")
    p.set_defaults(func=cmd_export_gguf)


def cmd_export_gguf(args: argparse.Namespace) -> int:
    from agentmerge.io.output.gguf_write import check_out_type

    qtype = check_out_type(args.type)
    out = Path(args.output).expanduser()
    check_report_path(out, "-o")
    with heavy_imports():
        from agentmerge.io.formats.open import open_weights
        from agentmerge.io.output.gguf_write import export_with

    tok = Path(args.tokenizer_gguf).expanduser() if args.tokenizer_gguf else None
    if tok is not None and not tok.is_file():
        raise CheckpointError(f"{tok}: --tokenizer-gguf names no file")
    n = export_with(open_weights, args.src, out, qtype, tokenizer_gguf=tok)
    print(f"wrote {args.src} as GGUF {qtype} ({n} tensors): {out}", file=sys.stderr)
    return 0
