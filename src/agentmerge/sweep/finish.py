"""The end of a search: the best point as an ordinary merge config, merged; the baseline; test, scored once.

The protocol (docs/search.md): every trial is scored by ``evaluate``, the validation split (``zoo``,
``tasks:VAL.jsonl``); the test evaluator (``test:``) is made and called only here, after the whole budget is
recorded, once per checkpoint: the best point (by validation) and the named data-free ``baseline``. Their scores
land in ``DIR/search.json``; a rerun that finds them there for the same best trial does not score test again.

Written: ``DIR/best.yaml`` (the best point's merge config: ``agentmerge merge best.yaml --out X`` reproduces
``DIR/best`` byte for byte), ``DIR/best`` (that merge, with its merge.json), and likewise ``baseline.yaml`` and
``baseline``.

The test comparison is the difference d = best - baseline on the objective. Its ``± SE``:

- *paired over the components*: where both scores have K >= 2 other metrics (the tasks or domains the objective
  averages), ``d_k`` per metric, ``SE = sd(d_k) / sqrt(K)``;
- *from the evaluator's errors*: where the objective has a standard error for both (its own, or that of the mean
  of its components, below), ``sqrt(se_a^2 + se_b^2)`` (unpaired, so an upper bound on the paired error of two
  merges scored on the same items).

The noise check: the best-so-far gain on validation (best - the first finished trial) against the noise of a
difference of two validation scores, ``2 * sqrt(2) * SE`` (SE: the objective's standard error in the best
trial's record, or that of the mean of its components when the objective is their mean). A gain within it is
reported as a warning: the search may have fitted the validation set's noise.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from agentmerge.config.schema import config_from_dict, load_config
from agentmerge.evaluation.evaluator import Score
from agentmerge.io.guards import jsontext
from agentmerge.io.guards.safety import write_report
from agentmerge.sweep import evaluators
from agentmerge.sweep.space import baseline_merge
from agentmerge.sweep.sweep_report import best_record, objective_of
from agentmerge.sweep.sweepfile import SweepConfig, merge_data, point_setting, trial_of

SEARCH_JSON = "search.json"


def finish_search(
    cfg: SweepConfig, root: Path, records: list[dict[str, Any]], search_path: list[str], quiet: bool
) -> list[str]:
    """Write the best point's config and merge, the baseline's, and score both on test once; returns notes."""
    objective = objective_of(cfg, records)
    best = best_record(cfg, records)
    if best is None or objective is None:
        return ["no trial of the search finished: nothing to write"]
    summary = read_summary(root)
    notes = []
    summary["objective"], summary["direction"] = objective, cfg.direction
    trial = trial_of(cfg, point_setting(cfg, best["point"]), best["seed"])
    summary["best"] = _written(root, "best", merge_data(cfg, trial), best["trial"], summary.get("best"))
    summary["best"] |= {"point": best["point"], "validation": best["metrics"][objective]}
    if cfg.baseline is not None:
        label = f"{cfg.baseline.method} {jsontext.dumps(cfg.baseline.params, sort_keys=True)}"
        data = baseline_merge(cfg.baseline, cfg.base, cfg.models, cfg.merge, cfg.seeds[0])
        summary["baseline"] = _written(root, "baseline", data, label, summary.get("baseline"))
    points = {jsontext.dumps(r.get("point"), sort_keys=True) for r in records}
    budget = cfg.search.n_trials or 0
    if cfg.test is not None and len(points) >= budget:
        summary["test"] = _test(cfg, root, summary, search_path, objective)
    elif cfg.test is not None:
        notes.append(f"test not scored: {len(points)} of {budget} trials recorded (rerun to finish the search)")
    summary["early_stop"] = early_savings(records) if cfg.search.early_stop is not None else None
    summary["noise"] = noise(records, best, objective, cfg)
    if summary["noise"].get("warning"):
        notes.append(summary["noise"]["warning"])
    write_report(root / SEARCH_JSON, jsontext.dumps(summary, indent=2) + "\n", SEARCH_JSON)
    return notes


def read_summary(root: Path) -> dict[str, Any]:
    path = root / SEARCH_JSON
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def merge_yaml(data: dict[str, Any]) -> str:
    """A merge config as the text of its YAML file (the trial's thread count left out: it decides no byte)."""
    return yaml.safe_dump({k: v for k, v in data.items() if k != "threads"}, sort_keys=False)


def _written(root: Path, name: str, data: dict[str, Any], key: str, before: dict[str, Any] | None) -> dict[str, Any]:
    """``root/NAME.yaml`` and its merge ``root/NAME`` (merged again only when the config changed)."""
    from agentmerge.engine.merge import merge

    text = merge_yaml(data)
    folder = root / name
    if before is None or before.get("key") != key or not (folder / "merge.json").is_file():
        write_report(root / f"{name}.yaml", text, f"{name}.yaml")
        cfg = config_from_dict(load_config(root / f"{name}.yaml"), f"{name}.yaml")
        merge(cfg, folder, force=True, quiet=True)
    return {"key": key, "yaml": f"{name}.yaml", "folder": name}


def _test(
    cfg: SweepConfig, root: Path, summary: dict[str, Any], search_path: list[str], objective: str
) -> dict[str, Any]:
    """Score the best point and the baseline on test, once: kept in search.json for the same checkpoints."""
    assert cfg.test is not None
    before = summary.get("test") or {}
    options = {**cfg.evaluate_options, **cfg.test_options}
    keys = {"best": summary["best"]["key"], "baseline": (summary.get("baseline") or {}).get("key")}
    keys |= {"test": cfg.test, "options": {k: v for k, v in options.items() if k != "cache"}}
    if before.get("keys") == keys:
        return dict(before)
    score = evaluators.resolve_score(cfg.test, search_path, cfg.resources.cpus, options)
    scores = {"best": score(root / "best")}
    if cfg.baseline is not None:
        scores["baseline"] = score(root / "baseline")
    out: dict[str, Any] = {"keys": keys, "evaluator": cfg.test}
    out |= {k: {"metrics": s.metrics, "stderr": s.stderr} for k, s in scores.items()}
    if "baseline" in scores:
        out["difference"] = difference(scores["best"], scores["baseline"], objective)
    return out


def difference(a: Score, b: Score, objective: str) -> dict[str, Any]:
    """``a - b`` on the objective with its standard errors (module docstring); None where there is none."""
    d = a.metrics[objective] - b.metrics[objective]
    parts = sorted(k for k in a.metrics if k in b.metrics and k != objective)
    paired = None
    if len(parts) >= 2:
        ds = [a.metrics[k] - b.metrics[k] for k in parts]
        mean = sum(ds) / len(ds)
        paired = math.sqrt(sum((x - mean) ** 2 for x in ds) / (len(ds) - 1) / len(ds))
    se_a = objective_se({"metrics": a.metrics, "stderr": a.stderr}, objective)
    se_b = objective_se({"metrics": b.metrics, "stderr": b.stderr}, objective)
    errors = math.sqrt(se_a**2 + se_b**2) if se_a is not None and se_b is not None else None
    return {"value": d, "se_paired": paired, "paired_over": parts, "se_unpaired": errors}


def objective_se(record: dict[str, Any], objective: str) -> float | None:
    """The objective's standard error in a record: its own, or that of the mean of its components."""
    stderr, metrics = record.get("stderr") or {}, record["metrics"]
    if objective in stderr:
        return float(stderr[objective])
    parts = [k for k in stderr if k in metrics and k != objective]
    if not parts or not math.isclose(sum(metrics[k] for k in parts) / len(parts), metrics[objective], abs_tol=1e-9):
        return None
    return math.sqrt(sum(stderr[k] ** 2 for k in parts)) / len(parts)


def noise(records: Sequence[dict[str, Any]], best: dict[str, Any], objective: str, cfg: SweepConfig) -> dict[str, Any]:
    """The best-so-far gain on validation against the noise of a difference of two validation scores."""
    ok = [r for r in records if r.get("status") == "ok" and objective in r["metrics"] and not r.get("stopped_early")]
    sign = 1.0 if cfg.direction == "max" else -1.0
    gain = sign * (best["metrics"][objective] - ok[0]["metrics"][objective])
    se = objective_se(best, objective)
    out: dict[str, Any] = {"gain": gain, "se": se}
    if se is None:
        out["warning"] = f"the validation evaluator gives no standard error for {objective}: its noise is unknown"
    elif gain <= 2 * math.sqrt(2) * se:
        out["warning"] = (
            f"the best-so-far gain on validation ({gain:.4g}) is within the noise of its validation set "
            f"(2 x sqrt(2) x SE = {2 * math.sqrt(2) * se:.4g}): the search may have fitted that noise; use more "
            "validation prompts"
        )
    return out


def early_savings(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """How many trials stopped early and the evaluation seconds that saved, an estimate: what each stopped trial
    would have taken, the median evaluation time (``seconds - merge_seconds``) of the trials that scored every
    item (the median: a run's first trial also pays its worker's imports), less what it took. (Per item, as
    ``items_total - items`` times seconds per item, it would count a trial's fixed cost, such as loading the
    model, as if it grew with the items.)"""
    stopped = [r for r in records if r.get("stopped_early")]
    whole = [r for r in records if r.get("status") == "ok" and not r.get("stopped_early") and "items" in r]
    full = statistics.median(_eval_seconds(whole)) if whole else None
    spent = sum(_eval_seconds(stopped))
    saved = full * len(stopped) - spent if full is not None and stopped else None
    unscored = sum(int(r.get("items_total", 0)) - int(r.get("items", 0)) for r in stopped)
    return {
        "stopped": len(stopped),
        "items_unscored": unscored,
        "full_trial_eval_seconds": full,
        "stopped_trial_eval_seconds": spent / len(stopped) if stopped else None,
        "seconds_saved": saved if saved is None else max(0.0, saved),
    }


def _eval_seconds(records: Sequence[dict[str, Any]]) -> list[float]:
    """Each trial's evaluation seconds: its seconds less its merge's."""
    return [float(r.get("seconds", 0.0)) - float(r.get("merge_seconds", 0.0)) for r in records]
