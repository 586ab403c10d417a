"""Aggregate per-seed bench records into docs/results.json and docs/results.md.

Every number is a mean over seeds ± its standard error (sample std / sqrt(seeds)). Besides the paper-style
table the report gives each specialist's gain over the base on its own domain, how much of that gain each merge
retains, the probe's density and overlap against independent masks, and the dilution ablation.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentmerge.api import dumps_json
from agentmerge_zoo.benchplan import RAM_FAMILY
from agentmerge_zoo.config import DOMAINS
from agentmerge_zoo.evaluate import mean_and_se
from agentmerge_zoo.fair import TUNED, chosen_scale, defaults_view, has_tuned, is_tuned, tuned_view
from agentmerge_zoo.tasks import metric_columns, metric_domain

Stat = dict[str, Any]
SPECIALISTS = tuple(f"agent_{d}" for d in DOMAINS)


def stat(values: Sequence[float]) -> Stat:
    """{"mean", "se", "values"} over seeds."""
    mean, se = mean_and_se(list(values))
    return {"mean": mean, "se": se, "values": list(values)}


def domain_score(metrics: dict[str, float], domain: str) -> float:
    """Mean of a domain's metrics in one evaluation."""
    values = [v for k, v in metrics.items() if metric_domain(k) == domain]
    return sum(values) / len(values) if values else math.nan


def agentic(metrics: dict[str, float]) -> float:
    """Average over the trained domains' metric columns (held-out excluded)."""
    values = [v for k, v in metrics.items() if metric_domain(k) in DOMAINS]
    return sum(values) / len(values)


def row_labels(records: Sequence[dict[str, Any]]) -> list[str]:
    """Rows present in every seed, in table order (base, specialists, merges)."""
    first = list(records[0]["rows"])
    return [label for label in first if all(label in r["rows"] for r in records)]


ABLATION_PREFIX = "ram_plus_"  # RAM+ ablation rows (ram_plus_r0.1_a2, ram_plus_authors_R1.2)


def is_ablation(label: str) -> bool:
    return label.startswith(ABLATION_PREFIX)


VARIANT_PREFIX = (
    "v_"  # RAM variants (zoo bench --variants): RAM-family rows, compared with RAM, RAM+ and the best baseline
)


def is_variant(label: str) -> bool:
    return label.startswith(VARIANT_PREFIX)


def is_baseline(label: str) -> bool:
    """A merge row that may be the best baseline: not RAM, RAM+, RAM-TIES, RAM-Fisher or a RAM variant."""
    return label not in RAM_FAMILY and not is_variant(label)


def is_merge(label: str) -> bool:
    return label != "base" and not label.startswith("agent_")


def aggregate(records: Sequence[dict[str, Any]], meta: dict[str, Any]) -> dict[str, Any]:
    """The content of results.json (one regime). A fair bench's records (``fair.py``) also give the tuned
    table's paired differences, pairs and regime-map point (``*_tuned``) and the tuned values (``tuned_choice``)."""
    labels = row_labels(records)
    defaults, tuned = defaults_view(records), tuned_view(records)
    main = row_labels(defaults)
    out = {
        **meta,
        "seeds": [r["seed"] for r in records],
        "columns": [*metric_columns(), "agentic_avg"],
        "rows": {label: _cells(records, label) for label in labels},
        "gains": _gains(records),
        "retention": {label: _retention(records, label) for label in labels},
        "probe": _probe(records),
        "dilution": _dilution(records),
        "task_arithmetic_scale": [r["val"].get("task_arithmetic", {}) for r in records],
        "skipped": _skipped(records),
        "comparisons": _comparisons(defaults, main),
        "ablation": _ablation(records, labels),
        "variants": _variants(tuned, main),
        "pairs": _pairs(defaults),
        "map": regime_point(defaults, main),
        "timing": [{"seed": r["seed"], **r["timing"]} for r in records],
    }
    if has_tuned(records):
        out["comparisons_tuned"] = _comparisons(tuned, main)
        out["pairs_tuned"] = _pairs(tuned)
        out["map_tuned"] = regime_point(tuned, main)
        out["tuned_choice"] = _choices(records, labels)
    if all("convergence" in r for r in records):
        from agentmerge_zoo.converge_report import aggregate_checks

        out["convergence"] = aggregate_checks(records)
    return out


def _cells(records: Sequence[dict[str, Any]], label: str) -> dict[str, Stat]:
    per_seed = [r["rows"][label] for r in records]
    cells = {m: stat([p[m] for p in per_seed]) for m in metric_columns()}
    cells["agentic_avg"] = stat([agentic(p) for p in per_seed])
    return cells


def _choices(records: Sequence[dict[str, Any]], labels: Sequence[str]) -> dict[str, Any]:
    """Per tuned row: the parameter and the value chosen on validation in each seed."""
    out: dict[str, Any] = {}
    for label in [x.removesuffix(TUNED) for x in labels if is_tuned(x)]:
        chosen = [r["val"].get(label, {}) for r in records]
        out[label] = {"param": chosen[0].get("param"), "values": [c.get("best") for c in chosen]}
    return out


def _ablation(records: Sequence[dict[str, Any]], labels: Sequence[str]) -> dict[str, Any]:
    """RAM+ ablation rows: agentic average and own-domain scores, paired against RAM."""
    out: dict[str, Any] = {}
    for label in labels:
        if not is_ablation(label) or "ram" not in labels:
            continue
        out[label] = {
            "agentic_avg": stat([agentic(r["rows"][label]) for r in records]),
            "minus_ram": stat([agentic(r["rows"][label]) - agentic(r["rows"]["ram"]) for r in records]),
            **{d: stat([domain_score(r["rows"][label], d) for r in records]) for d in DOMAINS},
        }
    return out


def _variants(records: Sequence[dict[str, Any]], labels: Sequence[str]) -> dict[str, Any]:
    """RAM variant rows: agentic average, paired against RAM, RAM+ and the best baseline, and per domain."""
    merges = [x for x in labels if is_merge(x) and not is_ablation(x)]
    best = _best(records, [x for x in merges if is_baseline(x)])
    refs = [x for x in ("ram", "ram_plus", best) if x is not None and x in labels]
    out: dict[str, Any] = {}
    for label in [x for x in labels if is_variant(x)]:
        score = [agentic(r["rows"][label]) for r in records]
        out[label] = {
            "agentic_avg": stat(score),
            "minus": {
                ref: stat([s - agentic(r["rows"][ref]) for s, r in zip(score, records, strict=True)]) for ref in refs
            },
            "best_baseline": best,
            "chosen": [r["val"].get(label, {}).get("best") for r in records],  # tuned on validation, per seed
            **{d: stat([domain_score(r["rows"][label], d) for r in records]) for d in DOMAINS},
        }
    return out


def _pairs(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The 2-agent merges: per pair, each row's score on each of the pair's domains and their mean."""
    names = [p for p in records[0].get("pairs", {}) if all(p in r.get("pairs", {}) for r in records)]
    out: dict[str, Any] = {}
    for pair in names:
        domains = pair.split("+")
        subs = [r["pairs"][pair] for r in records]
        labels = row_labels(subs)
        rows: dict[str, Any] = {}
        for label in labels:
            cells = {d: stat([domain_score(s["rows"][label], d) for s in subs]) for d in domains}
            cells["avg"] = stat([agentic(s["rows"][label]) for s in subs])
            rows[label] = cells
        merges = [x for x in labels if is_merge(x) and x not in RAM_FAMILY]
        best = _best(subs, merges)
        diffs = {}
        for a in [x for x in RAM_FAMILY if x in labels]:
            if best:
                diffs[f"{a} - {best}"] = stat([agentic(s["rows"][a]) - agentic(s["rows"][best]) for s in subs])
        scales = [chosen_scale(s["val"].get("task_arithmetic", {})) for s in subs]
        out[pair] = {"domains": domains, "rows": rows, "best_baseline": best, "diffs": diffs, "ta_scale": scales}
    return out


def _best(records: Sequence[dict[str, Any]], labels: Sequence[str]) -> str | None:
    """The label with the highest mean agentic average over seeds (selected on the test split)."""
    if not labels:
        return None
    return max(labels, key=lambda x: sum(agentic(r["rows"][x]) for r in records) / len(records))


def regime_point(records: Sequence[dict[str, Any]], labels: Sequence[str]) -> dict[str, Any]:
    """The regime map's numbers for one regime: paired differences and the overlap excess.

    - ram − best baseline: the best non-RAM merge by mean test agentic average (a choice that favours the
      baseline); ram_plus − ram; per domain, the best merge (by agentic average) − the specialist, and the
      best merge *on that domain* − the specialist (both paired by seed).
    - overlap excess per agent: measured w.0 / independent-mask w.0 (mean over seeds); < 1 means the agents'
      masks coincide more than chance, 1 means independent.
    """
    merges = [x for x in labels if is_merge(x) and not is_ablation(x)]
    baselines = [x for x in merges if is_baseline(x)]
    best_base = _best(records, baselines)
    best_merge = _best(records, merges)
    out: dict[str, Any] = {"best_baseline": best_base, "best_merge": best_merge}
    if "ram" in labels and best_base:
        out["ram_minus_best_baseline"] = stat(
            [agentic(r["rows"]["ram"]) - agentic(r["rows"][best_base]) for r in records]
        )
    if "ram" in labels and "linear" in labels:
        out["ram_minus_linear"] = stat([agentic(r["rows"]["ram"]) - agentic(r["rows"]["linear"]) for r in records])
    if "ram_plus" in labels and best_base:
        out["ram_plus_minus_best_baseline"] = stat(
            [agentic(r["rows"]["ram_plus"]) - agentic(r["rows"][best_base]) for r in records]
        )
    if "ram_plus" in labels and "ram" in labels:
        out["ram_plus_minus_ram"] = stat([agentic(r["rows"]["ram_plus"]) - agentic(r["rows"]["ram"]) for r in records])
    specialist: dict[str, Any] = {}
    for d in DOMAINS:
        agent = f"agent_{d}"
        entry: dict[str, Any] = {}
        if best_merge:
            entry["best_merge"] = stat(
                [domain_score(r["rows"][best_merge], d) - domain_score(r["rows"][agent], d) for r in records]
            )
        if merges:
            top = max(merges, key=lambda x: sum(domain_score(r["rows"][x], d) for r in records))
            entry["best_on_domain"] = top
            entry["best_on_domain_minus_specialist"] = stat(
                [domain_score(r["rows"][top], d) - domain_score(r["rows"][agent], d) for r in records]
            )
        specialist[d] = entry
    out["merge_minus_specialist"] = specialist
    seeds = [r for r in records if "probe" in r]
    if seeds:
        excess = []
        for i, _label in enumerate(SPECIALISTS):
            measured = [r["probe"]["agents"][i]["overlap"][0] for r in seeds]
            independent = [r["probe"]["independent_overlap"][i][0] for r in seeds]
            ratios = [m / ind if ind > 0 else math.nan for m, ind in zip(measured, independent, strict=True)]
            excess.append(stat(ratios))
        out["overlap_excess"] = dict(zip(SPECIALISTS, excess, strict=True))
        finite = [e["mean"] for e in excess if math.isfinite(e["mean"])]
        out["overlap_excess_mean"] = sum(finite) / len(finite) if finite else math.nan
    return out


def _gains(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Specialist minus base on its own domain: per metric and domain mean, over seeds and per seed."""
    out: dict[str, Any] = {}
    for domain in DOMAINS:
        agent = f"agent_{domain}"
        metrics = [m for m in metric_columns() if metric_domain(m) == domain]
        entry: dict[str, Any] = {}
        for m in metrics:
            entry[m] = stat([r["rows"][agent][m] - r["rows"]["base"][m] for r in records])
        entry["domain_avg"] = stat(
            [domain_score(r["rows"][agent], domain) - domain_score(r["rows"]["base"], domain) for r in records]
        )
        out[domain] = entry
    return out


def _retention(records: Sequence[dict[str, Any]], label: str) -> dict[str, Stat]:
    """(model - base) / (specialist - base) per domain: the share of the specialist's gain that survives."""
    out: dict[str, Stat] = {}
    for domain in [*DOMAINS, "heldout"]:
        values = []
        for r in records:
            base = domain_score(r["rows"]["base"], domain)
            model = domain_score(r["rows"][label], domain)
            if domain == "heldout":
                values.append(model - base)
                continue
            gain = domain_score(r["rows"][f"agent_{domain}"], domain) - base
            values.append((model - base) / gain if abs(gain) > 1e-9 else math.nan)
        out[domain] = stat(values)
    return out


def _probe(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    seeds = [r for r in records if "probe" in r]
    if not seeds:
        return {}
    agents: dict[str, Any] = {}
    for i, label in enumerate(SPECIALISTS):
        rows = [r["probe"]["agents"][i] for r in seeds]
        width = len(rows[0]["overlap"])
        agents[label] = {
            "density": stat([row["density"] for row in rows]),
            "overlap": [stat([row["overlap"][k] for row in rows]) for k in range(width)],
            "independent": [stat([r["probe"]["independent_overlap"][i][k] for r in seeds]) for k in range(width)],
            "rho": stat([_num(row["rho"]) for row in rows]),
            "lam": stat([row["lam"] for row in rows]),
        }
        if "drift" in seeds[0]["probe"]:
            agents[label]["drift"] = stat([r["probe"]["drift"][i] for r in seeds])
    out: dict[str, Any] = {"agents": agents, "per_seed": [r["probe"] for r in seeds]}
    if "magnitude" in seeds[0]["probe"]:
        out["magnitude"] = _magnitude(seeds)
    return out


def _magnitude(seeds: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Overlap by |w0| quartile, mean ± se over seeds."""
    first = seeds[0]["probe"]["magnitude"]["quartiles"]
    out = []
    for q, row in enumerate(first):
        agents = []
        for i, a in enumerate(row["agents"]):
            cells = [r["probe"]["magnitude"]["quartiles"][q]["agents"][i] for r in seeds]
            agents.append(
                {"agent": a["agent"], **{k: stat([c[k] for c in cells]) for k in ("density", "w0", "w0_independent")}}
            )
        mean_abs = stat([r["probe"]["magnitude"]["quartiles"][q]["mean_abs_w0"] for r in seeds])
        out.append({"quartile": row["quartile"], "mean_abs_w0": mean_abs, "agents": agents})
    return out


def _num(value: Any) -> float:
    return math.inf if value == "inf" else float(value)


def _dilution(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for domain in DOMAINS:
        if not all(domain in r["dilution"] for r in records):
            continue
        entry = {
            "base": stat([domain_score(r["rows"]["base"], domain) for r in records]),
            "specialist": stat([domain_score(r["rows"][f"agent_{domain}"], domain) for r in records]),
        }
        for tag in ("s1", "s1_over_n"):
            entry[tag] = stat([domain_score(r["dilution"][domain][tag], domain) for r in records])
        out[domain] = entry
    return out


COMPARISONS = (
    ("ram", "linear"),
    ("ram", "task_arithmetic"),
    ("ram_plus", "ram"),
    ("ram_plus", "task_arithmetic"),
    ("task_arithmetic", "linear"),
    ("ties", "task_arithmetic"),
)


def _comparisons(records: Sequence[dict[str, Any]], labels: Sequence[str]) -> list[dict[str, Any]]:
    """Paired (same seed) differences of the agentic average and the held-out score between merges."""
    out = []
    for a, b in COMPARISONS:
        if a not in labels or b not in labels:
            continue
        agentic_diff = [agentic(r["rows"][a]) - agentic(r["rows"][b]) for r in records]
        held_diff = [domain_score(r["rows"][a], "heldout") - domain_score(r["rows"][b], "heldout") for r in records]
        out.append({"a": a, "b": b, "agentic_avg": stat(agentic_diff), "heldout": stat(held_diff)})
    return out


def _skipped(records: Sequence[dict[str, Any]]) -> dict[str, str]:
    notes: dict[str, str] = {}
    for r in records:
        for label, note in r["skipped"].items():
            notes.setdefault(label, note)
    return notes


def render_from_json(docs: Path) -> Path:
    """Re-render results.md from an existing results.json (no computation)."""
    from agentmerge_zoo.report_md import render_markdown

    md_path = docs / "results.md"
    md_path.write_text(render_markdown(json.loads((docs / "results.json").read_text())))
    return md_path


def write_results(results: dict[str, Any], docs: Path) -> tuple[Path, Path]:
    """Write results.json and results.md into ``docs``."""
    from agentmerge_zoo.report_md import render_markdown

    docs.mkdir(parents=True, exist_ok=True)
    json_path, md_path = docs / "results.json", docs / "results.md"
    json_path.write_text(dumps_json(jsonable(results), indent=1, sort_keys=False) + "\n")
    md_path.write_text(render_markdown(results))
    return json_path, md_path


def jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value
