"""What the adaptive-threshold cache saves: repeated RAM merges with ``epsilon_rule`` percentile / valley.

    PYTHONPATH=src python benchmarks/thresholds_cache.py [--work bench-work/thresholds] [--threads 2]

On a synthetic Qwen2-shaped family (~6 M elements per model, base and three bf16 agents), per rule: one merge
with the cache off (``AGENTMERGE_NO_CACHE=1``: the thresholds are computed), one that fills the cache, and
two that read it. Prints seconds per merge, the tensors, and merge.json's size; the outputs are checked equal.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from agentmerge import MergeConfig, ModelSpec, merge
from agentmerge.synthetic import Architecture, write_family

FAMILY = Architecture(vocab=8192, hidden=256, intermediate=1024, layers=4, heads=4, kv_heads=2)
RUNS = (("computed", "1"), ("fills the cache", "0"), ("cached", "0"), ("cached again", "0"))


def run_rule(root: Path, rule: str, threads: int) -> dict[str, object]:
    """Seconds of each merge of ``RUNS`` with ``epsilon_rule: rule``; the outputs must be bit-identical."""
    models = [ModelSpec(path=str(root / f"agent{i}")) for i in range(3)]
    params = {"epsilon_rule": rule}
    cfg = MergeConfig(method="ram", base=str(root / "base"), models=models, params=params, threads=threads)  # type: ignore[arg-type]
    seconds, outputs = {}, set()
    for label, off in RUNS:
        os.environ["AGENTMERGE_NO_CACHE"] = off
        out = root.parent / f"out-{rule}"
        t0 = time.perf_counter()
        result = merge(cfg, out, quiet=True, force=True, hashing="none")
        seconds[label] = round(time.perf_counter() - t0, 2)
        outputs.add((out / "model.safetensors").read_bytes())
    assert len(outputs) == 1, "a cached merge differs from a computed one"
    size = (root.parent / f"out-{rule}" / "merge.json").stat().st_size
    return {"rule": rule, "seconds": seconds, "tensors": result.merged_tensors, "merge_json_bytes": size}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default="bench-work/thresholds")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    work = Path(args.work).resolve()
    root = work / "family"
    if not (root / "base").exists():
        write_family(root, FAMILY, [0.05, 0.4, 0.5], seed=0)
    os.environ["AGENTMERGE_CACHE"] = str(work / "cache")
    for rule in ("percentile", "valley"):
        print(run_rule(root, rule, args.threads))


if __name__ == "__main__":
    main()
