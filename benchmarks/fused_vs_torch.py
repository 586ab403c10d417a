"""The fused (numba) kernels against the torch reference kernels: whole merges, timed, outputs compared byte for byte.

    python benchmarks/fused_vs_torch.py [--family bench-work/speed/qwen2.5-0.5b] [--methods ties dare_ties ...]

Each method runs as a whole process ``--repeats`` times with the fused kernels and as often with
``AGENTMERGE_FUSED=0``, alternating, on a family written by ``benchmarks/speed.py`` (base and agent0..2);
then the two outputs must be identical. Prints one line per run and one verdict per method. Not a test.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import speed  # the process runner and command line of the speed benchmark

MB = 1 << 20


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", type=Path, default=speed.ROOT / "bench-work" / "speed" / "qwen2.5-0.5b")
    p.add_argument("--methods", nargs="+", default=["ties", "dare_ties", "dare_linear"])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", type=Path, default=speed.ROOT / "bench-work" / "fused-vs-torch")
    args = p.parse_args(argv)
    base, agents = args.family / "base", [args.family / f"agent{i}" for i in range(3)]
    env = {**os.environ, "AGENTMERGE_CACHE": str(args.family.parent / "hash-cache")}
    same = True
    for method in args.methods:
        outs = {flag: args.out / f"{method}-{flag}" for flag in ("1", "0")}
        for _ in range(args.repeats):
            for flag, out in outs.items():
                cmd = speed.agentmerge_cmd(method, base, agents, out, "1GB")
                r = speed.run_process(cmd, {**env, "AGENTMERGE_FUSED": flag})
                kind = "fused" if flag == "1" else "torch"
                print(f"{method} {kind}: {r.seconds:.2f} s, peak anon {r.peak_anon / MB:.0f} MB, rc {r.rc}", flush=True)
        a, b = (sorted(o.glob("*.safetensors")) for o in outs.values())
        identical = len(a) == len(b) > 0 and all(x.read_bytes() == y.read_bytes() for x, y in zip(a, b, strict=True))
        same &= identical
        print(f"{method}: outputs {'identical' if identical else 'DIFFER'}", flush=True)
        for out in outs.values():
            shutil.rmtree(out, ignore_errors=True)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
