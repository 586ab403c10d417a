"""Speed and memory of agentmerge against mergekit, next to the I/O floor of this machine.

One command (from the repository root, in the project's .venv):

    python benchmarks/speed.py --setup-mergekit          # once: bench-work/mk-venv with torch 2.13.0 CPU + mergekit 0.1.5
    python benchmarks/speed.py                           # everything below, a few tens of minutes on 2 cores

It writes seeded synthetic families in real Qwen2.5 layouts (bf16; agent densities 3 %, 46 %, 54 %, as the
RAM paper measured) under ``--work`` (reused when already there), then, in one run:

* the I/O floor per shape: read every input weight file once and write the output's bytes once, with fsync;
* per method, agentmerge and mergekit as whole processes on the same inputs, ``--repeats`` times each:
  median wall time, peak anonymous memory (RssAnon of the process tree, sampled from /proc) and peak RSS;
* the largest difference between the two outputs for the deterministic methods both have;
* scaling: agentmerge time per GB of input for each shape and for 2, 3, 5 and 8 agents.

``--first-merge`` measures only what a merge of new files costs: the same merge (``--first-method``, 3 agents,
first shape) with its digest caches emptied (a fresh temporary ``AGENTMERGE_CACHE``) under ``--hash fast`` and
``--hash sha256``, against a warm one (digests cached) and one with ``--hash none``, ``--repeats`` rounds, each
round running every variant once; medians and their ratios to the warm merge. The OS page cache is warm in
every variant (every input read once, untimed, before each round): this isolates hashing, not disk reads.

Results go to stdout (markdown tables) and ``WORK/results.json``. Timings on a shared machine are noisy:
compare ratios from one run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DENSITIES = (0.032, 0.462, 0.543)  # the paper's code / tool / memory agents
EXTRA_DENSITIES = (0.05, 0.2, 0.3, 0.1, 0.4)  # agents 4..8, for the scaling in the number of agents
SHAPES = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b-wide-2layer")
DEFAULT_METHODS = ("ram", "ram_plus", "linear", "task_arithmetic", "ties", "dare_ties")
COMPARED = ("ram", "linear", "task_arithmetic", "ties")  # deterministic, same definition in both tools
MB = 1 << 20

# agentmerge method -> (mergekit method, mergekit parameters, whether mergekit gets the base model)
MERGEKIT: dict[str, tuple[str, dict[str, float], bool]] = {
    "ram": ("ram", {"epsilon": 1e-5}, True),
    "ram_plus": ("ramplus_tl", {"epsilon": 1e-5, "r": 0.1, "alpha": 2.0}, True),  # tensor-local RAM+
    "linear": ("linear", {"weight": 1.0}, False),
    "task_arithmetic": ("task_arithmetic", {"weight": 1.0}, True),
    "ties": ("ties", {"weight": 1.0, "density": 0.2}, True),
    "dare_ties": ("dare_ties", {"weight": 1.0, "density": 0.5}, True),
    "dare_linear": ("dare_linear", {"weight": 1.0, "density": 0.5}, True),
    "breadcrumbs": ("breadcrumbs", {"weight": 1.0, "density": 0.9, "gamma": 0.01}, True),
    "della": ("della", {"weight": 1.0, "density": 0.5, "epsilon": 0.1}, True),
    "model_stock": ("model_stock", {}, True),
    "sce": ("sce", {}, True),
    "karcher": ("karcher", {}, False),  # on the raw weights: mergekit would average a base_model in
    "multislerp": ("multislerp", {"weight": 1.0}, True),
    "nuslerp": ("nuslerp", {"weight": 1.0}, True),  # two agents (benchmarks/field_speed.py)
}


# --------------------------------------------------------------------------- inputs


def family(work: Path, shape: str, n_agents: int) -> tuple[Path, list[Path]]:
    """``work/shape`` with a base and ``n_agents`` agents, generated once (a folder with config.json is done)."""
    import torch  # noqa: F401  (imported here so --help is fast)

    from agentmerge.synthetic import SHAPES as ARCHS
    from agentmerge.synthetic import write_model

    root = work / shape
    densities = (DENSITIES + EXTRA_DENSITIES)[:n_agents]
    todo: list[tuple[str, int | None, float]] = [("base", None, 0.0)]
    todo += [(f"agent{i}", i, d) for i, d in enumerate(densities)]
    for name, agent, density in todo:
        folder = root / name
        if (folder / "config.json").exists():
            continue
        shutil.rmtree(folder, ignore_errors=True)
        t0 = time.perf_counter()
        write_model(folder, ARCHS[shape], seed=0, agent=agent, density=density)
        print(f"  generated {shape}/{name} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return root / "base", [root / f"agent{i}" for i in range(n_agents)]


def weight_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def input_bytes(folders: Sequence[Path]) -> int:
    return sum(f.stat().st_size for d in folders for f in weight_files(d))


# --------------------------------------------------------------------------- measuring a process


@dataclass
class Run:
    """One timed process: wall seconds, peak anonymous memory and peak RSS (bytes), exit code, CPU seconds."""

    seconds: float
    peak_anon: int
    peak_rss: int
    rc: int
    tail: str = ""
    cpu: float = 0.0  # user + system time of the process (its own threads; not of its children)


def _status_kb(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, ValueError):
        pass
    return 0


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (from /proc/PID/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            pass
    return out


def run_process(cmd: Sequence[str], env: dict[str, str] | None = None, interval: float = 0.01) -> Run:
    """Run ``cmd``; sample RssAnon and VmHWM (peak RSS) of its process tree every ``interval`` s.

    (Not ``wait4``'s ``ru_maxrss``: Linux carries the forking parent's RSS across ``exec`` into it.)
    """
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    peak = {"anon": 0, "rss": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            pids = _tree(proc.pid)
            peak["anon"] = max(peak["anon"], sum(_status_kb(p, "RssAnon:") for p in pids))
            peak["rss"] = max(peak["rss"], sum(_status_kb(p, "VmHWM:") for p in pids))
            done.wait(interval)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    assert proc.stdout is not None
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    done.set()
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    tail = output.decode(errors="replace")[-2000:]
    return Run(seconds, peak["anon"], peak["rss"], proc.returncode, tail, usage.ru_utime + usage.ru_stime)


# --------------------------------------------------------------------------- the I/O floor


def io_floor(inputs: Sequence[Path], out_bytes: int, scratch: Path) -> float:
    """Seconds to read every input weight file once (64 MB reads) and write ``out_bytes`` once, fsynced."""
    buf = bytearray(64 * MB)
    view = memoryview(buf)
    t0 = time.perf_counter()
    for folder in inputs:
        for f in weight_files(folder):
            with open(f, "rb", buffering=0) as fh:
                while fh.readinto(buf):
                    pass
    target = scratch / "floor.bin"
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        pos = 0
        while pos < out_bytes:
            pos += os.pwrite(fd, view[: min(len(buf), out_bytes - pos)], pos)
        os.fsync(fd)
    finally:
        os.close(fd)
    seconds = time.perf_counter() - t0
    target.unlink()
    return seconds


# --------------------------------------------------------------------------- the two tools


def agentmerge_cmd(method: str, base: Path, agents: Sequence[Path], out: Path, max_memory: str) -> list[str]:
    cmd = [sys.executable, "-m", "agentmerge", "merge", "--method", method, "--base", str(base)]
    for a in agents:
        cmd += ["--model", str(a)]
    return [*cmd, "-o", str(out), "--force", "--quiet", "--max-memory", max_memory]


def mergekit_cmd(mk_venv: Path, method: str, base: Path, agents: Sequence[Path], out: Path) -> list[str]:
    """A mergekit config equivalent to agentmerge's defaults (float32 arithmetic, bf16 output)."""
    name, params, with_base = MERGEKIT[method]
    per_model = {k: v for k, v in params.items() if k in ("weight", "density", "gamma", "epsilon")}
    if name.startswith("ram"):
        per_model = {}
    shared = {k: v for k, v in params.items() if k not in per_model}
    models = [{"model": str(a), **({"parameters": per_model} if per_model else {})} for a in agents]
    config: dict[str, object] = {"merge_method": name, "models": models, "dtype": "float32", "out_dtype": "bfloat16"}
    if with_base:
        config["base_model"] = str(base)
    if shared:
        config["parameters"] = shared
    cfg_path = out.parent / f"{out.name}.yaml"
    cfg_path.write_text(json.dumps(config, indent=1))  # JSON is YAML
    shutil.rmtree(out, ignore_errors=True)
    return [str(mk_venv / "bin" / "mergekit-yaml"), str(cfg_path), str(out), "--quiet", "--no-write-model-card"]


def setup_mergekit(mk_venv: Path) -> None:
    """bench-work/mk-venv: torch 2.13.0 (CPU, pinned first) then mergekit 0.1.5 with torch held at 2.13.0."""
    if not (mk_venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(mk_venv)], check=True)
    pip = [str(mk_venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "torch==2.13.0"], check=True)
    subprocess.run([*pip, "mergekit==0.1.5", "torch==2.13.0"], check=True)


# --------------------------------------------------------------------------- agreement


def max_difference(a: Path, b: Path) -> tuple[float, float]:
    """Largest absolute difference between two merged models, and the fraction of elements that differ."""
    import torch
    from safetensors import safe_open

    def tensors(folder: Path) -> dict[str, Path]:
        out = {}
        for f in weight_files(folder):
            with safe_open(str(f), "pt") as h:
                out.update({k: f for k in h.keys()})  # noqa: SIM118
        return out

    ta, tb = tensors(a), tensors(b)
    worst, differ, total = 0.0, 0, 0
    for name in sorted(ta.keys() & tb.keys()):
        with safe_open(str(ta[name]), "pt") as ha, safe_open(str(tb[name]), "pt") as hb:
            x, y = ha.get_tensor(name).float(), hb.get_tensor(name).float()
        d = (x - y).abs()
        worst = max(worst, float(d.max())) if d.numel() else worst
        differ += int((d > 0).sum())
        total += d.numel()
        del x, y, d
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return worst, differ / max(total, 1)


# --------------------------------------------------------------------------- the benchmark


@dataclass
class Row:
    """Medians for one (shape, method, tool, number of agents)."""

    shape: str
    method: str
    tool: str
    agents: int
    input_gb: float
    seconds: float
    peak_anon_mb: float
    peak_rss_mb: float
    runs: list[float] = field(default_factory=list)  # every run's seconds, in order (the first is cold)
    failed: str = ""


def measure(cmd: list[str], repeats: int, label: str, env: dict[str, str] | None = None) -> tuple[list[Run], str]:
    runs: list[Run] = []
    for _ in range(repeats):
        r = run_process(cmd, env)
        print(
            f"  {label}: {r.seconds:.1f} s, anon {r.peak_anon / MB:.0f} MB, rss {r.peak_rss / MB:.0f} MB",
            file=sys.stderr,
        )
        if r.rc != 0:
            return runs, r.tail
        runs.append(r)
    return runs, ""


def row(shape: str, method: str, tool: str, n: int, gb: float, runs: list[Run], failed: str) -> Row:
    if not runs:
        return Row(shape, method, tool, n, gb, float("nan"), float("nan"), float("nan"), [], failed[-300:])
    return Row(
        shape,
        method,
        tool,
        n,
        gb,
        statistics.median(r.seconds for r in runs),
        max(r.peak_anon for r in runs) / MB,
        max(r.peak_rss for r in runs) / MB,
        [round(r.seconds, 2) for r in runs],
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=Path, default=ROOT / "bench-work" / "speed", help="families and outputs")
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), help="agentmerge.synthetic.SHAPES names")
    p.add_argument("--methods", nargs="+", default=list(DEFAULT_METHODS))
    p.add_argument("--repeats", type=int, default=3, help="runs per (method, tool); the median is reported")
    p.add_argument("--mk-repeats", type=int, default=None, help="runs per method for mergekit (default --repeats)")
    p.add_argument("--mk-venv", type=Path, default=ROOT / "bench-work" / "mk-venv")
    p.add_argument("--mk-shapes", nargs="*", default=["qwen2.5-0.5b"], help="shapes mergekit also runs on")
    p.add_argument("--no-mergekit", action="store_true")
    p.add_argument("--setup-mergekit", action="store_true", help="create --mk-venv and exit")
    p.add_argument("--generate-only", action="store_true", help="write the synthetic families under --work and exit")
    p.add_argument("--scale-agents", nargs="*", type=int, default=[2, 3, 5, 8], help="agent counts (first shape)")
    p.add_argument("--scale-methods", nargs="*", default=["ram", "ram_plus"], help="methods timed on every shape")
    p.add_argument("--max-memory", default="1GB", help="agentmerge --max-memory")
    p.add_argument("--cli-startup", action="store_true", help="only time `agentmerge --help`, `methods`, an error")
    p.add_argument("--first-merge", action="store_true", help="only time merges with empty digest caches vs warm")
    p.add_argument("--first-method", default="ram", help="the method --first-merge times (default ram)")
    args = p.parse_args(argv)
    if args.first_merge:
        results = first_merge(args)
        (args.work / "first-merge.json").write_text(json.dumps(results, indent=1) + "\n")
        print_first_merge(results)
        return 0
    if args.cli_startup:
        for label, seconds in cli_startup_seconds(max(args.repeats, 5)).items():
            print(f"| agentmerge {label} | {seconds:.3f} s |")
        return 0
    if args.setup_mergekit:
        setup_mergekit(args.mk_venv)
        return 0
    if args.generate_only:
        most = max([3, *args.scale_agents])
        for i, shape in enumerate(args.shapes):
            family(args.work, shape, most if i == 0 else 3)
        return 0
    mk = not args.no_mergekit and (args.mk_venv / "bin" / "mergekit-yaml").exists()
    if not args.no_mergekit and not mk:
        print(f"no mergekit in {args.mk_venv}: run with --setup-mergekit first (or --no-mergekit)", file=sys.stderr)
        return 2
    args.work.mkdir(parents=True, exist_ok=True)
    results = run_benchmark(args, mk)
    (args.work / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print_report(results)
    return 0


STARTUP = "import gc; gc.disable(); import agentmerge.cli, agentmerge.engine.merge, agentmerge.methods.ties.compiled; gc.freeze()"


def startup_seconds(repeats: int) -> float:
    """Median wall time of a process that only imports what a merge imports (Python, torch, numba, agentmerge)."""
    return statistics.median(run_process([sys.executable, "-c", STARTUP]).seconds for _ in range(max(repeats, 1)))


CLI_COMMANDS = {
    "--help": ["--help"],
    "methods": ["methods"],
    "merge (a config error)": ["merge", "--method", "ram_pluss", "--base", "b", "--model", "a", "-o", "o"],
}


def cli_startup_seconds(repeats: int) -> dict[str, float]:
    """Median wall time of the commands that answer without torch (target: under 0.3 s on an idle machine)."""
    return {
        label: statistics.median(
            run_process([sys.executable, "-m", "agentmerge", *argv]).seconds for _ in range(repeats)
        )
        for label, argv in CLI_COMMANDS.items()
    }


def warm(folders: Sequence[Path], scratch: Path) -> None:
    """Read every weight file once (untimed), so each tool and the floor start from the same page cache."""
    io_floor(folders, 0, scratch)


FIRST_VARIANTS = {  # label -> (--hash, whether the digest caches start empty)
    "warm (digests cached)": ("fast", False),
    "first, --hash fast": ("fast", True),
    "first, --hash sha256": ("sha256", True),
    "--hash none": ("none", False),
}


def first_merge(args: argparse.Namespace) -> dict[str, object]:
    """Merges of new files (empty digest caches) under each --hash mode against a warm merge, interleaved."""
    shape = args.shapes[0]
    base, agents = family(args.work, shape, 3)
    out, warm_cache = args.work / "out" / f"{shape}-first", args.work / "first-cache-warm"
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = agentmerge_cmd(args.first_method, base, agents, out, args.max_memory)
    load_before = os.getloadavg()
    shutil.rmtree(warm_cache, ignore_errors=True)
    run_process([*cmd, "--hash", "fast"], {**os.environ, "AGENTMERGE_CACHE": str(warm_cache)})  # fills it
    times: dict[str, list[float]] = {label: [] for label in FIRST_VARIANTS}
    cpu: dict[str, list[float]] = {label: [] for label in FIRST_VARIANTS}
    for i in range(args.repeats):
        warm([base, *agents], out.parent)
        for label, (mode, cold) in FIRST_VARIANTS.items():
            cache = args.work / f"first-cache-{i}-{mode}" if cold else warm_cache
            if cold:
                shutil.rmtree(cache, ignore_errors=True)
            r = run_process([*cmd, "--hash", mode], {**os.environ, "AGENTMERGE_CACHE": str(cache)})
            if r.rc != 0:
                raise SystemExit(f"{label} failed:\n{r.tail}")
            times[label].append(round(r.seconds, 2))
            cpu[label].append(round(r.cpu, 2))
            print(f"  round {i + 1}, {label}: {r.seconds:.2f} s, cpu {r.cpu:.2f} s", file=sys.stderr)
            if cold:
                shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    return {
        "command": " ".join(["python", "benchmarks/speed.py", *sys.argv[1:]]),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]},
        "shape": shape,
        "method": args.first_method,
        "input_gb": round(input_bytes([base, *agents]) / 1e9, 2),
        "seconds": times,
        "cpu_seconds": cpu,
    }


def print_first_merge(results: dict[str, object]) -> None:
    times: dict[str, list[float]] = results["seconds"]  # type: ignore[assignment]
    load: dict[str, list[float]] = results["load_average"]  # type: ignore[assignment]
    print(f"# {results['command']}  ({results['when']}, {results['cpus']} CPUs)")
    print(f"# {results['method']} on {results['shape']}, base + 3 agents, {results['input_gb']} GB of input")
    print(f"# load average (1, 5, 15 min) before {load['before']}, after {load['after']}\n")
    cpu: dict[str, list[float]] = results["cpu_seconds"]  # type: ignore[assignment]
    print("| merge | wall s, median | wall s, runs | x warm | CPU s, median | CPU s, runs | CPU x warm |")
    print("|---|---|---|---|---|---|---|")
    warm_s, warm_cpu = (statistics.median(t["warm (digests cached)"]) for t in (times, cpu))
    for label, runs in times.items():
        med, cmed = statistics.median(runs), statistics.median(cpu[label])
        print(
            f"| {label} | {med:.2f} | {', '.join(f'{x:.2f}' for x in runs)} | {med / warm_s:.2f} "
            f"| {cmed:.2f} | {', '.join(f'{x:.2f}' for x in cpu[label])} | {cmed / warm_cpu:.2f} |"
        )
    fast = statistics.median(times["first, --hash fast"]) / warm_s
    print(
        f"\n{'MET ' if fast <= 1.3 else 'MISS'} first merge with --hash fast: {fast:.2f}x the warm merge (target 1.3x)"
    )


def run_benchmark(args: argparse.Namespace, mk: bool) -> dict[str, object]:
    out_root = args.work / "out"
    out_root.mkdir(exist_ok=True)
    # agentmerge hashes its inputs (for merge.json; xxh3_128 by default) once per file and caches the result: a fresh
    # cache, and one untimed-for-the-medians merge of every file of a shape first, reported on its own
    env = {**os.environ, "AGENTMERGE_CACHE": str(args.work / "hash-cache")}
    shutil.rmtree(args.work / "hash-cache", ignore_errors=True)
    rows: list[Row] = []
    floors: dict[str, dict[str, float]] = {}
    diffs: dict[str, dict[str, float]] = {}
    first = args.shapes[0]
    most = max([3, *args.scale_agents]) if args.scale_agents else 3
    startup = startup_seconds(args.repeats)
    print(f"start-up (imports only): {startup:.2f} s", file=sys.stderr)
    cli_startup = cli_startup_seconds(max(args.repeats, 5))
    print(f"start-up of the commands without torch: {cli_startup}", file=sys.stderr)
    for shape in args.shapes:
        base, agents = family(args.work, shape, most if shape == first else 3)
        three = agents[:3]
        gb = input_bytes([base, *three]) / 1e9
        out_bytes = input_bytes([base])
        warm([base, *three], out_root)
        floor_runs = [io_floor([base, *three], out_bytes, out_root) for _ in range(args.repeats)]
        floors[shape] = {"seconds": statistics.median(floor_runs), "input_gb": gb, "output_gb": out_bytes / 1e9}
        print(f"{shape}: I/O floor {floors[shape]['seconds']:.2f} s for {gb:.2f} GB in", file=sys.stderr)
        every = agents if shape == first else three
        cold_out = out_root / f"{shape}-cold"
        cold = run_process(agentmerge_cmd("ram", base, every, cold_out, args.max_memory), env)
        shutil.rmtree(cold_out, ignore_errors=True)
        floors[shape].update(cold_seconds=cold.seconds, cold_agents=len(every))
        print(f"  first merge (ram, {len(every)} agents, hashing every input): {cold.seconds:.1f} s", file=sys.stderr)
        methods = args.methods if shape == first else [m for m in args.methods if m in args.scale_methods]
        for method in methods:
            am_out = out_root / f"{shape}-{method}-am"
            cmd = agentmerge_cmd(method, base, three, am_out, args.max_memory)
            runs, failed = measure(cmd, args.repeats, method, env)
            rows.append(row(shape, method, "agentmerge", 3, gb, runs, failed))
            if mk and shape in args.mk_shapes and method in MERGEKIT:
                mk_out = out_root / f"{shape}-{method}-mk"
                cmd = mergekit_cmd(args.mk_venv, method, base, three, mk_out)
                runs, failed = measure(cmd, args.mk_repeats or args.repeats, f"{method} (mergekit)")
                rows.append(row(shape, method, "mergekit", 3, gb, runs, failed))
                if method in COMPARED and runs and not rows[-2].failed:
                    worst, frac = max_difference(am_out, mk_out)
                    diffs[method] = {"max_abs": worst, "fraction_differing": frac}
                shutil.rmtree(mk_out, ignore_errors=True)
            shutil.rmtree(am_out, ignore_errors=True)
        if shape == first:
            for n in args.scale_agents:
                if n == 3:
                    continue
                base, agents = family(args.work, shape, most)
                group = agents[:n]
                gb_n = input_bytes([base, *group]) / 1e9
                for method in args.scale_methods:
                    am_out = out_root / f"{shape}-{method}-{n}"
                    cmd = agentmerge_cmd(method, base, group, am_out, args.max_memory)
                    runs, failed = measure(cmd, args.repeats, f"{method} x{n}", env)
                    rows.append(row(shape, method, "agentmerge", n, gb_n, runs, failed))
                    shutil.rmtree(am_out, ignore_errors=True)
    return {
        "command": " ".join(["python", "benchmarks/speed.py", *sys.argv[1:]]),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpus": os.cpu_count(),
        "fused": _fused_available(),
        "floors": floors,
        "startup_seconds": startup,
        "cli_startup_seconds": cli_startup,
        "rows": [asdict(r) for r in rows],
        "differences": diffs,
    }


def _fused_available() -> bool:
    from agentmerge.methods.fused.jit import available

    return available()


# --------------------------------------------------------------------------- report


def print_report(results: dict[str, object]) -> None:
    floors: dict[str, dict[str, float]] = results["floors"]  # type: ignore[assignment]
    rows = [Row(**r) for r in results["rows"]]  # type: ignore[attr-defined]
    diffs: dict[str, dict[str, float]] = results["differences"]  # type: ignore[assignment]
    print(f"# {results['command']}  ({results['when']}, {results['cpus']} CPUs, fused kernels: {results['fused']})")
    print(f"# start-up of a merge process (imports only): {results.get('startup_seconds', float('nan')):.2f} s\n")
    print(
        "| shape | method | agentmerge s (min-max) | x floor | x floor after start-up | mergekit s "
        "| mergekit / agentmerge | am anon MB | am RSS MB | mk anon MB | mk RSS MB | max abs diff |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    startup = float(results.get("startup_seconds", 0.0))  # type: ignore[arg-type]
    for r in rows:
        if r.tool != "agentmerge" or r.agents != 3:
            continue
        m = _mergekit_row(rows, r)
        floor = floors[r.shape]["seconds"]
        mk_s = f"{m.seconds:.1f}" if m and not m.failed else ("failed" if m else "-")
        ratio = f"{m.seconds / r.seconds:.1f}x" if m and not m.failed else "-"
        mk_mem = f"{m.peak_anon_mb:.0f} | {m.peak_rss_mb:.0f}" if m and not m.failed else "- | -"
        d = diffs.get(r.method) if r.shape == next(iter(floors)) else None
        diff = f"{d['max_abs']:.2g} ({d['fraction_differing']:.2%} differ)" if d else "-"
        am = "failed" if r.failed else f"{r.seconds:.1f} ({min(r.runs):.1f}-{max(r.runs):.1f})"
        print(
            f"| {r.shape} | {r.method} | {am} | {r.seconds / floor:.2f} | {(r.seconds - startup) / floor:.2f} "
            f"| {mk_s} | {ratio} | "
            f"{r.peak_anon_mb:.0f} | {r.peak_rss_mb:.0f} | {mk_mem} | {diff} |"
        )
    print("\n| shape | input GB | output GB | I/O floor s | floor s per GB in | first merge s (hashes inputs) |")
    print("|---|---|---|---|---|---|")
    for shape, f in floors.items():
        cold = f"{f['cold_seconds']:.1f} (ram, {f['cold_agents']:.0f} agents)" if "cold_seconds" in f else "-"
        print(
            f"| {shape} | {f['input_gb']:.2f} | {f['output_gb']:.2f} | {f['seconds']:.2f} | "
            f"{f['seconds'] / f['input_gb']:.2f} | {cold} |"
        )
    print("\n| shape | agents | method | input GB | agentmerge s | s per GB in | peak anon MB |")
    print("|---|---|---|---|---|---|---|")
    for r in sorted((r for r in rows if r.tool == "agentmerge"), key=lambda r: (r.method, r.shape, r.agents)):
        print(
            f"| {r.shape} | {r.agents} | {r.method} | {r.input_gb:.2f} | {r.seconds:.1f} | "
            f"{r.seconds / r.input_gb:.2f} | {r.peak_anon_mb:.0f} |"
        )
    print()
    for line in targets(rows, floors):
        print(line)
    for r in rows:
        if r.failed:
            print(f"\nFAILED {r.tool} {r.method} on {r.shape}: {r.failed}")


def _mergekit_row(rows: Sequence[Row], r: Row) -> Row | None:
    return next((x for x in rows if x.tool == "mergekit" and x.shape == r.shape and x.method == r.method), None)


def targets(rows: Sequence[Row], floors: dict[str, dict[str, float]]) -> list[str]:
    """One line per target: met or missed, with the numbers."""
    out = []
    am = [r for r in rows if r.tool == "agentmerge" and not r.failed]
    for r in am:
        if r.method in ("ram", "ram_plus") and r.agents == 3:
            x = r.seconds / floors[r.shape]["seconds"]
            out.append(
                f"{'MET ' if x <= 1.5 else 'MISS'} {r.method} on {r.shape}: {x:.2f}x the I/O floor (target 1.5x)"
            )
    first = next(iter(floors))
    for r in am:
        m = _mergekit_row(rows, r)
        if r.shape == first and r.agents == 3 and m and not m.failed:
            x = m.seconds / r.seconds
            out.append(f"{'MET ' if x >= 5 else 'MISS'} {r.method}: {x:.1f}x faster than mergekit (target 5x)")
    worst = max((r.peak_anon_mb for r in am), default=0.0)
    out.append(f"{'MET ' if worst < 1536 else 'MISS'} peak anonymous memory {worst:.0f} MB over all runs (< 1536)")
    for method in sorted({r.method for r in am if r.shape != first}):
        small = next((r for r in am if r.shape == first and r.method == method and r.agents == 3), None)
        for r in (r for r in am if r.method == method and r.shape != first):
            if small:
                ok = r.peak_anon_mb <= small.peak_anon_mb * 1.05
                out.append(
                    f"{'MET ' if ok else 'MISS'} {method} on {r.shape}: peak anon {r.peak_anon_mb:.0f} MB vs "
                    f"{small.peak_anon_mb:.0f} MB on {first} (no higher, 5 % sampling tolerance)"
                )
    return out


if __name__ == "__main__":
    sys.exit(main())
