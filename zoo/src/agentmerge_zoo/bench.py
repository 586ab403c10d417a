"""The zoo benchmark: build the zoo for several seeds, merge the agents with every method, evaluate, report.

Per seed: the base and the three specialists are scored on the test split; with ``plan.check`` each agent's
convergence check runs on validation (``converge.py``); the probe measures each agent's density and overlap;
every available merge method is applied (task arithmetic's lambda tuned on the validation split; with
``plan.fair`` every method at its defaults and, where it has an output scale, tuned alike: ``fair.py``); the
dilution ablation keeps one agent's unique updates at s = 1 and s = 1/N.

The merges run through the sweep engine (``agentmerge.sweep``): per seed and regime, one sweep of explicit
trials on the validation split (the tuning grids) and one on the test split (every other merge),
each trial named by its row label, scored by the ``zoo`` evaluator and recorded in the sweep's
``results.jsonl``; the tables are built from those records. Building the zoo, scoring the base and the agents,
the probe and the Fisher files are not merges and run here. A rerun skips every recorded trial, and every
evaluation is cached by the weights' sha256, so it only does what is missing.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentmerge.api import RaySession, choose_scale
from agentmerge_zoo.bench_sweeps import Entry, Records, Sweeps, bench_session, brief, failure, trial_metrics
from agentmerge_zoo.benchplan import DILUTION_TAGS, FISHER_METHODS, PAIRS, BenchPlan, MethodRun, available_methods
from agentmerge_zoo.build import Logger, build_zoo
from agentmerge_zoo.config import DOMAINS, ZooConfig, seed_dirs
from agentmerge_zoo.evaluate import agentic_average, evaluate_cached, file_digest
from agentmerge_zoo.fair import TUNED, output_scale, resolved
from agentmerge_zoo.fisher import diagonal_fisher, is_fisher_file, save_fisher
from agentmerge_zoo.tasks import all_tasks, domain_tasks


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
            self.log(f"seed {self.seed}: eval {label} [{split}] {report.seconds:.1f}s {brief(report.metrics)}")
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
        from agentmerge import probe
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
        """The runs with their own parameter chosen on validation (``tune``) whose method the engine has."""
        return [r for r in self.runs() if r.tune and r.method in available]

    def scaled(self, available: set[str]) -> list[tuple[MethodRun, str]]:
        """The fair protocol's runs (``fair.py``; none unless ``plan.fair``): main-table runs whose method has an
        output scale, with its name."""
        if not self.plan.fair:
            return []
        pairs = [(r, output_scale(r.method)) for r in self.runs() if r.kind == "main" and not r.tune]
        return [(r, scale) for r, scale in pairs if scale is not None and r.method in available]

    @staticmethod
    def val_name(run: MethodRun, value: float) -> str:
        """A tuning trial's name: ``ta_lambda1.5`` for task arithmetic (the names of older benches), else
        ``ties_tune1.5``."""
        return f"ta_lambda{value:g}" if run.label == "task_arithmetic" else f"{run.label}_tune{value:g}"

    @staticmethod
    def tuned_name(run: MethodRun, value: float) -> str:
        """The test trial at the value chosen on validation: ``ta_lambda2`` for task arithmetic, else ``ties_at2``."""
        return f"ta_lambda{value:g}" if run.label == "task_arithmetic" else f"{run.label}_at{value:g}"

    def val_entries(self, available: set[str]) -> list[Entry]:
        """The validation trials: each tuned run at each value of its grid (task arithmetic's lambdas; with
        ``plan.fair`` every output scale over that one grid), scored on validation."""
        out = [
            self.entry(f"{r.label}_tune{v:g}", r.method, {**r.params, r.tune: v})
            for r in self.tuned(available)
            for v in self.plan.tune_grid
        ]
        grid = self.plan.scales
        if self.plan.fair:
            scaled = self.scaled(available)
            return [
                self.entry(self.val_name(r, v), r.method, {**r.params, s: v}) for r, s in scaled for v in grid
            ] + out
        if not any(r.method == "task_arithmetic" for r in self.runs()) or "task_arithmetic" not in available:
            return out
        return [self.entry(f"ta_lambda{lam:g}", "task_arithmetic", {"lambda": lam}) for lam in grid] + out

    def read_val(self, records: Records) -> None:
        """Choose each tuned value by the validation agentic average (under the fair protocol by
        ``agentmerge.api.choose_scale``, the library's one rule; without it task arithmetic's lambda, the first best
        in grid order, as older benches did)."""
        available = available_methods()
        for run, scale in self.scaled(available):
            scores = self._val_scores(records, [(v, self.val_name(run, v)) for v in self.plan.scales])
            best = choose_scale(scores)
            if best is not None:
                entry = {"param": scale, "val_agentic_avg": {f"{v:g}": s for v, s in scores.items()}, "best": best}
                self.out["val"][run.label] = entry
        if not self.plan.fair:
            best_ta = self._best_on_val(records, "ta_lambda", self.plan.scales)
            if best_ta is not None:
                entry = {"param": "lambda", "val_agentic_avg": best_ta[1], "best": best_ta[0]}
                self.out["val"]["task_arithmetic"] = entry
        for run in self.tuned(available):
            best_run = self._best_on_val(records, f"{run.label}_tune", self.plan.tune_grid)
            if best_run is not None:
                self.out["val"][run.label] = {"param": run.tune, "val_agentic_avg": best_run[1], "best": best_run[0]}

    def _val_scores(self, records: Records, names: Sequence[tuple[float, str]]) -> dict[float, float]:
        """The validation agentic average of each value whose trial finished."""
        found = {value: records.get(self.prefix + name) for value, name in names}
        return {v: agentic_average(trial_metrics(r)) for v, r in found.items() if r is not None and r["status"] == "ok"}

    def _best_on_val(self, records: Records, stem: str, grid: Sequence[float]) -> tuple[float, dict[str, float]] | None:
        scores = self._val_scores(records, [(v, f"{stem}{v:g}") for v in grid])
        if not scores:
            return None
        return max(scores, key=lambda v: scores[v]), {f"{v:g}": s for v, s in scores.items()}

    def test_entries(self, available: set[str], fisher: dict[str, Path] | None) -> list[Entry]:
        """Every merge of the table (task arithmetic at its chosen lambda; under the fair protocol every run at its
        defaults and each scaled run at its chosen value), the ablation, the dilution runs."""
        out = [e for run in self.runs() for e in self._test_entry(run, available, fisher)]
        if self.full:
            out += [e for run in self.plan.ablation for e in self._test_entry(run, available, fisher)]
            out += self._dilution_entries(available)
        return out

    def _test_entry(self, run: MethodRun, available: set[str], fisher: dict[str, Path] | None) -> list[Entry]:
        if run.method not in available:
            self.out["skipped"][run.label] = "method not in the engine registry when the bench ran"
            self.log(f"seed {self.seed}: skipping {run.label} (not in the engine registry)")
            return []
        scaled = dict((r.label, s) for r, s in self.scaled(available))
        if run.label in scaled:
            return [self.entry(run.label, run.method, run.params), *self._tuned_entry(run, scaled[run.label])]
        if run.method == "task_arithmetic" or run.tune:
            param = "lambda" if run.method == "task_arithmetic" else run.tune
            chosen = self.out["val"].get(run.label)
            if chosen is None:
                self.out["skipped"][run.label] = f"no {param} trial finished on validation"
                return []
            best = chosen["best"]
            return [self.entry(self.tuned_name(run, best), run.method, {**run.params, param: best})]
        if run.method in FISHER_METHODS and fisher is not None:
            return [self.entry(run.label, run.method, run.params, fisher=[str(fisher[d]) for d in self.domains])]
        return [self.entry(run.label, run.method, run.params)]

    def _tuned_entry(self, run: MethodRun, scale: str) -> list[Entry]:
        """The test trial of a scaled run at its chosen value; none when that value is its default (the tuned row
        is then the defaults row) or no value was chosen (noted as skipped)."""
        chosen = self.out["val"].get(run.label)
        if chosen is None:
            self.out["skipped"][run.label + TUNED] = f"no {scale} trial finished on validation"
            return []
        params = {**run.params, scale: chosen["best"]}
        if resolved(run.method, params) == resolved(run.method, run.params):
            return []
        return [self.entry(self.tuned_name(run, chosen["best"]), run.method, params)]

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

    def _test_names(self, run: MethodRun, scaled: dict[str, str]) -> dict[str, str | None]:
        """Row label -> test trial name (None: the tuned row is the defaults row)."""
        if run.label in scaled:
            names: dict[str, str | None] = {run.label: run.label}
            if run.label + TUNED not in self.out["skipped"]:
                chosen, scale = self.out["val"][run.label], scaled[run.label]
                params = {**run.params, scale: chosen["best"]}
                same = resolved(run.method, params) == resolved(run.method, run.params)
                names[run.label + TUNED] = None if same else self.tuned_name(run, chosen["best"])
            return names
        if run.method == "task_arithmetic" or run.tune:  # read_val has just written "best"
            return {run.label: self.tuned_name(run, self.out["val"][run.label]["best"])}
        return {run.label: run.label}

    def read_test(self, records: Records) -> None:
        """The table's rows and the dilution scores, from the test sweep's records (failures noted as skipped)."""
        scaled = dict((r.label, s) for r, s in self.scaled(available_methods()))
        for run in [*self.runs(), *(self.plan.ablation if self.full else ())]:
            if run.label in self.out["skipped"]:
                continue
            for label, name in self._test_names(run, scaled).items():
                rec = records[self.prefix + name] if name is not None else None
                if rec is None:
                    if run.label in self.out["rows"]:
                        self.out["rows"][label] = self.out["rows"][run.label]
                elif rec["status"] == "ok":
                    self.out["rows"][label] = trial_metrics(rec)
                else:
                    self.out["skipped"][label] = failure(rec)
                    self.log(f"seed {self.seed}: {label} failed: {rec['error']}")
        if self.full and "unique_only" not in self.out["skipped"]:
            self._read_dilution(records)

    def _read_dilution(self, records: Records) -> None:
        for domain in self.domains:
            recs = {tag: records[f"unique_{domain}_{tag}"] for tag in DILUTION_TAGS}
            if all(r["status"] == "ok" for r in recs.values()):
                self.out["dilution"][domain] = {tag: trial_metrics(r) for tag, r in recs.items()}
            else:
                self.out["skipped"][f"unique_{domain}"] = next(failure(r) for r in recs.values() if r["status"] != "ok")


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
            root, evals = seed_dirs(cfg, work, seed)
            sweeps = Sweeps(cfg, seed, zoo, root, evals, log, session, threads, max_concurrent, quiet)
            record = run_seed(plan, sweeps)
            record["timing"]["build"] = built
            record["stages"] = {name: _stage_summary(path) for name, path in zoo.items()}
            records.append(record)
            bench = time.perf_counter() - started - built
            log(f"seed {seed} [{cfg.regime}]: done (build {built:.0f}s, bench {bench:.0f}s)")
    return records


def run_seed(plan: BenchPlan, sweeps: Sweeps) -> dict[str, Any]:
    """One seed: the 3-agent bench and, with ``plan.pairs``, the three pairs, their merges in two sweeps.

    First the validation sweep (task arithmetic's lambda grid, of every agent set), then the test sweep (every
    merge of the tables at the chosen lambdas, the RAM+ ablation, the dilution runs). The Fisher files are
    made between the two when a Fisher merge is planned. With ``plan.check``, first the convergence check of
    every agent (``converge.py``; not merges of the tables, so not sweep trials).
    """
    available = available_methods()
    cfg, seed, zoo = sweeps.cfg, sweeps.seed, sweeps.zoo
    full = SeedBench(cfg, plan, seed, zoo, sweeps.evals, sweeps.log)
    pairs = [SeedBench(cfg, plan, seed, zoo, sweeps.evals, sweeps.log, pair) for pair in PAIRS]
    benches = [full, *(pairs if plan.pairs else [])]
    for bench in benches:
        bench.begin()
    if plan.check:
        full.out["convergence"] = _check(plan, sweeps)
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


def _check(plan: BenchPlan, sweeps: Sweeps) -> dict[str, Any]:
    """Each agent's convergence check on validation (evaluations cached in the seed's cache)."""
    from agentmerge_zoo.converge import check_seed

    scratch = sweeps.root / "check-scratch"
    return check_seed(sweeps.cfg, sweeps.zoo, sweeps.evals, scratch, plan.check_n, sweeps.log)


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
