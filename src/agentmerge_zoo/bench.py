"""The zoo benchmark: build the zoo for several seeds, merge the agents with every method, evaluate, report.

Per seed: the base and the three specialists are scored on the test split; the probe measures each agent's
density and overlap; every available merge method is applied (task arithmetic's lambda is tuned on the
validation split); the dilution ablation keeps one agent's unique updates at s = 1 and s = 1/N.

The merges run through the sweep engine (``agentmerge.sweep``): per seed and regime, one sweep of explicit
trials on the validation split (task arithmetic's lambda grid) and one on the test split (every other merge),
each trial named by its row label, scored by the ``zoo`` evaluator and recorded in the sweep's
``results.jsonl``; the tables are built from those records. Building the zoo, scoring the base and the agents,
the probe and the Fisher files are not merges and run here. A rerun skips every recorded trial, and every
evaluation is cached by the weights' sha256, so it only does what is missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentmerge.sweep.run import RaySession
from agentmerge_zoo.benchplan import DILUTION_TAGS, FISHER_METHODS, PAIRS, BenchPlan, MethodRun, available_methods
from agentmerge_zoo.build import Logger, build_zoo
from agentmerge_zoo.config import DOMAINS, ZooConfig
from agentmerge_zoo.evaluate import agentic_average, cache_key, evaluate_cached, file_digest
from agentmerge_zoo.fisher import diagonal_fisher, is_fisher_file, save_fisher
from agentmerge_zoo.tasks import SUITE_VERSION, all_tasks, domain_tasks

Entry = dict[str, Any]  # one explicit trial of a sweep file (name, method, params, models, ...)
Records = dict[str, dict[str, Any]]  # a sweep's records of this bench's trials, by trial name


@dataclass
class SeedBench:
    """The merges and evaluations of one seed on one set of agents (all of the zoo's, or a subset such as a pair).

    The base and agents are scored here (cached); the merges are trials of the seed's sweeps
    (:func:`run_seed`): :meth:`val_entries` then :meth:`read_val`, :meth:`test_entries` then :meth:`read_test`.
    """

    cfg: ZooConfig
    plan: BenchPlan
    seed: int
    zoo: dict[str, Path]
    evals: Path  # the evaluation cache (keyed by the weights)
    log: Logger
    domains: tuple[str, ...] = DOMAINS
    out: dict[str, Any] = field(default_factory=dict)
    started: float = 0.0
    subset: bool = False  # a subset bench even when it merges every agent (the many-agent study's N = 6)

    @property
    def full(self) -> bool:
        return not self.subset and self.domains == self.cfg.domains

    @property
    def eval_tasks(self) -> list[str] | None:
        """Every task for the merge of all agents; only the merged agents' domains for a subset (a pair)."""
        if self.full:
            return None if self.cfg.suite == "core" else list(all_tasks(self.cfg.domains))
        return [t for d in self.domains for t in domain_tasks(d)]

    @property
    def prefix(self) -> str:
        """Trial names of a pair start with ``code+tool.``; the 3-agent merges' are the row labels."""
        return "" if self.full else "+".join(self.domains) + "."

    # ------------------------------------------------------------------ the base and the agents (cached)
    def eval(self, ckpt: Path, label: str, split: str, tasks: Sequence[str] | None = None) -> dict[str, float]:
        n = self.cfg.n_test if split == "test" else self.cfg.n_val
        tasks = tasks or self.eval_tasks
        batch = self.cfg.eval_batch
        report, cached = evaluate_cached(
            ckpt, split=split, n=n, tasks=tasks, batch_size=batch, cache=self.evals, label=label
        )
        if not cached:
            self.log(f"seed {self.seed}: eval {label} [{split}] {report.seconds:.1f}s {_brief(report.metrics)}")
        return report.metrics

    def begin(self, rows: dict[str, dict[str, float]] | None = None) -> None:
        """Score the base and the agents on the test split (or take their ``rows``, scored on more tasks, and keep
        this bench's tasks' metrics); probe the agents of a full bench."""
        self.out = {"seed": self.seed, "rows": {}, "val": {}, "skipped": {}, "dilution": {}, "timing": {}}
        self.out["domains"] = list(self.domains)
        self.started = time.perf_counter()
        for name in ("base", *[f"agent_{d}" for d in self.domains]):
            if rows is None:
                self.out["rows"][name] = self.eval(self.zoo[name], name, "test")
            else:
                self.out["rows"][name] = {m: v for m, v in rows[name].items() if self._scores(m)}
        self.out["timing"]["eval_zoo"] = time.perf_counter() - self.started
        if self.full:
            self._probe()

    def _scores(self, metric: str) -> bool:
        """Whether a metric is one of this bench's evaluation tasks' (the held-out skill only in a full bench)."""
        prefix = metric.split(".", 1)[0]
        return prefix in self.domains or (self.full and prefix == "reverse")

    def finish(self) -> dict[str, Any]:
        self.out["timing"]["total"] = time.perf_counter() - self.started
        return self.out

    def _probe(self) -> None:
        from agentmerge.engine.probe import probe
        from agentmerge_zoo.precision import magnitude_overlap, task_vector_stats

        agents = [str(self.zoo[f"agent_{d}"]) for d in self.domains]
        labels = [f"agent_{d}" for d in self.domains]
        base = str(self.zoo["base"])
        result = probe(base, agents, labels=labels, quiet=True)
        data = result.to_dict()
        self.out["probe"] = {k: data[k] for k in ("agents", "independent_overlap", "per_module", "epsilon")}
        self.out["probe"]["drift"] = [task_vector_stats(base, a)["drift"] for a in agents]
        self.out["probe"]["magnitude"] = magnitude_overlap(base, agents, labels)

    # ------------------------------------------------------------------ the merges, as sweep trials
    def entry(self, label: str, method: str, params: dict[str, Any], **extra: Any) -> Entry:
        """The sweep trial of one merge of this bench's agents, named by its row label."""
        out: Entry = {"name": self.prefix + label, "method": method, "params": params}
        out["models"] = [self.cfg.domains.index(d) for d in self.domains]
        if self.eval_tasks:
            out["evaluate_options"] = {"tasks": self.eval_tasks}
        return out | extra

    def runs(self) -> list[MethodRun]:
        """The method runs of this bench, in table order (a pair runs only the plan's pair methods)."""
        return [r for r in self.plan.methods if self.full or r.label in self.plan.pair_methods]

    def tuned(self, available: set[str]) -> list[MethodRun]:
        """The runs with a parameter chosen on validation (``tune``) whose method the engine has."""
        return [r for r in self.runs() if r.tune and r.method in available]

    def val_entries(self, available: set[str]) -> list[Entry]:
        """Task arithmetic at each lambda of the grid, and each tuned run at each value, scored on validation."""
        grid = self.plan.ta_lambdas
        out = [
            self.entry(f"{r.label}_tune{v:g}", r.method, {**r.params, r.tune: v})
            for r in self.tuned(available)
            for v in self.plan.tune_grid
        ]
        if not any(r.method == "task_arithmetic" for r in self.runs()) or "task_arithmetic" not in available:
            return out
        return [self.entry(f"ta_lambda{lam:g}", "task_arithmetic", {"lambda": lam}) for lam in grid] + out

    def read_val(self, records: Records) -> None:
        """Choose task arithmetic's lambda (and each tuned run's value) by the validation agentic average."""
        best = self._best_on_val(records, "ta_lambda", self.plan.ta_lambdas)
        if best is not None:
            self.out["val"]["task_arithmetic"] = {"val_agentic_avg": best[1], "best_lambda": best[0]}
        for run in self.tuned(available_methods()):
            best = self._best_on_val(records, f"{run.label}_tune", self.plan.tune_grid)
            if best is not None:
                self.out["val"][run.label] = {"param": run.tune, "val_agentic_avg": best[1], "best": best[0]}

    def _best_on_val(self, records: Records, stem: str, grid: Sequence[float]) -> tuple[float, dict[str, float]] | None:
        scores = {}
        for value in grid:
            rec = records.get(f"{self.prefix}{stem}{value:g}")
            if rec is not None and rec["status"] == "ok":
                scores[f"{value:g}"] = agentic_average(_metrics(rec))
        if not scores:
            return None
        return float(max(scores, key=lambda k: scores[k])), scores

    def test_entries(self, available: set[str], fisher: dict[str, Path] | None) -> list[Entry]:
        """Every merge of the table (task arithmetic at its chosen lambda), the ablation, the dilution runs."""
        out = [e for run in self.runs() if (e := self._test_entry(run, available, fisher)) is not None]
        if self.full:
            out += [e for run in self.plan.ablation if (e := self._test_entry(run, available, fisher)) is not None]
            out += self._dilution_entries(available)
        return out

    def _test_entry(self, run: MethodRun, available: set[str], fisher: dict[str, Path] | None) -> Entry | None:
        if run.method == "task_arithmetic":
            if "task_arithmetic" not in available:
                self.out["skipped"]["task_arithmetic"] = "method not in the engine registry"
                return None
            chosen = self.out["val"].get("task_arithmetic")
            if chosen is None:
                self.out["skipped"]["task_arithmetic"] = "no lambda trial finished on validation"
                return None
            best = chosen["best_lambda"]
            return self.entry(f"ta_lambda{best:g}", "task_arithmetic", {"lambda": best})
        if run.tune and run.method in available:
            chosen = self.out["val"].get(run.label)
            if chosen is None:
                self.out["skipped"][run.label] = f"no {run.tune} trial finished on validation"
                return None
            return self.entry(f"{run.label}_at{chosen['best']:g}", run.method, {**run.params, run.tune: chosen["best"]})
        if run.method not in available:
            self.out["skipped"][run.label] = "method not in the engine registry when the bench ran"
            self.log(f"seed {self.seed}: skipping {run.label} (not in the engine registry)")
            return None
        if run.method in FISHER_METHODS and fisher is not None:
            return self.entry(run.label, run.method, run.params, fisher=[str(fisher[d]) for d in self.domains])
        return self.entry(run.label, run.method, run.params)

    def _dilution_entries(self, available: set[str]) -> list[Entry]:
        if "unique_only" not in available:
            self.out["skipped"]["unique_only"] = "method not in the engine registry"
            return []
        out = []
        scales = dict(zip(DILUTION_TAGS, (1.0, 1.0 / len(self.domains)), strict=True))
        for index, domain in enumerate(self.domains):
            options = {"tasks": list(domain_tasks(domain))}
            for tag, scale in scales.items():
                params = {"agent": index, "scale": scale}
                out.append(self.entry(f"unique_{domain}_{tag}", "unique_only", params, evaluate_options=options))
        return out

    def read_test(self, records: Records) -> None:
        """The table's rows and the dilution scores, from the test sweep's records (failures noted as skipped)."""
        for run in [*self.runs(), *(self.plan.ablation if self.full else ())]:
            if run.label in self.out["skipped"]:
                continue
            name = run.label
            if run.method == "task_arithmetic":
                name = f"ta_lambda{self.out['val']['task_arithmetic']['best_lambda']:g}"
            elif run.tune:
                name = f"{run.label}_at{self.out['val'][run.label]['best']:g}"
            rec = records[self.prefix + name]
            if rec["status"] == "ok":
                self.out["rows"][run.label] = _metrics(rec)
            else:
                self.out["skipped"][run.label] = _failure(rec)
                self.log(f"seed {self.seed}: {run.label} failed: {rec['error']}")
        if self.full and "unique_only" not in self.out["skipped"]:
            for domain in self.domains:
                recs = {tag: records[f"unique_{domain}_{tag}"] for tag in DILUTION_TAGS}
                if all(r["status"] == "ok" for r in recs.values()):
                    self.out["dilution"][domain] = {tag: _metrics(r) for tag, r in recs.items()}
                else:
                    self.out["skipped"][f"unique_{domain}"] = next(
                        _failure(r) for r in recs.values() if r["status"] != "ok"
                    )


def _metrics(record: dict[str, Any]) -> dict[str, float]:
    """A trial's zoo metrics without the evaluator's ``agentic_avg`` (the tables compute their own)."""
    return {k: float(v) for k, v in record["metrics"].items() if k != "agentic_avg"}


def _failure(record: dict[str, Any]) -> str:
    stage = "evaluation" if "merge_seconds" in record else "merge"
    return f"{stage} failed: {record.get('error', '')}"


def _brief(metrics: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.3f}" for k, v in metrics.items())


def run_bench(
    cfg: ZooConfig,
    plan: BenchPlan,
    zoo_out: Path,
    work: Path,
    log: Logger,
    threads: int | None = None,
    max_concurrent: int | None = None,
    quiet: bool = True,
    session: RaySession | None = None,
) -> list[dict[str, Any]]:
    """Build the zoo of ``cfg``'s regime and bench every seed; returns the per-seed records.

    The merges of seed S are the trials of two sweeps (:func:`run_seed`) under ``work/{regime}/seed{S}``;
    evaluations are cached under ``work/evals/seed{S}`` (keyed by the weights' digest, so a base or agent shared
    by regimes is scored once). One local Ray runtime (``session``, or one of its own) serves every sweep; a
    trial takes ``threads`` CPUs (default all) and at most ``max_concurrent`` run at once (default: CPUs /
    ``threads``).
    """
    records = []
    with contextlib.ExitStack() as stack:
        session = session or stack.enter_context(bench_session(threads, quiet))
        for seed in plan.seeds:
            started = time.perf_counter()
            zoo = build_zoo(cfg, zoo_out, seed, threads=threads, log=log)
            built = time.perf_counter() - started
            root, evals = work / cfg.regime / f"seed{seed}", work / "evals" / f"seed{seed}"
            sweeps = Sweeps(cfg, seed, zoo, root, evals, log, session, threads, max_concurrent, quiet)
            record = run_seed(plan, sweeps)
            record["timing"]["build"] = built
            record["stages"] = {name: _stage_summary(path) for name, path in zoo.items()}
            records.append(record)
            bench = time.perf_counter() - started - built
            log(f"seed {seed} [{cfg.regime}]: done (build {built:.0f}s, bench {bench:.0f}s)")
    return records


def bench_session(threads: int | None, quiet: bool) -> RaySession:
    """The local Ray runtime of a bench, started by its first trial; ``--threads`` above the core count is honoured."""
    return RaySession(quiet=quiet, num_cpus=max(os.cpu_count() or 1, threads or 1))


@dataclass(frozen=True)
class Sweeps:
    """One seed's sweeps: what they merge (the seed's zoo), where they run, and on how many CPUs."""

    cfg: ZooConfig
    seed: int
    zoo: dict[str, Path]
    root: Path  # work/{regime}/seed{S}: sweep-val/ and sweep-test/ (results.jsonl, trials/NAME), fisher/
    evals: Path
    log: Logger
    session: RaySession
    threads: int | None = None
    max_concurrent: int | None = None
    quiet: bool = True

    def config(self, split: str, entries: list[Entry], n: int | None = None) -> Any:
        """The sweep of ``entries`` on ``split`` (val or test, ``n`` prompts per task, default the zoo's): this seed's
        agents, merged at its seed."""
        from agentmerge.sweep.spec import sweep_from_dict

        domains = self.cfg.domains
        inputs = [self.zoo["base"], *(self.zoo[f"agent_{d}"] for d in domains)]
        data = {
            "base": str(self.zoo["base"]),
            "models": [str(self.zoo[f"agent_{d}"]) for d in domains],
            "trials": entries,
            "seeds": [self.seed],
            "evaluate": "zoo:validation" if split == "val" else "zoo:test",
            "evaluate_options": {
                "n": n or (self.cfg.n_val if split == "val" else self.cfg.n_test),
                "batch_size": self.cfg.eval_batch,
                "cache": str(self.evals),
            },
            "fingerprint": cache_key([file_digest(p) for p in inputs], SUITE_VERSION),
            "resources": {"cpus": self.threads or os.cpu_count() or 1},
            "keep": "all",
        }
        return sweep_from_dict(data, f"zoo bench seed {self.seed} ({split})")

    def run(self, split: str, entries: list[Entry], n: int | None = None, folder: Path | None = None) -> Records:
        """Run one sweep (its recorded trials skipped) and return this sweep's records by trial name."""
        from agentmerge.sweep.run import run_sweep
        from agentmerge.sweep.spec import choose, trials

        if not entries:
            return {}
        sweep = self.config(split, entries, n)
        folder = folder or self.root / f"sweep-{split}"
        outcome = run_sweep(sweep, folder, max_concurrent=self.max_concurrent, quiet=self.quiet, session=self.session)
        for rec in outcome.finished:
            brief = _brief(_metrics(rec)) if rec["status"] == "ok" else rec.get("error", "")
            self.log(f"seed {self.seed}: {rec['name']} [{split}] {rec['seconds']:.1f}s {brief}")
        self.log(f"seed {self.seed}: {split} sweep: {outcome.ran} trials ran, {outcome.skipped} recorded earlier")
        ids = {t.id for t in trials(sweep, choose(sweep))}
        return {r["name"]: r for r in outcome.records if r["trial"] in ids}


def run_seed(plan: BenchPlan, sweeps: Sweeps) -> dict[str, Any]:
    """One seed: the 3-agent bench and, with ``plan.pairs``, the three pairs, their merges in two sweeps.

    First the validation sweep (task arithmetic's lambda grid, of every agent set), then the test sweep (every
    merge of the tables at the chosen lambdas, the RAM+ ablation, the dilution runs). The Fisher files are
    made between the two when a Fisher merge is planned.
    """
    available = available_methods()
    cfg, seed, zoo = sweeps.cfg, sweeps.seed, sweeps.zoo
    full = SeedBench(cfg, plan, seed, zoo, sweeps.evals, sweeps.log)
    pairs = [SeedBench(cfg, plan, seed, zoo, sweeps.evals, sweeps.log, pair) for pair in PAIRS]
    benches = [full, *(pairs if plan.pairs else [])]
    for bench in benches:
        bench.begin()
    records = sweeps.run("val", [e for b in benches for e in b.val_entries(available)])
    for bench in benches:
        bench.read_val(records)
    wants_fisher = any(r.method in FISHER_METHODS & available for b in benches for r in b.runs())
    fisher = _fisher(plan, sweeps) if wants_fisher else None
    records = sweeps.run("test", [e for b in benches for e in b.test_entries(available, fisher)])
    for bench in benches:
        bench.read_test(records)
    record = full.finish()
    record["pairs"] = {"+".join(b.domains): b.finish() for b in benches[1:]}
    return record


def _fisher(plan: BenchPlan, sweeps: Sweeps) -> dict[str, Path]:
    """Each agent's diagonal Fisher file (cached by the agent's digest; not a merge, so not a sweep trial)."""
    paths: dict[str, Path] = {}
    for i, domain in enumerate(sweeps.cfg.domains):
        agent = sweeps.zoo[f"agent_{domain}"]
        out = sweeps.root / "fisher" / f"agent_{domain}.{file_digest(agent)}.safetensors"
        if not is_fisher_file(out):  # also a file of an older zoo, written without the Fisher mark
            fisher = diagonal_fisher(agent, domain, plan.fisher_prompts, 7000 + 10 * sweeps.seed + i)
            save_fisher(fisher, out)
        paths[domain] = out
    return paths


def _stage_summary(path: Path) -> dict[str, Any]:
    meta = json.loads((path / "zoo_stage.json").read_text())
    summary = {"path": str(path), "seconds": meta.get("seconds")}
    recipe = path / "recipe.json"
    if recipe.is_file():
        summary["recipe"] = json.loads(recipe.read_text())
    return summary
