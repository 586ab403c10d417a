"""The zoo benchmark: build the zoo for several seeds, merge the agents with every method, evaluate, report.

Per seed: the base and the three specialists are scored on the test split; the probe measures each agent's
density and overlap; every available merge method is applied (task arithmetic's lambda is tuned on the
validation split); the dilution ablation keeps one agent's unique updates at s = 1 and s = 1/N. Every merge and
evaluation is cached under the work folder by a key of its inputs, so a rerun only does what is missing.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentmerge.zoo.build import Logger, build_zoo
from agentmerge.zoo.config import DOMAINS, ZooConfig
from agentmerge.zoo.evaluate import evaluate
from agentmerge.zoo.fisher import diagonal_fisher, is_fisher_file, save_fisher
from agentmerge.zoo.tasks import SUITE_VERSION, all_tasks

DOMAIN_TASKS = {"code": ("code",), "tool": ("tool",), "memory": ("mem_short", "mem_long")}


@dataclass(frozen=True)
class MethodRun:
    """One merge to run: a row label, an engine method name and its parameters."""

    label: str
    method: str
    params: dict[str, Any] = field(default_factory=dict)


METHOD_RUNS: tuple[MethodRun, ...] = (
    MethodRun("linear", "linear"),
    MethodRun("task_arithmetic", "task_arithmetic"),
    MethodRun("ties", "ties", {"density": 0.5, "lambda": 1.0}),
    MethodRun("dare_linear", "dare_linear", {"p": 0.5}),
    MethodRun("dare_ties", "dare_ties", {"p": 0.5}),
    MethodRun("breadcrumbs", "breadcrumbs"),
    MethodRun("della", "della"),
    MethodRun("model_stock", "model_stock"),
    MethodRun("fisher", "fisher"),
    MethodRun("ram_ties", "ram_ties"),
    MethodRun("ram", "ram"),
    MethodRun("ram_plus", "ram_plus", {"r": 0.1, "alpha": 2.0}),
)
RAM_FAMILY = frozenset({"ram", "ram_plus", "ram_ties"})
PAIRS: tuple[tuple[str, str], ...] = (("code", "tool"), ("code", "memory"), ("tool", "memory"))
PAIR_METHODS = ("linear", "task_arithmetic", "ties", "dare_ties", "ram", "ram_plus")
ABLATION_R: tuple[float, ...] = (0.0, 0.05, 0.1, 0.2, 0.5)
ABLATION_ALPHA: tuple[float, ...] = (1.0, 2.0)


def ram_plus_ablation(
    rs: Sequence[float] = ABLATION_R, alphas: Sequence[float] = ABLATION_ALPHA
) -> tuple[MethodRun, ...]:
    """RAM+ over the r x alpha grid (paper form), plus the authors' released form (R = 1.2)."""
    runs = [MethodRun(f"ram_plus_r{r:g}_a{a:g}", "ram_plus", {"r": r, "alpha": a}) for a in alphas for r in rs]
    runs.append(MethodRun("ram_plus_authors_R1.2", "ram_plus", {"form": "authors", "rescale_factor": 1.2}))
    return tuple(runs)


@dataclass(frozen=True)
class BenchPlan:
    """What the benchmark runs besides the zoo itself."""

    seeds: tuple[int, ...] = (0, 1, 2)
    ta_lambdas: tuple[float, ...] = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0)
    fisher_prompts: int = 64
    methods: tuple[MethodRun, ...] = METHOD_RUNS
    ablation: tuple[MethodRun, ...] = ()  # extra 3-agent merges (the RAM+ ablation in the paper-like regime)
    pairs: bool = False  # also the three 2-agent merges (the paper's second table)
    pair_methods: tuple[str, ...] = PAIR_METHODS  # labels of ``methods`` run on the pairs


def available_methods() -> set[str]:
    """Engine methods registered right now (empty if the engine is not importable)."""
    try:
        from agentmerge.registry import METHODS
    except ImportError:
        return set()
    return set(METHODS)


def file_digest(path: Path) -> str:
    """sha256 of a checkpoint's weights (cache key of everything computed from it)."""
    digest = hashlib.sha256()
    with (path / "model.safetensors").open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass
class SeedBench:
    """Runs (or reuses) every merge and evaluation of one seed."""

    cfg: ZooConfig
    plan: BenchPlan
    seed: int
    zoo: dict[str, Path]
    work: Path
    log: Logger
    threads: int | None = None
    domains: tuple[str, ...] = DOMAINS
    evals: Path | None = None  # evaluation cache (keyed by weights); default work/evals
    out: dict[str, Any] = field(default_factory=dict)

    @property
    def eval_tasks(self) -> list[str] | None:
        """Every task for the 3-agent merge; only the merged agents' domains for a subset (a pair)."""
        if self.domains == DOMAINS:
            return None
        return [t for d in self.domains for t in DOMAIN_TASKS[d]]

    # ------------------------------------------------------------------ evaluation (cached)
    def eval(self, ckpt: Path, label: str, split: str, tasks: Sequence[str] | None = None) -> dict[str, float]:
        n = self.cfg.n_test if split == "test" else self.cfg.n_val
        tasks = tasks or self.eval_tasks
        names = list(tasks) if tasks else list(all_tasks())
        key = _key(file_digest(ckpt), split, n, names, SUITE_VERSION)
        cache = (self.evals or self.work / "evals") / f"{label}.{split}.{key}.json"
        if cache.is_file():
            metrics: dict[str, float] = json.loads(cache.read_text())["metrics"]
            return metrics
        report = evaluate(ckpt, split=split, n=n, tasks=names, batch_size=self.cfg.eval_batch, quiet=True)
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps(report.to_dict(), indent=1) + "\n")
        self.log(f"seed {self.seed}: eval {label} [{split}] {report.seconds:.1f}s {_brief(report.metrics)}")
        return report.metrics

    # ------------------------------------------------------------------ merging (cached)
    def merge(self, label: str, method: str, params: dict[str, Any], fisher: dict[str, Path] | None = None) -> Path:
        from agentmerge.config import MergeConfig, ModelSpec
        from agentmerge.merge import merge

        agents = [self.zoo[f"agent_{d}"] for d in self.domains]
        out = self.work / "merges" / label
        key = _key(method, params, [file_digest(p) for p in [self.zoo["base"], *agents]], self.seed)
        marker = out / "bench_key.json"
        if marker.is_file() and json.loads(marker.read_text()).get("key") == key:
            return out
        specs = [
            ModelSpec(path=str(p), name=f"agent_{d}", fisher=str(fisher[d]) if fisher else None)
            for d, p in zip(self.domains, agents, strict=True)
        ]
        cfg = MergeConfig(
            method=method,
            base=str(self.zoo["base"]),
            models=specs,
            params=params,
            seed=self.seed,
            threads=self.threads,
            allow_dtype_mismatch=True,  # a bf16 base with fp32 agents; the output keeps the base's dtype
        )
        result = merge(cfg, out, force=True, quiet=True)
        marker.write_text(json.dumps({"key": key, "seconds": result.seconds}) + "\n")
        return out

    # ------------------------------------------------------------------ the stages
    def run(self) -> dict[str, Any]:
        available = available_methods()
        self.out = {"seed": self.seed, "rows": {}, "val": {}, "skipped": {}, "dilution": {}, "timing": {}}
        self.out["domains"] = list(self.domains)
        started = time.perf_counter()
        for name in ("base", *[f"agent_{d}" for d in self.domains]):
            self.out["rows"][name] = self.eval(self.zoo[name], name, "test")
        self.out["timing"]["eval_zoo"] = time.perf_counter() - started
        if self.domains == DOMAINS:
            self._probe()
        full = self.domains == DOMAINS
        for run in self.plan.methods:
            if not full and run.label not in self.plan.pair_methods:
                continue
            if run.method == "task_arithmetic":
                self._task_arithmetic(available)
            else:
                self._method(run, available)
        if full:
            for run in self.plan.ablation:
                self._method(run, available)
            self._dilution(available)
        self.out["timing"]["total"] = time.perf_counter() - started
        return self.out

    def _probe(self) -> None:
        from agentmerge.probe import probe
        from agentmerge.zoo.precision import magnitude_overlap, task_vector_stats

        agents = [str(self.zoo[f"agent_{d}"]) for d in DOMAINS]
        labels = [f"agent_{d}" for d in DOMAINS]
        base = str(self.zoo["base"])
        result = probe(base, agents, labels=labels, quiet=True, allow_dtype_mismatch=True)
        data = result.to_dict()
        self.out["probe"] = {k: data[k] for k in ("agents", "independent_overlap", "per_module", "epsilon")}
        self.out["probe"]["drift"] = [task_vector_stats(base, a)["drift"] for a in agents]
        self.out["probe"]["magnitude"] = magnitude_overlap(base, agents, labels)

    def _task_arithmetic(self, available: set[str]) -> None:
        if "task_arithmetic" not in available:
            self.out["skipped"]["task_arithmetic"] = "method not in the engine registry"
            return
        scores: dict[str, float] = {}
        for lam in self.plan.ta_lambdas:
            label = f"ta_lambda{lam:g}"
            metrics = self.eval(self.merge(label, "task_arithmetic", {"lambda": lam}), label, "val")
            scores[f"{lam:g}"] = agentic_average(metrics)
        best = max(scores, key=lambda k: scores[k])
        self.out["val"]["task_arithmetic"] = {"val_agentic_avg": scores, "best_lambda": float(best)}
        path = self.merge(f"ta_lambda{best}", "task_arithmetic", {"lambda": float(best)})
        self.out["rows"]["task_arithmetic"] = self.eval(path, f"ta_lambda{best}", "test")

    def _method(self, run: MethodRun, available: set[str]) -> None:
        if run.method not in available:
            self.out["skipped"][run.label] = "method not in the engine registry when the bench ran"
            self.log(f"seed {self.seed}: skipping {run.label} (not in the engine registry)")
            return
        fisher = self._fisher() if run.method == "fisher" else None
        try:
            path = self.merge(run.label, run.method, run.params, fisher)
        except Exception as exc:  # a failing engine method must not sink the other rows
            self.out["skipped"][run.label] = f"merge failed: {type(exc).__name__}: {exc}"
            self.log(f"seed {self.seed}: {run.label} failed: {exc}")
            return
        self.out["rows"][run.label] = self.eval(path, run.label, "test")

    def _fisher(self) -> dict[str, Path]:
        paths: dict[str, Path] = {}
        for i, domain in enumerate(DOMAINS):
            agent = self.zoo[f"agent_{domain}"]
            out = self.work / "fisher" / f"agent_{domain}.{file_digest(agent)}.safetensors"
            if not is_fisher_file(out):  # also a file of an older zoo, written without the Fisher mark
                fisher = diagonal_fisher(agent, domain, self.plan.fisher_prompts, 7000 + 10 * self.seed + i)
                save_fisher(fisher, out)
            paths[domain] = out
        return paths

    def _dilution(self, available: set[str]) -> None:
        if "unique_only" not in available:
            self.out["skipped"]["unique_only"] = "method not in the engine registry"
            return
        n = len(self.domains)
        for index, domain in enumerate(self.domains):
            row: dict[str, dict[str, float]] = {}
            for tag, scale in (("s1", 1.0), ("s1_over_n", 1.0 / n)):
                label = f"unique_{domain}_{tag}"
                params = {"agent": index, "scale": scale}
                path = self.merge(label, "unique_only", params)
                row[tag] = self.eval(path, label, "test", DOMAIN_TASKS[domain])
            self.out["dilution"][domain] = row


def agentic_average(metrics: dict[str, float]) -> float:
    """Mean of the trained-domain metrics (code, tool, memory); held-out columns are not in it."""
    values = [v for k, v in metrics.items() if not k.startswith("reverse.")]
    return sum(values) / len(values)


def _brief(metrics: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.3f}" for k, v in metrics.items())


def run_bench(
    cfg: ZooConfig,
    plan: BenchPlan,
    zoo_out: Path,
    work: Path,
    log: Logger,
    threads: int | None = None,
) -> list[dict[str, Any]]:
    """Build the zoo of ``cfg``'s regime and bench every seed; returns the per-seed records.

    Merges are cached under ``work/{regime}/seed{S}`` (pairs under ``.../pair_{a}_{b}``); evaluations under
    ``work/evals/seed{S}`` (keyed by the weights' digest, so a base or agent shared by regimes is scored once).
    """
    records = []
    for seed in plan.seeds:
        started = time.perf_counter()
        zoo = build_zoo(cfg, zoo_out, seed, threads=threads, log=log)
        built = time.perf_counter() - started
        root = work / cfg.regime / f"seed{seed}"
        evals = work / "evals" / f"seed{seed}"
        bench = SeedBench(cfg, plan, seed, zoo, root, log, threads, evals=evals)
        record = bench.run()
        record["timing"]["build"] = built
        record["stages"] = {name: _stage_summary(path) for name, path in zoo.items()}
        record["pairs"] = {}
        if plan.pairs:
            for pair in PAIRS:
                sub = SeedBench(cfg, plan, seed, zoo, root / f"pair_{pair[0]}_{pair[1]}", log, threads, pair, evals)
                record["pairs"]["+".join(pair)] = sub.run()
        records.append(record)
        log(
            f"seed {seed} [{cfg.regime}]: done (build {built:.0f}s, bench {time.perf_counter() - started - built:.0f}s)"
        )
    return records


def _stage_summary(path: Path) -> dict[str, Any]:
    meta = json.loads((path / "zoo_stage.json").read_text())
    summary = {"path": str(path), "seconds": meta.get("seconds")}
    recipe = path / "recipe.json"
    if recipe.is_file():
        summary["recipe"] = json.loads(recipe.read_text())
    return summary
