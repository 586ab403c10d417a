"""What a trial costs beyond its own work on a Ray cluster of 1 and of 2 nodes (started here with ``ray start``).

    python benchmarks/sweep_cluster.py [--work bench-work/sweep-cluster] [--trials 24] [--repeat 2]

The same task-arithmetic merges of a tiny synthetic family (one lambda per trial, so the trial's own work
is small and what the sweep adds shows) and a cheap evaluator (it reads one tensor), three ways:

- a plain Python loop of ``run_trial`` in this process (the trial's own work, no Ray);
- ``agentmerge sweep --address`` on a 1-node cluster (a head with 1 CPU: one trial at a time);
- the same on a 2-node cluster (head + node_b, 1 CPU each, ``--max-concurrent 2``), both nodes on this
  machine (``tests/raycluster.py``: own loopback address, ports and temp folder per node).

For a sweep, the moment each line lands in ``results.jsonl`` is watched: ``first_s`` is the wait until
every node has recorded one trial (driver start, connection, the input check, each worker's start-up and
first trial), ``per_trial_s`` the steady-state wall seconds per trial after that, ``after_last_s`` the
time from the last line to the command's exit (``results.md`` and its plots). ``work_s``: the mean
``seconds`` of those steady-state records (merge + evaluation inside the worker). Overhead per trial
= per_trial_s x nodes - work_s: the slot-seconds a trial holds beyond its own work (Ray's scheduling and
the result's trip, the driver's bookkeeping and synced line). Each sweep runs ``--repeat`` times; the run
with the smallest per_trial_s counts (the machine is shared).
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


def plain_loop(path: Path, work: Path) -> dict[str, float]:
    """The trials run one after the other here: wall seconds per trial and their mean in-trial seconds."""
    from agentmerge.sweep.run import run_trial
    from agentmerge.sweep.sweepfile import choose, load_sweep, trials

    cfg = load_sweep(path)
    data = cfg.model_dump(mode="json")
    t0 = time.perf_counter()
    records = [run_trial(data, t, str(work / "loop" / t.id), [str(path.parent)]) for t in trials(cfg, choose(cfg))]
    wall = time.perf_counter() - t0
    assert all(r["status"] == "ok" for r in records)
    return {"per_trial_s": wall / len(records), "work_s": sum(r["seconds"] for r in records) / len(records)}  # warm


def cluster_sweep(path: Path, out: Path, address: str, nodes: int, env: dict[str, str]) -> dict[str, float]:
    """One ``agentmerge sweep --address``, the moment each record lands watched (module docstring)."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "agentmerge", "sweep", str(path), "--out", str(out), "--quiet"]
    cmd += ["--address", address, "--max-concurrent", str(nodes)]
    results = out / "results.jsonl"
    landed: list[float] = []
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=path.parent, env=env, stderr=subprocess.DEVNULL)
    while proc.poll() is None and time.perf_counter() - t0 < 900:
        lines = results.read_bytes().count(b"\n") if results.exists() else 0
        landed += [time.perf_counter() - t0] * (lines - len(landed))
        time.sleep(0.005)
    assert proc.wait(timeout=60) == 0
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert all(r["status"] == "ok" for r in records) and len({r["node"] for r in records}) == nodes
    steady = records[nodes:]  # each node's first trial also pays its worker's start-up (imports)
    return {
        "first_s": landed[nodes - 1],
        "per_trial_s": (landed[-1] - landed[nodes - 1]) / len(steady),
        "work_s": sum(r["seconds"] for r in steady) / len(steady),
        "after_last_s": time.perf_counter() - t0 - landed[-1],
    }


def on_cluster(nodes: int, path: Path, work: Path, repeat: int, env: dict[str, str]) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="ambench-", dir="/tmp"))
    cluster = LocalCluster(root)
    try:
        t0 = time.perf_counter()
        cluster.start_head(env=env)
        for i in range(1, nodes):
            cluster.add_node(f"node_{chr(ord('a') + i)}", env=env)
        started = time.perf_counter() - t0
        runs = [cluster_sweep(path, work / f"out-{nodes}", cluster.address, nodes, env) for _ in range(repeat)]
    finally:
        left = cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    assert not left, left
    return {"cluster_start_s": started, **min(runs, key=lambda r: r["per_trial_s"])}


def row(way: str, got: dict[str, float], nodes: int) -> dict[str, Any]:
    out: dict[str, Any] = {"way": way, **{k: round(v, 3) for k, v in got.items()}}
    out["overhead_s_per_trial"] = round(got["per_trial_s"] * nodes - got["work_s"], 3)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=ROOT / "bench-work" / "sweep-cluster")
    p.add_argument("--trials", type=int, default=24)
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    path = sweep_file(work, args.trials)
    load = [round(x, 1) for x in os.getloadavg()]
    env = {**os.environ, **ENV, "AGENTMERGE_NO_HASH": "1", "PYTHONPATH": str(ROOT / "src")}
    plain_loop(path, work)  # warm: page cache, imports
    loop = min((plain_loop(path, work) for _ in range(args.repeat)), key=lambda r: r["per_trial_s"])
    rows = [row("plain loop (no Ray)", loop, 1)]
    for nodes in (1, 2):
        name = f"sweep --address, {nodes} node{'s' if nodes > 1 else ''}"
        rows.append(row(name, on_cluster(nodes, path, work, args.repeat, env), nodes))
    result = {
        "command": "python benchmarks/sweep_cluster.py " + " ".join(sys.argv[1:]),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "trials": args.trials,
        "load_average_start_end": [load, [round(x, 1) for x in os.getloadavg()]],
        "rows": rows,
    }
    (work / "results.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
