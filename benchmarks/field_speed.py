"""Speed and memory of the field's element-wise and mergekit methods (issue 24), next to the I/O floor and mergekit.

    python benchmarks/field_speed.py --mk-venv /work/mk-venv          # both shapes, mergekit where it has the method
    python benchmarks/field_speed.py --no-mergekit --shapes qwen2.5-0.5b

It reuses ``speed.py``'s families (seeded synthetic Qwen2.5 layouts under ``--work``, generated once), I/O floor
and process sampling (median wall time, peak anonymous memory and peak RSS of the process tree). Per shape: the
I/O floor for the three agents (and for two, NuSLERP's), one untimed merge that hashes the inputs and warms the
page cache, then every method ``--repeats`` times, task arithmetic as the element-wise yardstick; mergekit 0.1.5
(``--mk-venv``: torch 2.13.0 CPU, then mergekit) on ``sce``, ``karcher``, ``multislerp``, ``nuslerp`` with the
largest absolute difference between the two outputs. Results: a markdown table on stdout and ``WORK/field.json``.
Timings on a shared machine are noisy: compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import speed  # the sibling benchmark: families, floor, process sampling, mergekit configs (speed.MERGEKIT)

# label -> (agentmerge method, --param flags, agents, mergekit method or None)
CASES: dict[str, tuple[str, list[str], int, str | None]] = {
    "task_arithmetic": ("task_arithmetic", [], 3, None),
    "magmax": ("magmax", [], 3, None),
    "consensus": ("consensus", [], 3, None),
    "sce": ("sce", [], 3, "sce"),
    "sce (select_topk 0.5)": ("sce", ["select_topk=0.5"], 3, None),
    "karcher": ("karcher", [], 3, "karcher"),
    "multislerp": ("multislerp", [], 3, "multislerp"),
    "nuslerp": ("nuslerp", [], 2, "nuslerp"),
    "nuslerp (rows)": ("nuslerp", ["nuslerp_flatten=false"], 2, None),
    "task_arithmetic + LiNeS": ("task_arithmetic", ["lines_beta=0.5"], 3, None),
    "magmax + LiNeS": ("magmax", ["lines_beta=0.5"], 3, None),
}


def am_cmd(case: str, base: Path, agents: Sequence[Path], out: Path, max_memory: str) -> list[str]:
    method, params, n, _ = CASES[case]
    cmd = speed.agentmerge_cmd(method, base, agents[:n], out, max_memory)
    return cmd + [x for p in params for x in ("--param", p)]


def run_capped(cmd: list[str], cap: int, env: dict[str, str] | None = None) -> speed.Run:
    """``speed.run_process``, but the process tree is killed once its anonymous memory passes ``cap`` bytes
    (this machine is shared: a merge that would take all of its memory is stopped, and reported so)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    peak = {"anon": 0, "rss": 0, "killed": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            pids = speed._tree(proc.pid)
            anon = sum(speed._status_kb(p, "RssAnon:") for p in pids)
            peak["anon"] = max(peak["anon"], anon)
            peak["rss"] = max(peak["rss"], sum(speed._status_kb(p, "VmHWM:") for p in pids))
            if anon > cap and not peak["killed"]:
                peak["killed"] = 1
                os.killpg(proc.pid, signal.SIGKILL)
            done.wait(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    assert proc.stdout is not None
    output = proc.stdout.read()
    proc.wait()
    done.set()
    sampler.join()
    tail = output.decode(errors="replace")[-2000:]
    if peak["killed"]:
        tail += f"\nstopped: anonymous memory passed {cap / 2**30:.0f} GB"
    seconds = time.perf_counter() - t0
    return speed.Run(seconds, peak["anon"], peak["rss"], 1 if peak["killed"] else proc.returncode, tail)


def measure(
    cmd: list[str], repeats: int, label: str, env: dict[str, str] | None = None, cap: int | None = None
) -> dict[str, Any]:
    if cap is None:
        runs, failed = speed.measure(cmd, repeats, label, env)
    else:
        runs, failed = [], ""
        for _ in range(repeats):
            r = run_capped(cmd, cap, env)
            print(f"  {label}: {r.seconds:.1f} s, anon {r.peak_anon / speed.MB:.0f} MB, rc {r.rc}", file=sys.stderr)
            if r.rc != 0:
                failed = r.tail
                break
            runs.append(r)
    if not runs:
        return {"failed": failed[-400:]}
    return {
        "seconds": statistics.median(r.seconds for r in runs),
        "runs": [round(r.seconds, 2) for r in runs],
        "anon_mb": max(r.peak_anon for r in runs) / speed.MB,
        "rss_mb": max(r.peak_rss for r in runs) / speed.MB,
    }


def floors(base: Path, agents: Sequence[Path], out: Path, repeats: int) -> dict[int, float]:
    """The I/O floor for 3 and 2 agents (read every input once, write the output once with fsync)."""
    size = speed.input_bytes([base])
    speed.warm([base, *agents], out)
    return {
        n: statistics.median(speed.io_floor([base, *agents[:n]], size, out) for _ in range(repeats)) for n in (3, 2)
    }


def run_shape(args: argparse.Namespace, shape: str, env: dict[str, str]) -> dict[str, Any]:
    """The floor, then ``--repeats`` rounds of every case (interleaved, so a change in the machine's load falls on
    every method alike), then mergekit on its cases against the last agentmerge output of each."""
    base, agents = speed.family(args.work, shape, 3)
    out = args.work / "out"
    out.mkdir(parents=True, exist_ok=True)
    floor = floors(base, agents, out, args.repeats)
    print(f"{shape}: I/O floor {floor[3]:.2f} s (3 agents), {floor[2]:.2f} s (2)", file=sys.stderr)
    speed.run_process(am_cmd("magmax", base, agents, out / "warm", args.max_memory), env)  # hashes, page cache
    shutil.rmtree(out / "warm", ignore_errors=True)
    mk_cases = [c for c in args.cases if CASES[c][3] and args.mk and shape in args.mk_shapes]
    runs: dict[str, list[dict[str, Any]]] = {case: [] for case in args.cases}
    for _ in range(args.repeats):
        for case in args.cases:
            am_out = out / f"{shape}-{case.replace(' ', '_')}-am"
            runs[case].append(measure(am_cmd(case, base, agents, am_out, args.max_memory), 1, case, env))
            if case not in mk_cases:
                shutil.rmtree(am_out, ignore_errors=True)
    rows = {case: {"agents": CASES[case][2], "agentmerge": _merged_runs(runs[case])} for case in args.cases}
    for case in mk_cases:
        am_out = out / f"{shape}-{case.replace(' ', '_')}-am"
        rows[case].update(_mergekit(args, shape, case, base, agents, am_out))
        shutil.rmtree(am_out, ignore_errors=True)
    return {"floor": floor, "input_gb": speed.input_bytes([base, *agents]) / 1e9, "rows": rows}


def _merged_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One case's single runs as one row: the median seconds, every run, the peaks (or the first failure)."""
    failed = [r for r in runs if "failed" in r]
    if failed:
        return failed[0]
    seconds = [r["seconds"] for r in runs]
    return {
        "seconds": statistics.median(seconds),
        "runs": [round(x, 2) for x in seconds],
        "anon_mb": max(r["anon_mb"] for r in runs),
        "rss_mb": max(r["rss_mb"] for r in runs),
    }


def _mergekit(
    args: argparse.Namespace, shape: str, case: str, base: Path, agents: Sequence[Path], am_out: Path
) -> dict[str, Any]:
    """mergekit on one case (stopped past ``--mk-cap-gb``), and its largest difference from agentmerge's output."""
    mk_out = out_dir = args.work / "out" / f"{shape}-mk"
    cmd = speed.mergekit_cmd(args.mk_venv, CASES[case][3] or case, base, agents[: CASES[case][2]], out_dir)
    row: dict[str, Any] = {
        "mergekit": measure(cmd, args.mk_repeats, f"{case} (mergekit)", cap=int(args.mk_cap_gb * 2**30))
    }
    if "failed" not in row["mergekit"] and am_out.exists():
        worst, frac = speed.max_difference(am_out, mk_out)
        row["difference"] = {"max_abs": worst, "fraction_differing": frac}
    shutil.rmtree(mk_out, ignore_errors=True)
    return row


def report(results: dict[str, Any]) -> None:
    print(f"# {results['command']}  ({results['when']}, {results['cpus']} CPUs, load before {results['load']})\n")
    print(
        "| shape | method | agents | agentmerge s (runs) | x I/O floor | x task_arithmetic | peak anon MB | peak RSS MB "
        "| mergekit s | mergekit / agentmerge | mergekit anon MB | max abs diff (share differing) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for shape, res in results["shapes"].items():
        ta = res["rows"].get("task_arithmetic", {}).get("agentmerge", {}).get("seconds")
        for case, row in res["rows"].items():
            print(_line(shape, case, row, res["floor"], ta))


def _line(shape: str, case: str, row: dict[str, Any], floor: dict[Any, float], ta: float | None) -> str:
    am, mk, diff = row["agentmerge"], row.get("mergekit"), row.get("difference")
    if "failed" in am:
        return f"| {shape} | {case} | {row['agents']} | failed | | | | | | | | |"
    runs = ", ".join(f"{x:.1f}" for x in am["runs"])
    f = floor[row["agents"]] if row["agents"] in floor else floor[str(row["agents"])]
    x_ta = f"{am['seconds'] / ta:.2f}" if ta else "-"
    mk_s = "-" if mk is None else (_why(mk["failed"]) if "failed" in mk else f"{mk['seconds']:.1f}")
    ratio = f"{mk['seconds'] / am['seconds']:.1f}x" if mk and "failed" not in mk else "-"
    mk_mem = f"{mk['anon_mb']:.0f}" if mk and "failed" not in mk else "-"
    d = f"{diff['max_abs']:.2g} ({diff['fraction_differing']:.2%})" if diff else "-"
    return (
        f"| {shape} | {case} | {row['agents']} | {am['seconds']:.1f} ({runs}) | {am['seconds'] / f:.2f} | {x_ta} "
        f"| {am['anon_mb']:.0f} | {am['rss_mb']:.0f} | {mk_s} | {ratio} | {mk_mem} | {d} |"
    )


def _why(failed: str) -> str:
    return "stopped (memory cap)" if "stopped: anonymous memory" in failed else "failed"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=speed.ROOT / "bench-work" / "speed")
    p.add_argument("--shapes", nargs="+", default=["qwen2.5-0.5b", "qwen2.5-7b-wide-2layer"])
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--mk-repeats", type=int, default=1)
    p.add_argument("--mk-venv", type=Path, default=speed.ROOT / "bench-work" / "mk-venv")
    p.add_argument("--mk-shapes", nargs="*", default=["qwen2.5-0.5b", "qwen2.5-7b-wide-2layer"])
    p.add_argument("--no-mergekit", action="store_true")
    p.add_argument("--mk-cap-gb", type=float, default=12.0, help="stop a mergekit run past this anonymous memory")
    p.add_argument("--max-memory", default="1GB")
    p.add_argument("--report", type=Path, help="only print the table of an earlier results file")
    args = p.parse_args(argv)
    if args.report:
        report(json.loads(args.report.read_text()))
        return 0
    args.mk = not args.no_mergekit and (args.mk_venv / "bin" / "mergekit-yaml").exists()
    env = {**os.environ, "AGENTMERGE_CACHE": str(args.work / "hash-cache")}
    results: dict[str, Any] = {
        "command": " ".join(["python", "benchmarks/field_speed.py", *(argv if argv is not None else sys.argv[1:])]),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "load": [round(x, 1) for x in os.getloadavg()],
        "shapes": {},
    }
    for shape in args.shapes:
        results["shapes"][shape] = run_shape(args, shape, env)
        (args.work / "field.json").write_text(json.dumps(results, indent=1) + "\n")
    report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
