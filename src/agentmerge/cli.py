"""Command line: a thin shell over ``agentmerge.merge``, ``agentmerge.probe`` and the method table.

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
agentmerge moe BASE --model A1 --prompts P1 --model A2 --prompts P2 -o OUT   (moe_lora_cli.py)
agentmerge extract-lora MODEL --base BASE -o OUT (--rank R | --energy E)
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from agentmerge import __version__
from agentmerge.digests import HASH_MODES
from agentmerge.errors import AgentMergeError, CheckpointError, ConfigError
from agentmerge.moe_lora_cli import register as register_moe_lora
from agentmerge.registry import METHODS
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
from agentmerge.spec import EPSILON_DEFAULT, ParamValue, check_mask


@contextlib.contextmanager
def heavy_imports() -> Iterator[None]:
    """Import torch and numba (the merge, the probe, the evaluation) without collector pauses.

    Importing them creates about a million objects that live as long as the process. With the cyclic
    garbage collector on, Python walks them again and again while they load (about 0.3 s of a 1.5 s
    start-up); after loading, ``gc.freeze`` moves them out of the collector's sight, so later collections
    stay cheap too. Commands enter this only once their arguments and config are checked, so help, the
    method list and input errors answer without torch.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


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
    p.add_argument("--base", help="base model folder or hub id (org/name, org/name@revision)")
    p.add_argument(
        "--model", action="append", default=[], help="a model to merge: folder or org/name[@revision] (repeat)"
    )
    p.add_argument("--weights", help="comma-separated weights, one per --model")
    p.add_argument("--fisher", action="append", default=[], help="Fisher of each --model, in order (fisher methods)")
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
    p.add_argument(
        "--hash",
        choices=HASH_MODES,
        help="digests of the inputs in merge.json: fast (sha256 when free, else xxh3_128; default), sha256, none",
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
    """A config file (native, or mergekit translated); the translation's notes go to stderr."""
    from agentmerge.config import read_config

    data, notes = read_config(path)
    for note in notes:
        print(f"agentmerge: mergekit config: {note}", file=sys.stderr)
    return data


def cmd_merge(args: argparse.Namespace) -> int:
    from agentmerge.config import config_from_dict, input_refs
    from agentmerge.localpath import missing_local_inputs

    data, out = merge_config_data(args)
    cfg = config_from_dict(data, args.config or "flags")
    missing = missing_local_inputs(input_refs(cfg))
    if missing:  # before the engine (torch) is imported
        raise CheckpointError("; ".join(missing))
    with heavy_imports():
        from agentmerge.dryrun import plan_merge
        from agentmerge.merge import merge

        if cfg.spec.compiled_at is not None:
            cfg.spec.compiled_at.get()  # its compiled kernels (numba), loaded with the collector paused too
    if args.dry_run:
        plan = plan_merge(cfg, out, force=args.force, force_any=args.force_any)
        print(json.dumps(plan.to_dict(), indent=2) if args.json else plan.text())
        return 0
    result = merge(cfg, out, force=args.force, quiet=args.quiet, force_any=args.force_any, hashing=args.hash)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    elif not args.quiet:
        from agentmerge.provenance import input_warnings
        from agentmerge.report import merge_summary

        record = json.loads((result.out_dir / "merge.json").read_text())
        print(merge_summary(cfg, result, input_warnings(cfg, record)), file=sys.stderr)
    return 0


# --------------------------------------------------------------------------- probe


def _probe_parser(sub: Any) -> None:
    p = sub.add_parser("probe", help="density and overlap of task vectors")
    p.add_argument("models", nargs="+", help="fine-tuned model folders")
    p.add_argument("--base", required=True, help="base model folder")
    p.add_argument(
        "--epsilon", type=float, default=EPSILON_DEFAULT, help=f"update threshold (default {EPSILON_DEFAULT:g})"
    )
    p.add_argument(
        "--mask-dtype", default="none", help="grid of the update test: none, base, float32, bfloat16, float16"
    )
    p.add_argument(
        "--mask-ulps", type=int, default=1, help="grid rule: an update moves theta_0 by >= k ulps (default 1)"
    )
    p.add_argument(
        "--epsilon-rule", default="fixed", help="fixed (--epsilon), percentile or valley, per agent and tensor"
    )
    p.add_argument("--epsilon-q", type=float, default=50.0, help="percentile rule: percent counted as no update")
    p.add_argument("--seed", type=int, default=0, help="valley rule: seed of the subsample of large tensors")
    p.add_argument("--r", type=float, default=0.1, help="RAM+ r for the reported lambda (default 0.1)")
    p.add_argument("--alpha", type=float, default=2.0, help="RAM+ alpha for the reported lambda (default 2)")
    p.add_argument("--json", dest="json_out", help="write the full result as JSON here")
    p.add_argument("--markdown", help="write the markdown report here")
    p.add_argument("--plot", help="write the figure (PNG) here; needs matplotlib")
    p.add_argument("--threads", type=int)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_probe)


def cmd_probe(args: argparse.Namespace) -> int:
    with heavy_imports():
        from agentmerge.probe import probe
        from agentmerge.report import agents_table, plot_probe, probe_markdown, probe_rule_text

    mask = check_probe_args(args)
    result = probe(
        args.base,
        args.models,
        epsilon=args.epsilon,
        r=args.r,
        alpha=args.alpha,
        threads=args.threads,
        quiet=args.quiet,
        mask=mask,
        seed=args.seed,
    )
    print(probe_rule_text(result))
    print(agents_table(result.agents, result.independent))
    if args.json_out:
        write_report(args.json_out, json.dumps(result.to_dict(), indent=2) + "\n", "--json")
    if args.markdown:
        write_report(args.markdown, probe_markdown(result), "--markdown")
    if args.plot:
        write_report_with(args.plot, "--plot", lambda tmp: plot_probe(result, tmp))
    return 0


def check_probe_args(args: argparse.Namespace) -> dict[str, ParamValue]:
    """probe's parameters are checked as merge checks them (ram_plus's ranges), and no report lands in an input.

    Returns the mask parameters, checked.
    """
    spec = METHODS["ram_plus"]
    mask: dict[str, ParamValue] = {}
    for name in ("epsilon", "mask_dtype", "mask_ulps", "epsilon_rule", "epsilon_q", "r", "alpha"):
        param = spec.param(name)
        assert param is not None
        try:
            mask[name] = param.check(getattr(args, name), "probe")
        except ValueError as e:
            raise ConfigError(f"--{name.replace('_', '-')}: {e}") from None
    try:
        check_mask(mask)
    except ValueError as e:
        raise ConfigError(f"probe: {e}") from None
    if args.threads is not None and args.threads < 1:
        raise ConfigError(f"--threads must be at least 1 (got {args.threads})")
    for flag, path in (("--json", args.json_out), ("--markdown", args.markdown), ("--plot", args.plot)):
        if path:
            refuse_report_inside_inputs(Path(path), [args.base, *args.models], flag)
            check_report_path(Path(path), flag)
    return {k: mask[k] for k in ("mask_dtype", "mask_ulps", "epsilon_rule", "epsilon_q")}


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
    p = sub.add_parser(
        "convert-config", help="translate a mergekit config into the native YAML, or (--to mergekit) the reverse"
    )
    p.add_argument("config", help="mergekit YAML file (with merge_method); with --to mergekit, a native config")
    p.add_argument(
        "--to", choices=("native", "mergekit"), default="native", help="the format to write (default: native)"
    )
    p.add_argument("-o", "--output", help="write the YAML to this file instead of stdout")
    p.set_defaults(func=cmd_convert)


def cmd_convert(args: argparse.Namespace) -> int:
    from agentmerge.config import config_from_dict, read_config
    from agentmerge.mergekit_compat import load_mergekit

    if args.to == "mergekit":
        from agentmerge.mergekit_export import to_mergekit

        data, notes = read_config(args.config)  # a mergekit file is read too: its import notes come first
        exported = to_mergekit(config_from_dict(data, args.config), args.config)
        exported.notes[:0] = notes
        text, notes = exported.to_yaml(), exported.notes
    else:
        conv = load_mergekit(args.config)
        config_from_dict(conv.config, args.config)  # refuse what would not merge
        text, notes = conv.to_yaml(), conv.notes
    if not args.output:
        print(text, end="")
        return 0
    if Path(args.output).expanduser().resolve() == Path(args.config).expanduser().resolve():
        raise ConfigError(f"{args.output}: -o names the config being converted; give another file name")
    write_report(args.output, text, "-o")
    for note in notes:
        print(f"agentmerge: note: {note}", file=sys.stderr)
    return 0


# --------------------------------------------------------------------------- weights conversion


def _convert_weights_parser(sub: Any) -> None:
    p = sub.add_parser(
        "convert", help="write any readable input (verl, DCP, MODEL+ADAPTER, .bin) as a safetensors model folder"
    )
    p.add_argument("src", help="verl actor folder (or the step folder holding actor/), DCP folder, model folder")
    p.add_argument("dst", help="new output folder")
    p.add_argument("--dtype", default="keep", choices=("keep", "bf16", "fp16", "fp32"), help="floating tensors' dtype")
    p.add_argument("--max-shard-size", default="5GB", help="largest output file (default 5GB)")
    p.add_argument("--model-files", help="folder with config.json and the tokenizer (default: found beside SRC)")
    p.set_defaults(func=cmd_convert_weights)


def cmd_convert_weights(args: argparse.Namespace) -> int:
    from agentmerge.units import parse_size

    try:
        parse_size(args.max_shard_size)
    except ValueError as e:
        raise ConfigError(f"--max-shard-size: {e}") from None
    with heavy_imports():
        from agentmerge.convert import convert

    shard = args.max_shard_size
    out = convert(args.src, args.dst, dtype=args.dtype, max_shard_size=shard, model_files=args.model_files)
    print(f"wrote {args.src} as a safetensors model folder: {out}", file=sys.stderr)
    return 0


# --------------------------------------------------------------------------- lm-evaluation-harness


def _lm_eval_parser(sub: Any) -> None:
    p = sub.add_parser("lm-eval", help="evaluate a checkpoint with lm-evaluation-harness (optional extra 'eval')")
    p.add_argument("checkpoint", help="model folder (e.g. a merge output)")
    p.add_argument("--tasks", required=True, help="comma-separated lm-eval task names")
    p.add_argument("--limit", type=float, help="examples per task (an int), or a fraction below 1")
    p.add_argument("--include-path", help="folder of extra task YAML files")
    p.add_argument("--num-fewshot", type=int)
    p.add_argument("--chat-template", action="store_true", help="wrap requests in the checkpoint's chat template")
    p.add_argument("--system", help="system instruction (the chat template's system turn)")
    p.add_argument("--fewshot-as-multiturn", action="store_true", help="few-shot examples as chat turns")
    p.add_argument("--gen-kwargs", help="generation settings, e.g. max_gen_toks=256,temperature=0")
    p.add_argument("--log-samples", metavar="DIR", help="write every prompt, response and score to DIR")
    p.add_argument("--backend", default="hf", choices=("hf", "vllm"), help="hf (default) or vllm (when installed)")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", help="load dtype, e.g. bfloat16 (default: the checkpoint's)")
    p.add_argument("--json", dest="json_out", help="write the results as JSON here")
    p.set_defaults(func=cmd_lm_eval)


def cmd_lm_eval(args: argparse.Namespace) -> int:
    from agentmerge.lmeval import LmEvalOptions, has_chat_template, results_table, run_lm_eval

    options = LmEvalOptions(
        limit=None if args.limit is None else (int(args.limit) if args.limit >= 1 else args.limit),
        include_path=args.include_path,
        num_fewshot=args.num_fewshot,
        batch_size=args.batch_size,
        device=args.device,
        dtype=args.dtype,
        chat_template=args.chat_template,
        system=args.system,
        fewshot_as_multiturn=args.fewshot_as_multiturn,
        gen_kwargs=args.gen_kwargs,
        backend=args.backend,
        log_samples=args.log_samples,
    )
    if not args.chat_template and has_chat_template(args.checkpoint):
        print(
            f"agentmerge: note: {args.checkpoint} has a chat template, not used; pass --chat-template "
            "(instruct models usually need it for generative tasks)",
            file=sys.stderr,
        )
    results = run_lm_eval(args.checkpoint, [t.strip() for t in args.tasks.split(",") if t.strip()], options)
    print(results_table(results))
    for path in results.get("samples_files", []):
        print(f"samples: {path}")
    if args.json_out:
        write_report(args.json_out, json.dumps(results, indent=2) + "\n", "--json")
    return 0


# --------------------------------------------------------------------------- eval on the user's own tasks


def _eval_parser(sub: Any) -> None:
    p = sub.add_parser("eval", help="score checkpoints on your own tasks (JSONL) or the zoo suite; greedy, batched")
    p.add_argument("checkpoints", nargs="+", help="model folders: BASE, then specialists and merges (merge.json)")
    p.add_argument("--tasks", help="FILE.jsonl of prompts and references (docs/evaluate.md); with --suite zoo: names")
    p.add_argument("--suite", choices=("zoo",), help="the zoo's held-out suite instead of a task file (zoo models)")
    p.add_argument("--no-chat-template", action="store_true", help="use prompts as written, not in the chat template")
    p.add_argument("--system", help="system prompt (overrides the task file's)")
    p.add_argument("--samples", type=int, default=0, metavar="N", help="show N prompts with output per task")
    p.add_argument("--limit", type=int, help="first N examples of each task")
    p.add_argument("--max-new-tokens", type=int, help="override every example's max_new_tokens")
    p.add_argument("--batch-size", type=int, default=None, help="prompts per generate call (default 16; zoo 250)")
    p.add_argument("--device", default="cpu", help="torch device, e.g. cuda (default cpu)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"), help="compute dtype")
    p.add_argument("--json", dest="json_out", metavar="PATH", help="write the scores as JSON here ('-': stdout)")
    p.add_argument("--markdown", metavar="PATH", help="write the markdown table here")
    p.add_argument("--split", default="test", choices=("val", "test"), help="zoo suite: split")
    p.add_argument("--n", type=int, default=None, help="zoo suite: prompts per task (default 1000 test, 300 val)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    if args.suite == "zoo":
        with heavy_imports():
            from agentmerge.zoo.cli import cmd_eval as zoo_eval
            from agentmerge.zoo.evaluate import evaluate as _  # noqa: F401  (torch, transformers)

        args.batch_size = args.batch_size or 250
        return zoo_eval(args)
    if not args.tasks:
        raise ConfigError("eval: pass --tasks FILE.jsonl (your prompts and references) or --suite zoo")
    from agentmerge.taskfile import load_tasks

    examples = load_tasks(args.tasks)  # a mistake in the file is refused before any model loads
    with heavy_imports():
        import torch

        from agentmerge.evaluation import evaluate
        from agentmerge.report import eval_markdown
    if args.threads:
        torch.set_num_threads(args.threads)
    run = evaluate(
        args.checkpoints,
        examples,
        chat_template=not args.no_chat_template,
        system=args.system,
        batch_size=args.batch_size or 16,
        samples=args.samples,
        limit=args.limit,
        max_new_tokens=args.max_new_tokens,
        device=args.device,
        dtype=args.dtype,
        quiet=args.quiet,
    )
    run.task_file = str(args.tasks)
    text = eval_markdown(run)
    if args.json_out == "-":
        print(json.dumps(run.to_dict(), indent=2))
    else:
        print(text, end="")
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(run.to_dict(), indent=2) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(text)
    return 0


# --------------------------------------------------------------------------- sweeps


def _sweep_parser(sub: Any) -> None:
    p = sub.add_parser("sweep", help="merge-and-evaluate sweep on Ray (pip install 'agentmerge[sweep]')")
    p.add_argument("config", help="sweep YAML file (base, models, methods, evaluate, ...)")
    p.add_argument("--out", required=True, help="folder for results.jsonl, results.md and kept merges")
    p.add_argument("--address", help="join this Ray cluster (default: start Ray on this machine)")
    p.add_argument("--max-concurrent", type=int, help="trials in flight at most (default: CPUs / cpus per trial)")
    p.add_argument(
        "--resume", action=argparse.BooleanOptionalAction, default=True, help="skip recorded trials (default)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    from agentmerge.sweep.run import run_sweep
    from agentmerge.sweep.spec import load_sweep

    if args.max_concurrent is not None and args.max_concurrent < 1:
        raise ConfigError(f"--max-concurrent must be at least 1 (got {args.max_concurrent})")
    cfg = load_sweep(args.config)
    outcome = run_sweep(
        cfg, args.out, source=args.config, address=args.address, max_concurrent=args.max_concurrent,
        resume=args.resume, quiet=args.quiet,
    )  # fmt: skip
    best = outcome.best
    summary = (
        f"sweep: {len(outcome.records)} trials recorded ({outcome.ran} run now, {outcome.skipped} already done, "
        f"{outcome.failed} failed now) in {outcome.seconds:.1f} s; results in {Path(args.out) / 'results.md'}"
    )
    if best is not None:
        value = best["metrics"].get(outcome.objective or "")
        summary += f"\nbest: {best['method']} {best['params']} on {best['models']}: {outcome.objective} = {value}"
    print(summary, file=sys.stderr)
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
    _convert_weights_parser(sub)
    _lm_eval_parser(sub)
    _eval_parser(sub)
    _sweep_parser(sub)
    register_moe_lora(sub)  # moe, extract-lora
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
