"""The zoo bench's sweeps: one seed's merges as trials of agentmerge's sweep engine (``Sweeps``), on one local Ray
runtime (``bench_session``), and the helpers that read their records."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentmerge.api import RaySession
from agentmerge_zoo.build import Logger
from agentmerge_zoo.config import ZooConfig
from agentmerge_zoo.evaluate import cache_key, file_digest
from agentmerge_zoo.tasks import SUITE_VERSION

Entry = dict[str, Any]  # one explicit trial of a sweep file (name, method, params, models, ...)
Records = dict[str, dict[str, Any]]  # a sweep's records of this bench's trials, by trial name


def trial_metrics(record: dict[str, Any]) -> dict[str, float]:
    """A trial's zoo metrics without the evaluator's ``agentic_avg`` (the tables compute their own)."""
    return {k: float(v) for k, v in record["metrics"].items() if k != "agentic_avg"}


def failure(record: dict[str, Any]) -> str:
    stage = "evaluation" if "merge_seconds" in record else "merge"
    return f"{stage} failed: {record.get('error', '')}"


def brief(metrics: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.3f}" for k, v in metrics.items())


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
        from agentmerge.api import sweep_from_dict

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
        from agentmerge.api import run_sweep
        from agentmerge.api import sweep_settings as choose
        from agentmerge.api import sweep_trials as trials

        if not entries:
            return {}
        sweep = self.config(split, entries, n)
        folder = folder or self.root / f"sweep-{split}"
        outcome = run_sweep(sweep, folder, max_concurrent=self.max_concurrent, quiet=self.quiet, session=self.session)
        for rec in outcome.finished:
            text = brief(trial_metrics(rec)) if rec["status"] == "ok" else rec.get("error", "")
            self.log(f"seed {self.seed}: {rec['name']} [{split}] {rec['seconds']:.1f}s {text}")
        self.log(f"seed {self.seed}: {split} sweep: {outcome.ran} trials ran, {outcome.skipped} recorded earlier")
        ids = {t.id for t in trials(sweep, choose(sweep))}
        return {r["name"]: r for r in outcome.records if r["trial"] in ids}
