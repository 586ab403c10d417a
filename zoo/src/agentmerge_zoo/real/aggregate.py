"""Numbers of the real zoo's report from the seeds' ``result.json``: mean ± SE, gain kept, paired differences.

With two or more seeds a cell is the mean over seeds ± the standard error over seeds; with one seed it is that
seed's score ± its standard error over prompts. ``gain kept`` of a merge on a skill is
``(merge - base) / (agent - base)`` on that skill's test prompts (its agent's gain it keeps), averaged over the
trained skills whose agent beat the base. A paired difference A - B is the mean over seeds of the per-seed
difference of the trained-skill mean ± SE over seeds, and beside it the SE that the prompts alone give that mean,
``prompt_se`` = sqrt(sum_s SE_s^2) / S with SE_s = sqrt(sum_k SE_sk^2) / K (SE_sk: the per-prompt SE of seed s's
difference on skill k): with two or three seeds the SE over seeds is itself a noisy estimate, and the prompts'
share says how much of the spread the test prompts alone explain. With one seed: the mean per-prompt difference
over the trained skills' prompts ± its SE (the same prompts under both merges). The tuned table holds each method
with an output scale at its chosen value and each method without one at its defaults (nothing to tune; the char
zoo's fair protocol does the same), so the best method is chosen among all. A method benched in fewer seeds than
the report's (a later bench adds methods seed by seed) has its row over those seeds, and is not a candidate for the
best method or baseline. The trained skills are the seeds' lineup (:func:`lineup`: each ``result.json``'s
``config.recipes``), the same in every seed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from agentmerge_zoo.benchplan import RAM_FAMILY
from agentmerge_zoo.fair import output_scale
from agentmerge_zoo.real.evaluate import mean_se
from agentmerge_zoo.real.suite import HELD_OUT, TRAINED, lineup_of


def lineup(seeds: Sequence[dict[str, Any]]) -> tuple[str, ...]:
    """The seeds' trained skills in agent order (the default lineup for no seed); a mix of lineups is an error."""
    from agentmerge import ConfigError

    found = sorted({lineup_of(s) for s in seeds})
    if len(found) > 1:
        names = "; ".join(", ".join(f) for f in found)
        raise ConfigError(f"the seeds' result.json files hold different lineups ({names}): report one at a time")
    return found[0] if found else TRAINED


def cell(per_seed: Sequence[float], prompt_se: float) -> dict[str, float]:
    mean, se = mean_se(per_seed)
    return {"mean": mean, "se": se if len(per_seed) > 1 else prompt_se, "seeds": float(len(per_seed))}


def _strict(report: dict[str, Any], skill: str) -> float:
    return float(report[skill]["strict"])


def trained_mean(report: dict[str, Any], trained: Sequence[str] = TRAINED) -> float:
    return sum(_strict(report, s) for s in trained) / len(trained)


def skill_kept(report: dict[str, Any], base: dict[str, Any], agents: dict[str, Any], skill: str) -> float:
    """``(merge - base) / (agent - base)`` on ``skill``; NaN when its agent did not beat the base or it is unscored."""
    gain = _strict(agents[skill], skill) - _strict(base, skill)
    if gain <= 0 or skill not in report:
        return math.nan
    return (_strict(report, skill) - _strict(base, skill)) / gain


def gain_kept(
    report: dict[str, Any], base: dict[str, Any], agents: dict[str, Any], trained: Sequence[str] = TRAINED
) -> float:
    shares = [skill_kept(report, base, agents, s) for s in trained]
    shares = [x for x in shares if not math.isnan(x)]
    return sum(shares) / len(shares) if shares else math.nan


def method_row(seeds: Sequence[dict[str, Any]], name: str) -> dict[str, Any] | None:
    """One merge's cells over the seeds that have it (None when none has)."""
    have = [s for s in seeds if name in s["bench"]["reports"]]
    if not have:
        return None
    reports = [s["bench"]["reports"][name] for s in have]
    trained = lineup(seeds)
    row: dict[str, Any] = {}
    for skill in (k for k in (*trained, *HELD_OUT) if k in reports[0]):
        row[skill] = cell([_strict(r, skill) for r in reports], float(reports[0][skill]["strict_se"]))
    if all(s in reports[0] for s in trained):
        row["trained_avg"] = cell([trained_mean(r, trained) for r in reports], _pooled_se(reports[0], trained))
        kept = [
            gain_kept(r, s["check"]["base"], s["check"]["agents"], trained) for r, s in zip(reports, have, strict=True)
        ]
        row["gain_kept"] = cell(kept, math.nan)
        for skill in trained:
            each = [
                skill_kept(r, s["check"]["base"], s["check"]["agents"], skill)
                for r, s in zip(reports, have, strict=True)
            ]
            row[f"{skill}_kept"] = cell([x for x in each if not math.isnan(x)] or [math.nan], math.nan)
    for skill in (h for h in HELD_OUT if h in reports[0]):
        deltas = [_strict(r, skill) - _strict(s["check"]["base"], skill) for r, s in zip(reports, have, strict=True)]
        row[f"{skill}_delta"] = cell(deltas, float(reports[0][skill]["strict_se"]))
    return row


def _pooled_se(report: dict[str, Any], trained: Sequence[str]) -> float:
    values = [v for s in trained for v in report[s]["values"]]
    return mean_se(values)[1]


def paired(
    seeds: Sequence[dict[str, Any]], a: str, b: str, skills: Sequence[str] | None = None
) -> dict[str, float] | None:
    """A - B on the trained skills, or on ``skills`` (see the module docstring); None when a seed lacks either."""
    if not all(a in s["bench"]["reports"] and b in s["bench"]["reports"] for s in seeds) or not seeds:
        return None
    pairs = [(s["bench"]["reports"][a], s["bench"]["reports"][b]) for s in seeds]
    trained = tuple(skills) if skills else lineup(seeds)
    if len(seeds) == 1:
        diffs = [d for skill in trained for d in _prompt_diffs(*pairs[0], skill)]
        mean, se = mean_se(diffs)
        return {"mean": mean, "se": se, "over": float(len(diffs))}
    mean, se = mean_se([trained_mean(ra, trained) - trained_mean(rb, trained) for ra, rb in pairs])
    prompt_se = math.sqrt(sum(_trained_diff_se(ra, rb, trained) ** 2 for ra, rb in pairs)) / len(pairs)
    return {"mean": mean, "se": se, "over": float(len(seeds)), "prompt_se": prompt_se}


def paired_verdicts(pairs: Sequence[tuple[Sequence[float], Sequence[float]]]) -> dict[str, float]:
    """A - B from each seed's (A's, B's) per-prompt verdicts on the same prompts: with one seed the mean ± SE of the
    per-prompt differences, with several the mean ± SE over seeds of the per-seed mean differences."""
    if len(pairs) == 1:
        mean, se = mean_se([x - y for x, y in zip(*pairs[0], strict=True)])
        return {"mean": mean, "se": se, "over": float(len(pairs[0][0]))}
    mean, se = mean_se([mean_se(a)[0] - mean_se(b)[0] for a, b in pairs])
    return {"mean": mean, "se": se, "over": float(len(pairs))}


def _prompt_diffs(ra: dict[str, Any], rb: dict[str, Any], skill: str) -> list[float]:
    """A - B per prompt of one skill (the same prompts under both merges)."""
    return [x - y for x, y in zip(ra[skill]["values"], rb[skill]["values"], strict=True)]


def _trained_diff_se(ra: dict[str, Any], rb: dict[str, Any], trained: Sequence[str]) -> float:
    """The prompts' SE of one seed's trained-mean difference: (1/K) sqrt(sum over skills of SE_skill^2)."""
    return math.sqrt(sum(mean_se(_prompt_diffs(ra, rb, s))[1] ** 2 for s in trained)) / len(trained)


def has_scale(method: str) -> bool:
    """Whether the bench tunes the method: it has an output scale (the fair protocol's ``output_scale``)."""
    return output_scale(method) is not None


def row_name(method: str, kind: str) -> str:
    """The report entry of a method in the ``defaults`` or ``tuned`` table: a method without an output scale has
    nothing to tune, so its defaults row stands in the tuned table too (the fair protocol's rule)."""
    return method + ".tuned" if kind == "tuned" and has_scale(method) else method


def best_method(rows: dict[str, dict[str, Any]], with_ram: bool = True) -> str | None:
    """The method with the highest trained-skill mean (RAM's family left out unless ``with_ram``)."""
    scored = [
        (r["trained_avg"]["mean"], m)
        for m, r in rows.items()
        if (with_ram or m.split(".")[0] not in RAM_FAMILY) and not math.isnan(r["trained_avg"]["mean"])
    ]
    return max(scored)[1] if scored else None


def tied_with(rows: dict[str, dict[str, Any]], best: str | None) -> list[str]:
    """The other methods whose trained-skill mean equals the best one's (the best is the last name among them)."""
    if best is None:
        return []
    top = rows[best]["trained_avg"]["mean"]
    return sorted(m for m, r in rows.items() if m != best and math.isclose(r["trained_avg"]["mean"], top))


def in_every_seed(rows: dict[str, dict[str, Any]], n_seeds: int) -> dict[str, dict[str, Any]]:
    """The rows benched in all ``n_seeds`` seeds: a best method is chosen among them only (a mean over fewer
    seeds is not comparable, and its paired difference would not exist)."""
    return {m: r for m, r in rows.items() if r["trained_avg"]["seeds"] == n_seeds}


def best_baseline(rows: dict[str, dict[str, Any]]) -> str | None:
    """The non-RAM method with the highest trained-skill mean."""
    return best_method(rows, with_ram=False)


def aggregate(seeds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The report's numbers: defaults and tuned tables, pairs, dilution, paired differences."""
    methods = sorted({m for s in seeds for m in s["bench"]["methods"]})
    tables: dict[str, dict[str, Any]] = {}
    for kind in ("defaults", "tuned"):
        found = {m: method_row(seeds, row_name(m, kind)) for m in methods}
        tables[kind] = {m: r for m, r in found.items() if r is not None and "trained_avg" in r}
    out: dict[str, Any] = {"seeds": [s["seed"] for s in seeds], "tables": tables, "differences": {}}
    for kind, rows in tables.items():
        everywhere = in_every_seed(rows, len(seeds))
        best = best_baseline(everywhere)
        top = best_method(everywhere)
        diffs: dict[str, Any] = {"best_baseline": best, "best": top, "tied": tied_with(everywhere, top)}
        for a, b in (
            *((a, best) for a in RAM_FAMILY),
            ("ram", "task_arithmetic"),
            ("ram_plus", "ram"),
            ("ram_ties", "ram"),
        ):
            if b is not None and a in everywhere and b in everywhere and a != b:
                diffs[f"{a}-{b}"] = paired(seeds, row_name(a, kind), row_name(b, kind))
        out["differences"][kind] = diffs
    names = {n for s in seeds for n in s["bench"]["reports"] if "+" in n or n.startswith("dilution.")}
    out["pairs"] = {n: method_row(seeds, n) for n in sorted(names) if "+" in n}
    out["dilution"] = {n: method_row(seeds, n) for n in sorted(names) if n.startswith("dilution.")}
    out["tuning"] = {s["seed"]: s["bench"]["tuning"] for s in seeds}
    out["kept"] = kept_rows(seeds)
    return out


def _mean_of(values: Sequence[float | None]) -> float:
    """The mean of the values that exist (None: no such element in that seed); NaN when none does."""
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else math.nan


def kept_rows(seeds: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per method, the mean over the seeds that measured it of what its default merge kept of each agent
    (``bench.kept``: the share of the agent's update, over its updated elements and per overlap region)."""
    out: dict[str, dict[str, Any]] = {}
    for method in sorted({m for s in seeds for m in s["bench"].get("kept", {})}):
        have = [s["bench"]["kept"][method] for s in seeds if method in s["bench"].get("kept", {})]
        agents = {}
        for i, skill in enumerate(lineup(seeds)):
            rows = [h["agents"][i] for h in have]
            regions = range(len(rows[0]["by_region"]))
            agents[skill] = {
                "kept": _mean_of([r["kept"] for r in rows]),
                "by_region": [_mean_of([r["by_region"][k] for r in rows]) for k in regions],
            }
        out[method] = {"agents": agents, "outside": _mean_of([h["outside"] for h in have]), "seeds": len(have)}
    return out


def row_labels(seeds: Sequence[dict[str, Any]], agg: dict[str, Any]) -> list[str]:
    """The report's rows in its order: base, agents, each default merge (best first), each tuned one."""
    out = ["base", *(f"{k} agent" for k in lineup(seeds))]
    for kind in ("defaults", "tuned"):
        found = agg["tables"][kind]
        for method in sorted(found, key=lambda m: -found[m]["trained_avg"]["mean"]):
            name = row_name(method, kind)
            out += [name] if kind == "defaults" or name != method else []
    return out
