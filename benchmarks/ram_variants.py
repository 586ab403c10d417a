"""Time and effect of the RAM variants (grouped scopes, shared: elect, ram_fisher) on a synthetic family.

    PYTHONPATH=src python benchmarks/ram_variants.py [--work bench-work/ram-variants] [--threads 2]

Writes a seeded 8-layer Qwen2-style family (7.1 M parameters, bf16, agent densities 3 %, 46 %, 54 %) and a
seeded random Fisher per agent (uniform^4) under ``--work`` (reused when there), then merges it once per
variant and prints: the wall time, the groups with the range of each agent's lambda over them, and the share
of elements that differ between a variant and its default. The first merge warms numba up and is not
reported. Timings on a shared machine are noisy; the shares of changed elements are exact.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from agentmerge.config.schema import MergeConfig, ModelSpec
from agentmerge.engine.merge import merge
from agentmerge.io.formats.roles import FISHER_MARK
from agentmerge.synthetic import Architecture, write_family

ARCH = Architecture(vocab=4096, hidden=256, intermediate=768, layers=8, heads=8, kv_heads=2)
VARIANTS: dict[str, tuple[str, dict[str, object]]] = {
    "ram (default)": ("ram", {}),
    "ram shared=elect": ("ram", {"shared": "elect"}),
    "ram_plus (default: global)": ("ram_plus", {}),
    "ram_plus scope=layer": ("ram_plus", {"scope": "layer"}),
    "ram_plus scope=module": ("ram_plus", {"scope": "module"}),
    "ram_plus shared=elect": ("ram_plus", {"shared": "elect"}),
    "ram_fisher r=0": ("ram_fisher", {}),
    "ram_fisher r=0.1": ("ram_fisher", {"r": 0.1}),
}
COMPARE = (
    ("ram shared=elect", "ram (default)"),
    ("ram_plus scope=layer", "ram_plus (default: global)"),
    ("ram_plus scope=module", "ram_plus (default: global)"),
    ("ram_fisher r=0", "ram (default)"),
)


def family(work: Path) -> tuple[Path, list[Path], list[Path]]:
    """The base, the agents and one seeded random Fisher folder per agent (written once)."""
    if not (work / "base").exists():
        write_family(work, ARCH, [0.03, 0.46, 0.54], seed=0)
    agents = [work / f"agent{i}" for i in range(3)]
    fishers = []
    for i, agent in enumerate(agents):
        folder = work / f"fisher{i}"
        if not folder.exists():
            folder.mkdir()
            g = torch.Generator().manual_seed(i)
            weights = load_file(agent / "model.safetensors")
            values = {k: torch.rand(v.shape, generator=g) ** 4 for k, v in weights.items() if v.is_floating_point()}
            save_file(values, str(folder / "model.safetensors"), metadata=dict([FISHER_MARK]))
        fishers.append(folder)
    return work / "base", agents, fishers


def run(work: Path, label: str, threads: int, inputs: tuple[Path, list[Path], list[Path]]) -> dict[str, torch.Tensor]:
    """One merge of a variant: prints its time and lambdas, returns its tensors."""
    method, params = VARIANTS.get(label, ("ram_plus", {"r": 0.2}))
    base, agents, fishers = inputs
    fisher = method == "ram_fisher"
    models = [ModelSpec(path=str(a), fisher=str(f) if fisher else None) for a, f in zip(agents, fishers, strict=True)]
    cfg = MergeConfig(method=method, base=str(base), models=models, params=params, threads=threads)
    out = work / "out" / label.replace(" ", "_")
    t0 = time.perf_counter()
    result = merge(cfg, out, quiet=True, force=True)
    seconds = time.perf_counter() - t0
    lambdas = [[float(a["lambda"]) for a in row["agents"]] for row in result.scales]
    ranges = ", ".join(f"{min(x):.4f}-{max(x):.4f}" for x in zip(*lambdas, strict=True)) if lambdas else "-"
    print(f"| {label} | {seconds:.2f} | {len(lambdas)} | {ranges} |")
    return load_file(out / "model.safetensors")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("bench-work/ram-variants"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    os.environ["AGENTMERGE_NO_CACHE"] = "1"  # every RAM+ merge counts its statistics
    inputs = family(args.work)
    numel = sum(v.numel() for v in load_file(inputs[0] / "model.safetensors").values())
    print(
        f"{numel:,} parameters, 3 agents\n\n| variant | seconds | groups | lambda range per agent |\n|---|---|---|---|"
    )
    run(args.work, "warm-up", args.threads, inputs)
    outs = {label: run(args.work, label, args.threads, inputs) for label in VARIANTS}
    print()
    for a, b in COMPARE:
        changed = sum(int((outs[a][k].float() != outs[b][k].float()).sum()) for k in outs[a])
        print(f"{a} vs {b}: {100 * changed / numel:.2f} % of elements differ")


if __name__ == "__main__":
    main()
