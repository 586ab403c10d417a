"""The sweep engine's cost: per-trial overhead against a plain Python loop, and what the statistics cache saves.

    python benchmarks/sweep.py [--work bench-work/sweep] [--trials 8]

1. The same merges and evaluations (task arithmetic, one lambda per trial, a cheap Python evaluator) two
   ways, at two sweep sizes (``--trials`` and 3x that): a plain Python loop in this process, and
   ``agentmerge sweep`` with one trial in flight (the loop's work plus Ray's costs), and with its default
   concurrency. From the two sizes: the sweep's fixed cost (Ray's start, worker start-up) and its marginal
   cost per trial against the loop's.
2. A RAM+ sweep of r (5 values) as a plain loop of merges, with the overlap-statistics cache off
   (``AGENTMERGE_NO_CACHE=1``: every merge counts its statistics) and on (the first counts, the rest reuse).

Ratios measured in one run on the same files; the family is a synthetic Qwen2-shaped one of ~40 M parameters.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
EVAL = """
from pathlib import Path
from safetensors import safe_open

def score(folder):
    with safe_open(str(Path(folder) / "model.safetensors"), "pt") as f:
        w = f.get_tensor("model.norm.weight").float()
    return {"score": float(w.mean())}
"""


def family(work: Path) -> tuple[Path, list[Path]]:
    from agentmerge.synthetic import Architecture, write_family

    root = work / "family"
    if not (root / "agent2" / "model.safetensors").exists():
        arch = Architecture(vocab=32000, hidden=512, intermediate=2048, layers=8, heads=8, kv_heads=2)
        write_family(root, arch, [0.05, 0.4, 0.5], seed=1)
    return root / "base", [root / f"agent{i}" for i in range(3)]


def sweep_file(work: Path, base: Path, agents: list[Path], trials: int) -> Path:
    (work / "benchsweep.py").write_text(EVAL)
    lambdas = [round(0.2 + 0.1 * i, 3) for i in range(trials)]
    data = {
        "base": str(base),
        "models": [str(a) for a in agents],
        "methods": {"task_arithmetic": {"lambda": lambdas}},
        "evaluate": "python:benchsweep:score",
        "keep": "none",
    }
    path = work / "sweep.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def plain_loop(path: Path, work: Path) -> float:
    from agentmerge.engine.merge import merge
    from agentmerge.sweep import evaluators
    from agentmerge.sweep.sweepfile import choose, load_sweep, merge_config, trials

    cfg = load_sweep(path)
    score = evaluators.resolve(cfg.evaluate, [str(path.parent)])
    t0 = time.perf_counter()
    for trial in trials(cfg, choose(cfg)):
        out = work / "loop" / trial.id
        merge(merge_config(cfg, trial), out, force=True, quiet=True)
        score(out)
        shutil.rmtree(out)
    return time.perf_counter() - t0


def cli_sweep(path: Path, out: Path, concurrent: int | None) -> float:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "agentmerge", "sweep", str(path), "--out", str(out), "--quiet"]
    if concurrent:
        cmd += ["--max-concurrent", str(concurrent)]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=path.parent)
    return time.perf_counter() - t0


def ram_plus_loop(base: Path, agents: list[Path], work: Path, cache: bool) -> float:
    env = {**os.environ, "AGENTMERGE_CACHE": str(work / ("cache-on" if cache else "cache-off"))}
    if not cache:
        env["AGENTMERGE_NO_CACHE"] = "1"
    shutil.rmtree(env["AGENTMERGE_CACHE"], ignore_errors=True)
    code = (
        "import sys, shutil; from agentmerge import MergeConfig, ModelSpec, merge\n"
        f"base, agents, work = {str(base)!r}, {[str(a) for a in agents]!r}, {str(work)!r}\n"
        "for r in (0.0, 0.05, 0.1, 0.2, 0.5):\n"
        "    cfg = MergeConfig(method='ram_plus', base=base, models=[ModelSpec(path=a) for a in agents], params={'r': r})\n"
        "    merge(cfg, work + '/rp', force=True, quiet=True); shutil.rmtree(work + '/rp')\n"
    )
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=ROOT / "bench-work" / "sweep")
    p.add_argument("--trials", type=int, default=8)
    args = p.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("AGENTMERGE_NO_HASH", "1")  # the input digests are not what is measured here
    base, agents = family(work)
    times: dict[str, dict[int, float]] = {"loop": {}, "sweep_1": {}, "sweep_default": {}}
    sizes = (args.trials, 3 * args.trials)
    for n in sizes:
        path = sweep_file(work, base, agents, n)
        plain_loop(path, work)  # warm: page cache, compiled kernels
        times["loop"][n] = plain_loop(path, work)
        times["sweep_1"][n] = cli_sweep(path, work / f"sweep-1-{n}", 1)
        times["sweep_default"][n] = cli_sweep(path, work / f"sweep-default-{n}", None)
    off = ram_plus_loop(base, agents, work, cache=False)
    on = ram_plus_loop(base, agents, work, cache=True)
    small, large = sizes
    marginal = {k: (v[large] - v[small]) / (large - small) for k, v in times.items()}
    fixed = {k: v[small] - small * marginal[k] for k, v in times.items()}
    result = {
        "command": "python benchmarks/sweep.py " + " ".join(sys.argv[1:]),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "seconds": {k: {str(n): round(t, 2) for n, t in v.items()} for k, v in times.items()},
        "marginal_s_per_trial": {k: round(v, 3) for k, v in marginal.items()},
        "fixed_s": {k: round(v, 2) for k, v in fixed.items()},
        "sweep_1_marginal_over_loop": round(marginal["sweep_1"] / marginal["loop"], 2),
        "ram_plus_r_sweep_cache_off_s": round(off, 2),
        "ram_plus_r_sweep_cache_on_s": round(on, 2),
        "cache_speedup": round(off / on, 2),
    }
    (work / "results.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
