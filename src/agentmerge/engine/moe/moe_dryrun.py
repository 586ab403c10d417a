"""``agentmerge moe --dry-run``: every check of a real run, the output's size and files, nothing written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentmerge.engine.moe.arch import ARCHITECTURES
from agentmerge.engine.moe.build import STATIC, base_family, check_static, moe_inputs, opened_inputs, prompt_tokens
from agentmerge.engine.moe.moe_config import MoeConfig
from agentmerge.engine.moe.moe_plan import make_plan
from agentmerge.io.formats.checkpoint import Checkpoint
from agentmerge.io.formats.tensorfile import dtype_from_name
from agentmerge.io.guards.safety import check_output_target, check_writable_parent
from agentmerge.io.output.shards import plan_shards


def plan_moe(cfg: MoeConfig, out: str | Path, *, force: bool = False) -> dict[str, Any]:
    """The MoE ``build_moe`` would write at ``out``: architecture, tensors, bytes, files, the static merge's size."""
    target = Path(out)
    check_output_target(target, moe_inputs(cfg), force=force)
    check_writable_parent(target)
    names = base_family(cfg)
    with opened_inputs(cfg) as (base, agents):
        static = _static_plan(cfg, target)
        dense = Checkpoint(cfg.static) if cfg.static else base
        if dense is not base:
            check_static(dense, base)
        dtype = dtype_from_name(cfg.merge.dtype) if cfg.merge.dtype else None
        plan = make_plan(dense.tensors, names, len(agents), cfg.shared_expert, cfg.shared_weight, dtype)
        if dense is not base:
            dense.close()
        tokens = prompt_tokens(cfg, base)
    shards = plan_shards([s.planned for s in plan.slots], cfg.merge.shard_bytes)
    return {
        "out_dir": str(target.resolve()),
        "architecture": ARCHITECTURES[names.family],
        "layers": len(plan.layers),
        "experts": [
            {"name": e.name, "path": e.path, "prompts": len(e.prompts), "tokens": sum(len(t) for t in ids)}
            for e, ids in zip(cfg.experts, tokens, strict=True)
        ],
        "settings": cfg.record(),
        "tensors": len(plan.slots),
        "bytes": sum(s.size for s in shards),
        "files": [{"name": s.file_name, "bytes": s.size} for s in shards],
        "static_merge": static,
    }


def _static_plan(cfg: MoeConfig, target: Path) -> dict[str, Any]:
    """The static merge's dry run (its own refusals included), or the folder given."""
    if cfg.static:
        return {"folder": cfg.static}
    from agentmerge.engine.merge_dryrun import plan_merge

    merge = plan_merge(cfg.merge, target / STATIC, probe=False)
    return {"method": cfg.merge.method, "temporary_bytes": merge.bytes_written}


def dry_run_text(plan: dict[str, Any]) -> str:
    """The dry run for a reader."""
    settings = plan["settings"]
    shared = settings["shared_expert"]
    shared_text = "no shared expert" if shared == "none" else f"the {shared} MLP as shared expert"
    static = plan["static_merge"]
    static_text = (
        f"static merge: {static['method']}, {_size(static['temporary_bytes'])} written inside the hidden "
        "output folder and deleted at the end"
        if "method" in static
        else f"static merge: the existing folder {static['folder']}"
    )
    experts = ", ".join(f"{e['name']} ({e['prompts']} prompts, {e['tokens']} tokens)" for e in plan["experts"])
    return "\n".join(
        [
            f"moe dry run: {plan['architecture']}, {len(plan['experts'])} experts, top-"
            f"{settings['experts_per_token']} routing, {shared_text}, {plan['layers']} layers",
            f"  output: {plan['tensors']} tensors, {_size(plan['bytes'])} in {len(plan['files'])} file(s) "
            f"at {plan['out_dir']}",
            f"  {static_text}",
            f"  experts: {experts}",
            "  nothing written",
        ]
    )


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.2f} MB"
