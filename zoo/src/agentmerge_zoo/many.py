"""The many-agent study: merges of N = 2, 3, 4 and 6 of the six-domain zoo's agents, every method, every seed.

For each size N the study merges a fixed sample of N-agent subsets (the same subsets in every seed, so seeds are
paired) with each method of :data:`MANY_RUNS`. Under the fair protocol (``fair.py``, the default) every method
with an output scale runs at its defaults and, per subset, with that scale chosen on validation from one shared
grid (:data:`TA_GRID`) by one rule, as in the bench; the RAM variant ``v_ram_elect`` runs at its defaults only.
Without it (``fair=False``, the older protocol) only task arithmetic's lambda and RAM's scale (``v_ram_scaled``,
over :data:`GRID`) are tuned. Each merge is scored on its agents' tasks; the base and the six specialists are
scored once on every task. Per subset it also measures the crowding of the agents' masks (:mod:`crowding`).
The agents' RL steps are the config's (``--steps``, what ``zoo check --suite six --rounds`` settles on).

The merges are trials of two sweeps per seed (``work/many/{regime}/seed{S}/sweep-{val,test}``), so a rerun skips
what is recorded and evaluations are cached by the weights' digest. :mod:`agentmerge_zoo.many_report` turns the
records into the N-agent curves (share of the specialists' gain kept, against N).
"""

from __future__ import annotations

import contextlib
import itertools
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from agentmerge_zoo.bench import SeedBench
from agentmerge_zoo.bench_sweeps import Sweeps, bench_session
from agentmerge_zoo.benchplan import BenchPlan, MethodRun, available_methods
from agentmerge_zoo.build import Logger, build_zoo
from agentmerge_zoo.config import ZooConfig, seed_dirs
from agentmerge_zoo.crowding import crowding
from agentmerge_zoo.evaluate import evaluate_cached
from agentmerge_zoo.tasks import all_tasks

MANY_RUNS: tuple[MethodRun, ...] = (
    MethodRun("linear", "linear"),
    MethodRun("task_arithmetic", "task_arithmetic"),
    MethodRun("ties", "ties", {"density": 0.5, "scale": 1.0}),
    MethodRun("ram", "ram"),
    MethodRun("ram_plus", "ram_plus", {"r": 0.1, "alpha": 2.0}),
    # the field's strongest newer methods on the three-agent bench (TSV-M best tuned in three regimes, Iso-C in
    # bf16; both built for merging many tasks) and the RAM authors' RAM-TIES (no output scale: defaults only)
    MethodRun("tsv", "tsv"),
    MethodRun("iso_c", "iso_c"),
    MethodRun("ram_ties", "ram_ties"),
    MethodRun("v_ram_elect", "ram", {"shared": "elect"}, kind="variant"),
    MethodRun("v_ram_scaled", "ram", tune="scale", kind="variant"),  # the older protocol's tuned RAM
)
GRID = (0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # RAM's scale (and task arithmetic's lambda, below 0.5 too:
TA_GRID = (0.25, *GRID)  # a sum of six agents may want less than half of it)


@dataclass(frozen=True)
class ManyPlan:
    """Which subsets, methods and evaluation sizes the study runs."""

    seeds: tuple[int, ...] = (0, 1, 2)
    sizes: tuple[int, ...] = (2, 3, 4, 6)
    per_size: int = 5  # subsets per size (all of them when there are fewer)
    methods: tuple[MethodRun, ...] = MANY_RUNS
    grid: tuple[float, ...] = GRID  # RAM's scale
    ta_grid: tuple[float, ...] = TA_GRID  # task arithmetic's lambda
    n_val: int = 200
    n_test: int = 500
    fair: bool = True  # defaults and tuned rows for every method with an output scale (module docstring)

    def runs(self) -> tuple[MethodRun, ...]:
        """The merges of each subset: under the fair protocol, RAM's tuned row is ``ram.tuned`` (no
        ``v_ram_scaled``)."""
        return tuple(r for r in self.methods if not (self.fair and r.tune))

    def bench_plan(self) -> BenchPlan:
        runs = self.runs()
        labels = tuple(r.label for r in runs)
        return BenchPlan(self.seeds, self.ta_grid, self.grid, methods=runs, pair_methods=labels, fair=self.fair)


def subsets(domains: Sequence[str], sizes: Sequence[int], per_size: int, seed: int = 0) -> list[tuple[str, ...]]:
    """``per_size`` N-agent subsets of ``domains`` for each N (all when fewer exist), drawn with a fixed seed;
    each subset keeps the domains' order."""
    rng = random.Random(f"agentmerge-zoo/many/{seed}")
    out: list[tuple[str, ...]] = []
    for size in sizes:
        if not 2 <= size <= len(domains):
            raise ValueError(f"subset size {size} must be between 2 and {len(domains)}")
        combos = list(itertools.combinations(domains, size))
        out += combos if len(combos) <= per_size else sorted(rng.sample(combos, per_size), key=combos.index)
    return out


def subset_name(domains: Sequence[str]) -> str:
    return "+".join(domains)


def run_many_seed(cfg: ZooConfig, plan: ManyPlan, sweeps: Sweeps) -> dict[str, Any]:
    """One seed: score the zoo, then every subset's merges (validation sweep, then test sweep) and crowding."""
    bench_plan = plan.bench_plan()
    rows = _zoo_rows(cfg, plan, sweeps)
    groups = subsets(cfg.domains, plan.sizes, plan.per_size)
    benches = [
        SeedBench(cfg, bench_plan, sweeps.seed, sweeps.zoo, sweeps.evals, sweeps.log, group, subset=True)
        for group in groups
    ]
    for bench in benches:
        bench.begin(rows)
    available = available_methods()
    records = sweeps.run("val", [e for b in benches for e in b.val_entries(available)], plan.n_val)
    for bench in benches:
        bench.read_val(records)
    records = sweeps.run("test", [e for b in benches for e in b.test_entries(available, None)], plan.n_test)
    for bench in benches:
        bench.read_test(records)
    out: dict[str, Any] = {"seed": sweeps.seed, "zoo": rows, "subsets": {}}
    for bench, group in zip(benches, groups, strict=True):
        record = bench.finish()
        agents = [sweeps.zoo[f"agent_{d}"] for d in group]
        record["crowding"] = crowding(sweeps.zoo["base"], agents)
        out["subsets"][subset_name(group)] = record
    return out


def _zoo_rows(cfg: ZooConfig, plan: ManyPlan, sweeps: Sweeps) -> dict[str, dict[str, float]]:
    """The base's and every specialist's test metrics on every task of the suite (cached)."""
    tasks = list(all_tasks(cfg.domains))
    out = {}
    for name in ("base", *[f"agent_{d}" for d in cfg.domains]):
        report, cached = evaluate_cached(
            sweeps.zoo[name], split="test", n=plan.n_test, tasks=tasks, batch_size=cfg.eval_batch, cache=sweeps.evals
        )
        if not cached:
            sweeps.log(f"seed {sweeps.seed}: eval {name} [test] {report.seconds:.1f}s")
        out[name] = report.metrics
    return out


def run_many(
    cfg: ZooConfig,
    plan: ManyPlan,
    zoo_out: Path,
    work: Path,
    log: Logger,
    threads: int | None = None,
    max_concurrent: int | None = None,
    quiet: bool = True,
) -> list[dict[str, Any]]:
    """Build the six-domain zoo of each seed (cached) and run the study on it; returns the per-seed records."""
    records = []
    with contextlib.ExitStack() as stack:
        session = stack.enter_context(bench_session(threads, quiet))
        for seed in plan.seeds:
            started = time.perf_counter()
            zoo = build_zoo(cfg, zoo_out, seed, threads=threads, log=log)
            root, evals = seed_dirs(cfg, work, seed)
            sweeps = Sweeps(cfg, seed, zoo, root, evals, log, session, threads, max_concurrent, quiet)
            record = run_many_seed(cfg, plan, sweeps)
            record["timing"] = {"seconds": time.perf_counter() - started}
            records.append(record)
            log(f"seed {seed} [{cfg.regime}, many agents]: done ({record['timing']['seconds']:.0f}s)")
    return records


def smoke_plan(seeds: tuple[int, ...] = (0,)) -> ManyPlan:
    """Two sizes, two subsets each, three methods and a two-point grid: exercises every piece in CI."""
    runs = tuple(r for r in MANY_RUNS if r.label in ("linear", "task_arithmetic", "ram", "v_ram_scaled"))
    return replace(
        ManyPlan(),
        seeds=seeds,
        sizes=(2, 6),
        per_size=2,
        methods=runs,
        grid=(1.0, 2.0),
        ta_grid=(0.5, 1.0),
        n_val=8,
        n_test=8,
    )
