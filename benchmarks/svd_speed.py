"""Speed and memory of the SVD methods (tsv, iso_c, iso_cts, cart, resmerge, SVC) next to the I/O floor and the
time of their SVDs alone, on ``benchmarks/speed.py``'s synthetic Qwen2.5 families.

    python benchmarks/svd_speed.py --memory                       # float32 copies each kernel holds (spec copies)
    python benchmarks/svd_speed.py --shape qwen2.5-0.5b --methods tsv iso_c iso_cts cart resmerge \\
        --params svd_embeddings=false
    python benchmarks/svd_speed.py --shape qwen2.5-7b-wide-2layer --methods iso_c --params svd_embeddings=false

Per method, two processes in turn, ``--repeats`` times (medians): the merge itself (``agentmerge merge``, as
``speed.py`` runs it: wall time, peak anonymous memory of the process), and "the SVDs alone": a process that
plans the same merge and runs, on random float32 matrices of the same shapes, exactly the SVDs the merge's
kernels run (``TensorJob.svds``), scheduled as the merge schedules them (tensors within a thread's share of
the budget on the thread pool with one torch thread each, the others one at a time with every thread), and
nothing else. The I/O floor (read every input once, write the output once, fsync) is ``speed.py``'s.
``--memory`` measures, per kernel, the peak resident memory of a process merging one 4096 x 1024 tensor of 3
task vectors beyond its float32 inputs, in copies of that tensor: the ``copies`` of ``hooks.WholeTensor``.
Results: stdout (markdown) and ``WORK/svd-results.json``. The machine is shared: compare ratios of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import speed  # benchmarks/speed.py: families, process sampling, the I/O floor

MB = 1 << 20

SVDS_ALONE = """
import sys, time, torch
from concurrent.futures import ThreadPoolExecutor
from agentmerge import MergeConfig, ModelSpec
from agentmerge.engine.merge_plan import make_plan
from agentmerge.methods.linalg import svd
from agentmerge.engine.inputs import Inputs
from agentmerge.engine.parallel import torch_threads
method, base, params, threads, memory, *agents = sys.argv[1:]
params = {k: (v == "true" if v in ("true", "false") else v) for k, v in (p.split("=") for p in params.split(",") if p)}
cfg = MergeConfig(method=method, base=base, models=[ModelSpec(path=a) for a in agents], params=params,
                  threads=int(threads), max_memory=memory)
inputs = Inputs.for_merge(cfg)
plan = make_plan(cfg, inputs.reference, len(agents), cfg.threads, inputs.vocab)
inputs.close()
matrices = {shape: torch.randn(*shape) for j in plan.whole_jobs for shape in j.svds}  # made before the clock
def run(job):
    for shape in job.svds:
        svd(matrices[shape])
t0, c0 = time.perf_counter(), time.process_time()
with torch_threads(1):
    pooled = sorted((j for j in plan.whole_jobs if not plan.alone(j)), key=lambda j: -j.numel)
    with ThreadPoolExecutor(plan.threads) as pool:
        list(pool.map(run, pooled))
with torch_threads(plan.threads):
    for job in plan.whole_jobs:
        if plan.alone(job):
            run(job)
print(f"svds {time.perf_counter() - t0:.3f} {time.process_time() - c0:.3f} {sum(len(j.svds) for j in plan.whole_jobs)}")
"""


def merge_cmd(method: str, base: Path, agents: list[Path], out: Path, args: argparse.Namespace) -> list[str]:
    cmd = speed.agentmerge_cmd(method, base, agents, out, args.max_memory)
    cmd += ["--threads", str(args.threads)]
    for p in args.params:
        cmd += ["--param", p]
    return cmd


def alone_cmd(method: str, base: Path, agents: list[Path], args: argparse.Namespace) -> list[str]:
    params = ",".join(args.params)
    return [sys.executable, "-c", SVDS_ALONE, method, str(base), params, str(args.threads), args.max_memory]


def measure(args: argparse.Namespace) -> dict[str, Any]:
    base, agents = speed.family(args.work, args.shape, 3)
    env = {**os.environ, "AGENTMERGE_CACHE": str(args.work / "hash-cache")}
    out = args.work / "out" / f"{args.shape}-svd"
    out.parent.mkdir(parents=True, exist_ok=True)
    speed.warm([base, *agents], out.parent)
    floor = statistics.median(speed.io_floor([base, *agents], speed.input_bytes([base]), out.parent) for _ in range(3))
    print(f"{args.shape}: I/O floor {floor:.2f} s", file=sys.stderr)
    starts = [speed.run_process([sys.executable, "-c", speed.STARTUP]) for _ in range(3)]
    startup, startup_cpu = statistics.median(r.seconds for r in starts), statistics.median(r.cpu for r in starts)
    warmup = speed.run_process(speed.agentmerge_cmd("task_arithmetic", base, agents, out, args.max_memory), env)
    print(f"  start-up {startup:.1f} s; warm-up merge (hashes the inputs once) {warmup.seconds:.1f} s", file=sys.stderr)
    rows = []
    for method in args.methods:
        merges, svds = [], []
        for _ in range(args.repeats):
            run = speed.run_process(merge_cmd(method, base, agents, out, args), env)
            if run.rc != 0:
                raise SystemExit(f"{method} failed:\n{run.tail}")
            merges.append(run)
            alone = speed.run_process([*alone_cmd(method, base, agents, args), *map(str, agents)], env)
            if alone.rc != 0:
                raise SystemExit(f"SVDs alone of {method} failed:\n{alone.tail}")
            words = alone.tail.split()
            svds.append((float(words[1]), float(words[2])))
            print(
                f"  {method}: merge {run.seconds:.1f} s (cpu {run.cpu:.1f} s), SVDs alone {words[1]} s "
                f"(cpu {words[2]} s)",
                file=sys.stderr,
            )
        rows.append(row(method, merges, svds, floor, (startup, startup_cpu)))
    return {
        "command": " ".join(["python", "benchmarks/svd_speed.py", *sys.argv[1:]]),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "shape": args.shape,
        "input_gb": round(speed.input_bytes([base, *agents]) / 1e9, 2),
        "floor_seconds": floor,
        "startup_seconds": startup,
        "startup_cpu_seconds": startup_cpu,
        "params": args.params,
        "threads": args.threads,
        "rows": rows,
    }


def row(
    method: str, merges: list[Any], svds: list[tuple[float, float]], floor: float, startup: tuple[float, float]
) -> dict[str, Any]:
    """Medians of one method: wall and CPU seconds of the merge and of its SVDs alone, their ratios."""
    seconds, cpu = statistics.median(r.seconds for r in merges), statistics.median(r.cpu for r in merges)
    alone, alone_cpu = statistics.median(s for s, _ in svds), statistics.median(c for _, c in svds)
    return {
        "method": method,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "runs": [round(r.seconds, 1) for r in merges],
        "svds_seconds": alone,
        "svds_cpu_seconds": alone_cpu,
        "svds_runs": [round(s, 1) for s, _ in svds],
        "x_svds": seconds / alone if alone else float("nan"),
        "x_svds_after_startup": (seconds - startup[0]) / alone if alone else float("nan"),
        "x_svds_cpu_after_startup": (cpu - startup[1]) / alone_cpu if alone_cpu else float("nan"),
        "x_floor": seconds / floor,
        "peak_anon_mb": max(r.peak_anon for r in merges) / MB,
    }


def print_report(res: dict[str, Any], args: argparse.Namespace) -> None:
    print(f"# {res['command']}  ({res['when']}, {res['cpus']} CPUs, load {[round(x, 1) for x in res['load_average']]})")
    print(
        f"# {res['shape']}, base + 3 agents, {res['input_gb']} GB in; I/O floor {res['floor_seconds']:.2f} s; "
        f"start-up of a merge process {res['startup_seconds']:.1f} s; params {res['params']}, {res['threads']} threads\n"
    )
    print(
        "| method | merge s (runs) | SVDs alone s (runs) | merge / SVDs alone | same, after start-up "
        "| CPU: merge / SVDs alone, after start-up | merge / I/O floor | peak anon MB |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in res["rows"]:
        print(
            f"| {r['method']} | {r['seconds']:.1f} ({', '.join(map(str, r['runs']))}) | {r['svds_seconds']:.1f} "
            f"({', '.join(map(str, r['svds_runs']))}) | {r['x_svds']:.2f} | {r['x_svds_after_startup']:.2f} "
            f"| {r['x_svds_cpu_after_startup']:.2f} | {r['x_floor']:.1f} | {r['peak_anon_mb']:.0f} |"
        )


# --------------------------------------------------------------------------- --memory

KERNEL_MEMORY = """
import sys, torch
from agentmerge.methods.registry import METHODS
from agentmerge.methods.spec import Chunk
from agentmerge.methods.poststeps import SVC
torch.set_num_threads(1)
method, calibrate, m, n, models = sys.argv[1], sys.argv[2] == "svc", *map(int, sys.argv[3:])
def hwm():
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM"))
params = {**METHODS[method].defaults(), **({"calibrate": "svc"} if calibrate else {})}
torch.linalg.svd(torch.randn(64, 64))  # LAPACK's own buffers, before the baseline
base, tau = torch.zeros(m * n), torch.randn(models, m * n) * 1e-2
c = Chunk(name="model.layers.0.mlp.up_proj.weight", start=0, stop=m * n, base=base, tau=tau,
          weights=torch.ones(models), params=params, shape=(m, n))
before = hwm()
delta = METHODS[method].kernel(c)
if calibrate:
    delta = SVC.apply(c, delta)
print((hwm() - before) / (4 * m * n))
"""


def kernel_memory(shape: tuple[int, int], models: int) -> dict[str, float]:
    cases = [("tsv", ""), ("iso_c", ""), ("iso_cts", ""), ("cart", ""), ("resmerge", ""), ("task_arithmetic", "svc")]
    out = {}
    for method, step in cases:
        argv = [sys.executable, "-c", KERNEL_MEMORY, method, step or "none", *map(str, shape), str(models)]
        done = subprocess.run(argv, capture_output=True, text=True, check=True)
        out[method + (f"+{step}" if step else "")] = float(done.stdout.strip())
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=speed.ROOT / "bench-work" / "speed")
    p.add_argument("--shape", default="qwen2.5-0.5b")
    p.add_argument("--methods", nargs="+", default=["iso_c", "tsv", "iso_cts", "cart", "resmerge"])
    p.add_argument("--params", nargs="*", default=[], help="NAME=VALUE for every merge (e.g. svd_embeddings=false)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--max-memory", default="1GB")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--memory", action="store_true", help="only the kernels' float32 copies beyond their inputs")
    args = p.parse_args(argv)
    if args.memory:
        shapes = [(4096, 1024), (2048, 2048), (1024, 4096)]
        table = {shape: kernel_memory(shape, 3) for shape in shapes}
        print("| kernel | " + " | ".join(f"{m} x {n}" for m, n in shapes) + " |")
        print("|---|" + "---|" * len(shapes))
        for name in table[shapes[0]]:
            print(f"| {name} | " + " | ".join(f"{table[s][name]:.2f}" for s in shapes) + " |")
        print("\n(float32 copies of the tensor held beyond its N + 1 = 4 float32 inputs, 3 models)")
        return 0
    res = measure(args)
    args.work.mkdir(parents=True, exist_ok=True)
    tag = "-".join([args.shape, *args.methods, *args.params]).replace("=", "_")
    (args.work / f"svd-results-{tag}.json").write_text(json.dumps(res, indent=1) + "\n")
    print_report(res, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
