"""Peak memory of ram_fisher with and without its Fisher-mass statistics pass, on a ``speed.py`` shape.

    python benchmarks/fisher_memory.py --work /work/speed-work --shape qwen2.5-7b-wide-2layer [--r 0 1]

Writes a Fisher file for each agent of the shape's family (``WORK/SHAPE/fisherI``: random bf16 magnitudes in
[0, 1), the agent's tensor names, the metadata ``agentmerge fisher`` marks its files with; made once), then merges
with ``ram_fisher`` at each ``--r`` (r > 0 runs the pass over every chunk before the write pass; r = 0 skips it)
on one thread at ``--max-memory 1GB`` and prints wall seconds, CPU seconds and peak anonymous memory.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import speed  # benchmarks/speed.py: families, process sampling

MB = 1 << 20


def fisher_like(agent: Path, out: Path, seed: int) -> None:
    """A Fisher folder for ``agent``: each weight file's tensors as random bf16 magnitudes, marked as Fisher."""
    if out.is_dir():
        return
    tmp = out.with_name(out.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    for f in speed.weight_files(agent):
        with safe_open(f, "pt") as h:
            shapes = {k: h.get_slice(k).get_shape() for k in h.keys()}  # noqa: SIM118 (safe_open has no iterator)
        tensors = {k: torch.rand(*s, generator=g).to(torch.bfloat16) for k, s in shapes.items()}
        save_file(tensors, tmp / f.name, metadata={"agentmerge": "fisher"})
        del tensors
    tmp.rename(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--shape", default="qwen2.5-7b-wide-2layer")
    p.add_argument("--r", type=float, nargs="+", default=[0.0, 1.0])
    args = p.parse_args()
    base, agents = speed.family(args.work, args.shape, 3)
    fishers = [args.work / args.shape / f"fisher{i}" for i in range(len(agents))]
    for i, (agent, fisher) in enumerate(zip(agents, fishers, strict=True)):
        fisher_like(agent, fisher, seed=i)
    out = args.work / "fisher-memory-out"
    for r in args.r:
        shutil.rmtree(out, ignore_errors=True)
        cmd = [sys.executable, "-m", "agentmerge", "merge", "--method", "ram_fisher", "--base", str(base)]
        cmd += ["--quiet", "--threads", "1", "--max-memory", "1GB", "--out", str(out), "--param", f"r={r}"]
        for agent, fisher in zip(agents, fishers, strict=True):
            cmd += ["--model", str(agent), "--fisher", str(fisher)]
        run = speed.run_process(cmd)
        print(
            f"{args.shape} ram_fisher r={r}: {run.seconds:.1f} s (cpu {run.cpu:.1f} s), peak anon "
            f"{run.peak_anon / MB:.0f} MB, rc {run.rc}",
            flush=True,
        )
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
