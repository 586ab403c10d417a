"""What a trial costs beyond its own work on a Ray cluster of 1 and of 2 nodes (started here with ``ray start``).

    python benchmarks/sweep_cluster.py [--work bench-work/sweep-cluster] [--trials 8] [--repeat 2]

The same task-arithmetic merges of a tiny synthetic family (one lambda per trial) and a cheap evaluator
(it reads one tensor), at two sweep sizes (``--trials`` and 3x that), three ways:

- a plain Python loop of ``run_trial`` in this process (the trial's own work, no Ray);
- ``agentmerge sweep --address`` on a 1-node cluster (a head with 1 CPU: one trial at a time);
- the same on a 2-node cluster (head + node_b, 1 CPU each, ``--max-concurrent 2``), both nodes on this
  machine (``tests/raycluster.py``: own loopback address, ports and temp folder per node).

From the two sizes, each way's marginal wall seconds per trial and its fixed cost (driver start, connection,
input check, workers). ``work``: the mean of the records' ``seconds`` (merge + evaluation inside the worker).
Overhead per trial: marginal x nodes - work, the slot-seconds a trial holds beyond its own work (Ray's
scheduling, the result's trip, the synced ``results.jsonl`` line). Each sweep runs ``--repeat`` times; the
fastest counts (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the cluster launcher the tests use

from raycluster import ENV, LocalCluster  # noqa: E402

EVAL = """
from pathlib import Path
from safetensors import safe_open

def score(folder):
    with safe_open(str(Path(folder) / "model.safetensors"), "pt") as f:
        w = f.get_tensor("model.norm.weight").float()
    return {"score": float(w.mean())}
"""


def sweep_file(work: Path, n: int) -> Path:
    from agentmerge.synthetic import write_family

    root = work / "family"
    if not (root / "agent2" / "model.safetensors").exists():
        write_family(root, "tiny", [0.05, 0.4, 0.5], seed=1)
    (work / "clusterbench.py").write_text(EVAL)
    data = {
        "base": str(root / "base"),
        "models": [str(root / f"agent{i}") for i in range(3)],
        "methods": {"task_arithmetic": {"lambda": [round(0.2 + 0.01 * i, 3) for i in range(n)]}},
        "evaluate": "python:clusterbench:score",
        "keep": "none",
    }
    path = work / f"sweep-{n}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def plain_loop(path: Path, work: Path) -> tuple[float, float]:
    """Wall seconds of the trials run one after the other here, and their mean in-trial seconds."""
    from agentmerge.sweep.run import run_trial
    from agentmerge.sweep.spec import choose, load_sweep, trials

    cfg = load_sweep(path)
    data = cfg.model_dump(mode="json")
    t0 = time.perf_counter()
    records = [run_trial(data, t, str(work / "loop" / t.id), [str(path.parent)]) for t in trials(cfg, choose(cfg))]
    wall = time.perf_counter() - t0
    assert all(r["status"] == "ok" for r in records)
    return wall, sum(r["seconds"] for r in records) / len(records)


def cluster_sweep(path: Path, out: Path, address: str, nodes: int, env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds of one ``agentmerge sweep --address`` and the mean in-worker seconds of its trials."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "agentmerge", "sweep", str(path), "--out", str(out), "--quiet"]
    cmd += ["--address", address, "--max-concurrent", str(nodes)]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=path.parent, env=env, timeout=900)
    wall = time.perf_counter() - t0
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert all(r["status"] == "ok" for r in records) and len({r["node"] for r in records}) <= nodes
    return wall, sum(r["seconds"] for r in records) / len(records)


def on_cluster(nodes: int, paths: dict[int, Path], work: Path, repeat: int, env: dict[str, str]) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="ambench-", dir="/tmp"))
    cluster = LocalCluster(root)
    try:
        t0 = time.perf_counter()
        cluster.start_head(env=env)
        for i in range(1, nodes):
            cluster.add_node(f"node_{chr(ord('a') + i)}", env=env)
        started = time.perf_counter() - t0
        runs = {
            n: min(cluster_sweep(p, work / f"out-{nodes}-{n}", cluster.address, nodes, env) for _ in range(repeat))
            for n, p in paths.items()
        }
    finally:
        left = cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    assert not left, left
    return {
        "start_s": started,
        "wall": {n: w for n, (w, _) in runs.items()},
        "work": {n: s for n, (_, s) in runs.items()},
    }


def summary(name: str, wall: dict[int, float], work: float, nodes: int) -> dict[str, Any]:
    (small, a), (large, b) = sorted(wall.items())
    marginal = (b - a) / (large - small)
    return {
        "way": name,
        "wall_s": {str(k): round(v, 2) for k, v in wall.items()},
        "fixed_s": round(a - small * marginal, 2),
        "marginal_s_per_trial": round(marginal, 3),
        "work_s_per_trial": round(work, 3),
        "overhead_s_per_trial": round(marginal * nodes - work, 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=ROOT / "bench-work" / "sweep-cluster")
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    sizes = (args.trials, 3 * args.trials)
    paths = {n: sweep_file(work, n) for n in sizes}
    env = {**os.environ, **ENV, "AGENTMERGE_NO_HASH": "1", "PYTHONPATH": str(ROOT / "src")}
    plain_loop(paths[sizes[0]], work)  # warm: page cache, imports
    loop = {n: min(plain_loop(p, work) for _ in range(args.repeat)) for n, p in paths.items()}
    rows = [summary("plain loop (no Ray)", {n: w for n, (w, _) in loop.items()}, loop[sizes[1]][1], 1)]
    starts = {}
    for nodes in (1, 2):
        got = on_cluster(nodes, paths, work, args.repeat, env)
        starts[nodes] = round(got["start_s"], 1)
        name = f"sweep --address, {nodes} node{'s' if nodes > 1 else ''}"
        rows.append(summary(name, got["wall"], got["work"][sizes[1]], nodes))
    result = {
        "command": "python benchmarks/sweep_cluster.py " + " ".join(sys.argv[1:]),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "load_average": [round(x, 1) for x in os.getloadavg()],
        "cluster_start_s": starts,
        "rows": rows,
    }
    (work / "results.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
