"""Running a sweep on Ray: trials as tasks, one results line per finished trial, resumable, progress on stderr.

Ray is the scheduler (``ray.init`` on this machine by default, ``--address`` to join a cluster); this
module only submits at most ``max_concurrent`` trials, records each result as it comes back and decides
which merged folders to keep. ``DIR/results.jsonl`` is appended one whole line per finished trial and
synced to disk, so a sweep killed at any moment loses only the trials that were running; a rerun skips
every trial already recorded (finished or failed) and never evaluates it again. A trial whose worker or
node dies is run again by Ray (``resources.retries`` times), then recorded failed with Ray's reason: one
record per trial, always. On a cluster, every node is checked first (``cluster.check_nodes``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from agentmerge.errors import AgentMergeError, ConfigError, one_line
from agentmerge.evaluation.evaluator import Score
from agentmerge.io.guards import jsontext
from agentmerge.methods.registry import METHODS
from agentmerge.methods.spec import MASK_PARAMS
from agentmerge.sweep import evaluators
from agentmerge.sweep.cluster import check_address, check_nodes, check_resources, slots, where
from agentmerge.sweep.results import append_record, check_out_folder, read_records, remove_trial_folder
from agentmerge.sweep.sweepfile import SweepConfig, Trial, choose, merge_config, trials

RAY_HINT = "agentmerge sweep needs Ray: pip install 'agentmerge[sweep]'"


# --------------------------------------------------------------------------- the results file


class Results:
    """``DIR/results.jsonl``: one JSON object per finished trial, appended and synced, read back on resume."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def records(self) -> list[dict[str, Any]]:
        """Every complete record, each field checked (``results.read_records``; a torn line from a kill skipped)."""
        return read_records(self.path)

    def append(self, record: dict[str, Any]) -> None:
        append_record(self.path, record)


# --------------------------------------------------------------------------- one trial (runs in a Ray worker)


def trial_folder(root: Path, record: dict[str, Any]) -> Path:
    """Where a trial's merged folder lies: ``trials/NAME`` for a named trial, else ``trials/ID``."""
    return root / "trials" / str(record.get("name") or record["trial"])


def run_trial(
    cfg_data: dict[str, Any], trial: Trial, folder: str, search_path: list[str], best: float | None = None
) -> dict[str, Any]:
    """Merge and evaluate one trial; always returns its record (``status`` ok or failed with the error's line).

    ``best``: the best objective recorded when the trial started, for a search's ``early_stop``.
    """
    from agentmerge.engine.merge import merge
    from agentmerge.sweep.sweepfile import SweepConfig

    cfg = SweepConfig.model_validate(cfg_data)
    s = trial.setting
    record = trial_record(cfg, trial)
    out = Path(folder)
    t0 = time.perf_counter()
    try:
        merge(merge_config(cfg, trial), out, force=True, quiet=True)
        record["merge_seconds"] = round(time.perf_counter() - t0, 3)
        score = _score(cfg, trial, out, search_path, best, record)
        record["metrics"] = score.metrics
        if s.point is not None and score.stderr:  # a search's noise check reads the objective's error
            record["stderr"] = score.stderr
        if cfg.kept:
            record["kept"] = kept_shares(cfg, trial, out)
        record["status"] = "ok"
    except Exception as e:  # a failing trial is recorded, and the sweep goes on
        record["status"] = "failed"
        record["error"] = _first_line(e)
    record["seconds"] = round(time.perf_counter() - t0, 3)
    if cfg.keep == "none" or record["status"] != "ok":
        remove_trial_folder(out)  # only the merge output this trial wrote, never a folder that was there
    return record


def _score(
    cfg: SweepConfig, trial: Trial, out: Path, search_path: list[str], best: float | None, record: dict[str, Any]
) -> Score:
    """The trial's score; with ``early_stop``, its first items first (``score_early``): a trial worse than
    ``best`` by more than the margin there is recorded with ``stopped_early`` and their metrics."""
    options = cfg.options_of(trial.setting)
    rule, objective = cfg.search.early_stop, cfg.objective or evaluators.default_objective(cfg.evaluate)
    if rule is None or objective is None:
        return evaluators.resolve_score(cfg.evaluate, search_path, cfg.resources.cpus, options)(out)
    sign = 1.0 if cfg.direction == "max" else -1.0

    def stop(prefix: Score) -> bool:  # nothing to beat yet (the first trials): every item
        value = prefix.metrics.get(objective)
        return best is not None and value is not None and sign * (value - best) < -rule.margin

    early = evaluators.resolve_early(cfg.evaluate, search_path, cfg.resources.cpus, options)(out, rule.first, stop)
    record |= {"items": early.items, "items_total": early.total}
    record |= {"stopped_early": True, "best_at_start": best} if early.stopped else {}
    return early.score


def kept_shares(cfg: SweepConfig, trial: Trial, out: Path) -> list[float | None]:
    """For each model the trial merged, in order, the share of its update the merge in ``out`` kept (None: the
    model updated nothing); ``engine.retention`` with the default update rule."""
    from agentmerge.engine.retention import retention

    models = [cfg.models[i] for i in trial.setting.models]
    (kept,) = retention(str(cfg.base), models, [str(out)], threads=cfg.resources.cpus, quiet=True)
    return [a.kept if math.isfinite(a.kept) else None for a in kept.agents]


def trial_record(cfg: SweepConfig, trial: Trial) -> dict[str, Any]:
    """The fields every record of ``trial`` starts with (what it merged, how), before its outcome."""
    s = trial.setting
    return {
        "trial": trial.id,
        **({"name": s.name} if s.name else {}),
        "method": s.method,
        "params": dict(s.params),
        "models": [cfg.models[i] for i in s.models],
        "seed": trial.seed,
        **({"point": dict(s.point)} if s.point is not None else {}),
        "metrics": {},
    }


def remote_trial(
    cfg_data: dict[str, Any], trial: Trial, folder: str, search_path: list[str], best: float | None = None
) -> dict[str, Any]:
    """:func:`run_trial` as a Ray task: its record also names the ``node`` (id, ``node_ip``) it ran on."""
    return {**run_trial(cfg_data, trial, folder, search_path, best), **where()}


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    if isinstance(e, AgentMergeError) and text:
        return text[0]
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__ + " " + traceback.format_exc(limit=1)


# --------------------------------------------------------------------------- the sweep


@dataclass
class Outcome:
    """What a sweep run did: the records (all of them, earlier runs' too), what ran now, and the best trial."""

    records: list[dict[str, Any]]
    ran: int
    skipped: int
    failed: int
    seconds: float
    best: dict[str, Any] | None = None
    objective: str | None = None
    notes: list[str] = field(default_factory=list)
    finished: list[dict[str, Any]] = field(default_factory=list)  # the records of the trials this run ran


def run_sweep(
    cfg: SweepConfig,
    out: str | Path,
    *,
    source: str | Path | None = None,
    address: str | None = None,
    max_concurrent: int | None = None,
    resume: bool = True,
    quiet: bool = False,
    session: RaySession | None = None,
) -> Outcome:
    """Run every trial of ``cfg`` not yet in ``out/results.jsonl``, on Ray; then write ``out/results.md``.

    ``session``: a :class:`RaySession` shared with other sweeps (its ``address`` is used, not ``address``).
    """
    from agentmerge.sweep.sweep_report import best_record, objective_of, write_report

    t0 = time.perf_counter()
    root = Path(out).absolute()  # trial folders are shipped to workers, whose working folder is not ours
    check_out_folder(root)
    root.mkdir(parents=True, exist_ok=True)
    results = Results(root / "results.jsonl")
    if not resume and results.path.exists():
        results.path.rename(root / f"results.{time.strftime('%Y%m%d-%H%M%S')}.jsonl")
    done = {r["trial"] for r in results.records()}
    search_path = [str(Path(source).resolve().parent)] if source else []
    search_path.append(os.getcwd())
    cluster = (session.address if session is not None else address) is not None
    evaluators.check_before_trials(cfg.evaluate, search_path, cluster)
    if session is None and address is not None:
        check_address(address)  # before the statistics are counted: a wrong address answers at once
    objective = objective_of(cfg, results.records())
    runner = _Runner(cfg, root, results, search_path, objective, quiet)
    _count_overlaps_once(cfg, done, quiet)
    expected = _expected(cfg, done)
    with contextlib.ExitStack() as stack:
        if session is None:
            session = stack.enter_context(RaySession(address, quiet))
        ran, notes = 0, []
        if expected:  # nothing to run: Ray is not started
            session.start()
            check_resources(cfg.resources)  # a request no node holds would wait forever
            if session.address is not None:  # a cluster: every node that can take a trial must read the inputs
                notes = _say(check_nodes(cfg, root, search_path), quiet)
            ran = runner.run(_pending(cfg, done, runner), max_concurrent or slots(cfg.resources), expected)
    records = results.records()
    if cfg.space is not None:
        from agentmerge.sweep.finish import finish_search
        from agentmerge.sweep.search_report import write_search_report

        notes += _say(finish_search(cfg, root, records, search_path, quiet), quiet)
        write_search_report(cfg, records, root)
    else:
        write_report(cfg, records, root)
    failed = sum(r.get("status") != "ok" for r in records if r["trial"] in runner.ran)
    best = best_record(cfg, records)
    seconds = time.perf_counter() - t0
    return Outcome(records, ran, len(done), failed, seconds, best, objective_of(cfg, records), notes, runner.finished)


def _say(notes: list[str], quiet: bool) -> list[str]:
    for note in notes if not quiet else []:
        print(f"agentmerge sweep: note: {note}", file=sys.stderr)
    return notes


def _pending(cfg: SweepConfig, done: set[str], runner: _Runner) -> Iterator[Trial]:
    """The trials still to run: the grid or random sample in order, or optuna's suggestions as results come."""
    if cfg.search.kind == "optuna" or cfg.space is not None:
        from agentmerge.sweep.tune import optuna_trials

        yield from optuna_trials(cfg, done, runner.results.records(), runner.finished)
        return
    for trial in trials(cfg, choose(cfg)):
        if trial.id not in done:
            yield trial


def _count_overlaps_once(cfg: SweepConfig, done: set[str], quiet: bool) -> None:
    """Count the statistics each input set of the pending trials shares, once, before the trials start.

    The overlap histograms of RAM+ trials and the adaptive mask thresholds of any trial with ``epsilon_rule``
    percentile / valley land in the cache (``caches.OverlapCache``, ``caches.LevelsCache``), so every such
    trial reads them instead of its inputs, even when many start at once.
    A set whose inputs fail to open is left to its trials, which record the error.
    """
    from agentmerge.engine.merge import count_overlaps

    if cfg.search.kind == "optuna" or cfg.space is not None:
        return
    seen: set[str] = set()
    for trial in trials(cfg, choose(cfg)):
        if trial.id in done:
            continue
        merge_cfg = merge_config(cfg, trial)
        hists = METHODS[trial.setting.method].caches_statistics
        tables = [merge_cfg.params, *(o.params for o in merge_cfg.overrides)]
        if not (hists or any(t.get("epsilon_rule", "fixed") != "fixed" for t in tables)):
            continue
        rule = {k: v for k, v in merge_cfg.params.items() if k == "epsilon" or k in {p.name for p in MASK_PARAMS}}
        overrides = [o.model_dump() for o in merge_cfg.overrides]
        inputs = [merge_cfg.base, [m.path for m in merge_cfg.models]]
        key = jsontext.dumps([*inputs, rule, overrides, merge_cfg.seed, hists], sort_keys=True)
        if key not in seen:
            seen.add(key)
            with contextlib.suppress(AgentMergeError, OSError):
                count_overlaps(merge_cfg.model_copy(update={"threads": None}), quiet=quiet)


def _expected(cfg: SweepConfig, done: set[str]) -> int:
    """How many trials this run will start (for optuna: at most that many)."""
    if cfg.space is not None:
        return max(0, (cfg.search.n_trials or 0) - len(done) // len(cfg.seeds)) * len(cfg.seeds)
    if cfg.search.kind == "optuna":
        return (cfg.search.n_trials or len(choose(cfg))) * len(cfg.seeds)
    return sum(t.id not in done for t in trials(cfg, choose(cfg)))


class RaySession:
    """``ray.init`` (local unless an address is given) on first need; ``shutdown`` at the end if this one started it.

    Entering the session starts nothing: :meth:`start` does, the first time a sweep has a trial to run, so a
    rerun with nothing left to do never starts Ray. Sweeps given the same session (``run_sweep(session=...)``)
    share its workers, each of which imports torch once. ``num_cpus``: the logical CPUs of a local runtime
    (default this machine's), against which the trials' ``resources.cpus`` are scheduled. A local runtime's
    workers run at the driver's niceness (Ray's default is 15 above it, which starves the trials beside any other
    work: ``nice -n 10 agentmerge sweep`` would give them 19).
    """

    def __init__(self, address: str | None = None, quiet: bool = False, num_cpus: int | None = None) -> None:
        self.address, self.quiet, self.num_cpus = address, quiet, num_cpus
        self.started = False

    def start(self) -> None:
        try:
            import ray
        except ImportError:
            raise ConfigError(RAY_HINT) from None
        if not ray.is_initialized():
            level = logging.ERROR if self.quiet else logging.WARNING
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": level}
            if self.address is None:  # workers at the driver's niceness: Ray's default adds 15 (a starved trial)
                kwargs |= {"num_cpus": self.num_cpus or os.cpu_count() or 1, "_system_config": {"worker_niceness": 0}}
            else:
                check_address(self.address)  # bounded: Ray retries a closed address for minutes
            try:
                ray.init(address=self.address, **kwargs)
            except Exception as e:  # Ray's own ConnectionError, ValueError, RuntimeError: one line
                with contextlib.suppress(Exception):
                    ray.shutdown()
                where = f"--address {self.address!r}" if self.address is not None else "a local Ray runtime"
                raise ConfigError(f"{where}: Ray could not start or join it ({one_line(e)})") from None
            self.started = True

    def __enter__(self) -> RaySession:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.started:
            import ray

            ray.shutdown()
            self.started = False


class _Runner:
    """Submits trials to Ray with a bounded window and records each result as it arrives."""

    def __init__(
        self,
        cfg: SweepConfig,
        root: Path,
        results: Results,
        search_path: list[str],
        objective: str | None,
        quiet: bool,
    ) -> None:
        self.cfg, self.root, self.results, self.search_path = cfg, root, results, search_path
        self.objective, self.quiet = objective, quiet
        self.ran: set[str] = set()
        self.finished: list[dict[str, Any]] = []  # this run's records, in arrival order (optuna reads them)
        self._best: tuple[float, Path] | None = None  # the kept folder (keep: best), an earlier run's included
        self._earlier = results.records() if cfg.search.early_stop is not None else []
        for record in results.records() if cfg.keep == "best" else []:
            if record.get("status") == "ok" and trial_folder(root, record).is_dir():
                self._keep_best(record)

    def run(self, pending: Iterator[Trial], window: int, expected: int) -> int:
        """Run the trials ``pending`` yields, ``window`` at a time; progress against ``expected`` on stderr."""
        import ray

        res = self.cfg.resources
        task = ray.remote(num_cpus=res.cpus, num_gpus=res.gpus, max_retries=res.retries)(remote_trial)
        data = self.cfg.model_dump(mode="json")
        in_flight: dict[Any, tuple[Trial, float]] = {}
        exhausted = False
        with tqdm(total=expected, desc="sweep", unit="trial", disable=self.quiet, file=sys.stderr) as bar:
            while True:
                while not exhausted and len(in_flight) < window:
                    trial = next(pending, None)
                    if trial is None:
                        exhausted = True
                        break
                    folder = str(trial_folder(self.root, {"trial": trial.id, "name": trial.setting.name}))
                    ref = task.remote(data, trial, folder, self.search_path, self._best_value())
                    in_flight[ref] = (trial, time.perf_counter())
                if not in_flight:
                    return len(self.ran)
                ready, _ = ray.wait(list(in_flight), num_returns=1)
                self._record(self._outcome(ready[0], *in_flight.pop(ready[0])))
                failed = sum(r["status"] != "ok" for r in self.finished)
                bar.set_postfix(running=len(in_flight), failed=failed, refresh=False)
                bar.update(1)

    def _best_value(self) -> float | None:
        """The best objective recorded so far (an earlier run's too; never a stopped trial's), for
        ``early_stop``; None without it."""
        from agentmerge.sweep.sweep_report import best_record

        if self.cfg.search.early_stop is None or self.objective is None:
            return None
        best = best_record(self.cfg, [*self._earlier, *self.finished])
        return None if best is None else float(best["metrics"][self.objective])

    def _outcome(self, ref: Any, trial: Trial, started: float) -> dict[str, Any]:
        """The trial's record; when Ray could not finish it (its worker or node died, after the retries),
        a failed record with Ray's reason: a trial is never lost and never recorded twice."""
        import ray

        try:
            record: dict[str, Any] = ray.get(ref)
        except ray.exceptions.RayError as e:
            record = trial_record(self.cfg, trial)
            record["status"] = "failed"
            record["error"] = f"{_first_line(e)} (resources.retries = {self.cfg.resources.retries})"
            record["seconds"] = round(time.perf_counter() - started, 3)
        return record

    def _record(self, record: dict[str, Any]) -> None:
        self.results.append(record)
        self.ran.add(record["trial"])
        self.finished.append(record)
        if self.cfg.keep == "best" and record["status"] == "ok":
            self._keep_best(record)

    def _keep_best(self, record: dict[str, Any]) -> None:
        """Keep the folder of the best trial so far (this run), remove the others'."""
        from agentmerge.sweep.sweep_report import score

        value = None if record.get("stopped_early") else score(self.cfg, record, self.objective)
        folder = trial_folder(self.root, record)
        if value is None:
            remove_trial_folder(folder)
        elif self._best is None or value > self._best[0]:
            if self._best is not None and self._best[1] != folder:  # a named trial may reuse an old best's folder
                remove_trial_folder(self._best[1])
            self._best = (value, folder)
        elif folder != self._best[1]:
            remove_trial_folder(folder)
