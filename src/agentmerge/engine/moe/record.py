"""What an MoE output says about itself: the result, ``merge.json``, the model card, the stderr summary."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentmerge._version import __version__
from agentmerge.engine.moe.moe_config import MoeConfig
from agentmerge.engine.moe.router import Router
from agentmerge.engine.provenance import input_ref
from agentmerge.io.guards import jsontext


@dataclass
class MoeResult:
    out_dir: Path
    architecture: str
    experts: list[dict[str, Any]]  # name, path, prompts, tokens
    routers: list[Router]
    nbytes: int
    seconds: float
    method: str  # the static merge's

    def router_record(self) -> list[dict[str, Any]]:
        return [
            {"layer": i, "scale": r.scale, "own_share": dict(zip(self._names, r.own_share, strict=True))}
            for i, r in enumerate(self.routers)
        ]

    @property
    def _names(self) -> list[str]:
        return [str(e["name"]) for e in self.experts]

    def to_dict(self) -> dict[str, Any]:
        return {
            "out_dir": str(self.out_dir),
            "architecture": self.architecture,
            "experts": self.experts,
            "router": self.router_record(),
            "bytes": self.nbytes,
            "seconds": self.seconds,
            "static_method": self.method,
        }

    def summary(self) -> str:
        first = self.routers[0].own_share
        mean = [statistics.mean(r.own_share[i] for r in self.routers) for i in range(len(self.experts))]
        shares = ", ".join(f"{n} {a:.2f} / {b:.2f}" for n, a, b in zip(self._names, first, mean, strict=True))
        return "\n".join(
            [
                f"moe: {self.architecture} with {len(self.experts)} experts over {len(self.routers)} layers, "
                f"{self.nbytes / 1e6:.1f} MB in {self.out_dir} ({self.seconds:.1f} s)",
                f"  own share of each agent's prompt tokens (top-1 expert is its own), first layer / mean: {shares}",
            ]
        )


def merge_record(cfg: MoeConfig, result: MoeResult, static: dict[str, Any] | None) -> str:
    """``merge.json`` of an MoE: what it is, its experts, each layer's router, and the static merge's own record."""
    record = {
        "agentmerge_version": __version__,
        "kind": "moe",
        "architecture": result.architecture,
        "base": input_ref(cfg.base),
        "experts": [{**e, "path": input_ref(str(e["path"]))} for e in result.experts],
        "settings": cfg.record() | {"static": input_ref(cfg.static) if cfg.static else None},
        "router": {
            "mode": "hidden",
            "rows": "mean direction of each agent's prompt tokens at each layer's MLP input, through the MoE itself",
            "layers": result.router_record(),
        },
        "static_merge": static,
        "bytes": result.nbytes,
        "seconds": round(result.seconds, 3),
    }
    return jsontext.dumps(record, indent=2) + "\n"


def model_card(cfg: MoeConfig, result: MoeResult) -> str:
    """README.md: what the MoE is made of and how its router was set."""
    source = f"the merge at `{cfg.static}`" if cfg.static else f"a `{cfg.merge.method}` merge of the agents"
    shared = {
        "none": "no shared expert",
        "base": f"the base's MLP as a shared expert ({cfg.shared_weight:g} of the MLP output)",
        "merged": f"the static merge's MLP as a shared expert ({cfg.shared_weight:g} of the MLP output)",
    }[cfg.shared_expert]
    lines = [
        "---",
        "library_name: transformers",
        "tags: [agentmerge, moe, merge]",
        "---",
        "",
        f"# {result.out_dir.name}",
        "",
        f"A {result.architecture} mixture of experts written by `agentmerge moe`: attention, embeddings and norms",
        f"from {source}; one expert per agent (its MLP); {shared}; top-{cfg.experts_per_token} routing.",
        "The router was set without training from the hidden states of each agent's example prompts at each layer",
        "(merge.json `router`); it has not been trained.",
        "",
        "| expert | agent | prompts | own share, first layer | own share, mean over layers |",
        "|---|---|---|---|---|",
    ]
    for i, e in enumerate(result.experts):
        first = result.routers[0].own_share[i]
        mean = statistics.mean(r.own_share[i] for r in result.routers)
        lines.append(f"| {i} | `{input_ref(str(e['path']))}` | {e['prompts']} | {first:.2f} | {mean:.2f} |")
    lines.append("")
    return "\n".join(lines)
