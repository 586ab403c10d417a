"""What the zoo benchmark runs: the merges (method, parameters, row label), the RAM variants, the RAM+
ablation grid, the 2-agent pairs, and the plan that gathers them (seeds, tuning grids, Fisher prompts).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class MethodRun:
    """One merge to run: a row label, an engine method name and its parameters."""

    label: str
    method: str
    params: dict[str, Any] = field(default_factory=dict)
    tune: str = ""  # a parameter chosen on validation over the plan's lambda grid (as task arithmetic's lambda)
    kind: str = "main"  # "main": a row of the main table (tuned by the fair protocol); "variant": a RAM variant


METHOD_RUNS: tuple[MethodRun, ...] = (
    MethodRun("linear", "linear"),
    MethodRun("task_arithmetic", "task_arithmetic"),
    MethodRun("ties", "ties", {"density": 0.5, "scale": 1.0}),
    MethodRun("dare_linear", "dare_linear", {"p": 0.5}),
    MethodRun("dare_ties", "dare_ties", {"p": 0.5}),
    MethodRun("breadcrumbs", "breadcrumbs"),
    MethodRun("della", "della"),
    MethodRun("model_stock", "model_stock"),
    MethodRun("fisher", "fisher"),
    MethodRun("ram_ties", "ram_ties"),
    MethodRun("ram", "ram"),
    MethodRun("ram_plus", "ram_plus", {"r": 0.1, "alpha": 2.0}),
    # the field's newer methods that merge any number of models; one not in the registry when the bench runs is
    # skipped with a note
    *(MethodRun(name, name) for name in ("magmax", "consensus", "sce", "karcher", "multislerp")),
    *(MethodRun(name, name) for name in ("tsv", "iso_c", "iso_cts", "cart", "resmerge")),
)
# The RAM variants of docs/methods.md ("RAM variants"), opt-in with ``zoo bench --variants``; labels start with
# ``v_`` and count as RAM-family rows (never as the best baseline). RAM+ settings are the paper's (r 0.1, alpha 2).
VARIANT_RUNS: tuple[MethodRun, ...] = (
    MethodRun("v_ram_grid_bf16", "ram", {"mask_dtype": "bfloat16"}, kind="variant"),
    MethodRun("v_ram_plus_grid_bf16", "ram_plus", {"r": 0.1, "alpha": 2.0, "mask_dtype": "bfloat16"}, kind="variant"),
    MethodRun("v_ram_valley", "ram", {"epsilon_rule": "valley"}, kind="variant"),
    MethodRun("v_ram_elect", "ram", {"shared": "elect"}, kind="variant"),
    MethodRun("v_ram_plus_layer", "ram_plus", {"r": 0.1, "alpha": 2.0, "scope": "layer"}, kind="variant"),
    MethodRun("v_ram_plus_module", "ram_plus", {"r": 0.1, "alpha": 2.0, "scope": "module"}, kind="variant"),
    MethodRun("v_ram_fisher", "ram_fisher", kind="variant"),
    MethodRun("v_ram_fisher_r0.1", "ram_fisher", {"r": 0.1, "alpha": 2.0}, kind="variant"),
    MethodRun(
        "v_ram_scaled", "ram", tune="scale", kind="variant"
    ),  # theta_0 + s * RAM's delta, s chosen like TA's lambda
)
# RAM and the methods built on it: never the best baseline ("ram_fisher" is a main row of the real bench)
RAM_FAMILY = ("ram", "ram_plus", "ram_ties", "ram_fisher")
FISHER_METHODS = frozenset({"fisher", "ram_fisher"})  # merges that take the agents' Fisher files
PAIRS: tuple[tuple[str, str], ...] = (("code", "tool"), ("code", "memory"), ("tool", "memory"))
PAIR_METHODS = ("linear", "task_arithmetic", "ties", "dare_ties", "ram", "ram_plus")
ABLATION_R: tuple[float, ...] = (0.0, 0.05, 0.1, 0.2, 0.5)
ABLATION_ALPHA: tuple[float, ...] = (1.0, 2.0)
DILUTION_TAGS = ("s1", "s1_over_n")  # the unique updates at s = 1 and s = 1/N


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
    # the one output-scale grid: every output scale's under the fair protocol, task arithmetic's alone without it
    scales: tuple[float, ...] = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0)
    # the grid of tuned runs (``MethodRun.tune``): TA's, and beyond it (RAM's scale chose 3, TA's top, every time)
    tune_grid: tuple[float, ...] = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)
    fisher_prompts: int = 64
    methods: tuple[MethodRun, ...] = METHOD_RUNS
    ablation: tuple[MethodRun, ...] = ()  # extra 3-agent merges (the RAM+ ablation in the paper-like regime)
    pairs: bool = False  # also the three 2-agent merges (the paper's second table)
    pair_methods: tuple[str, ...] = PAIR_METHODS  # labels of ``methods`` run on the pairs
    fair: bool = False  # defaults and tuned rows for every main-table method with an output scale (``fair.py``)
    check: bool = False  # the convergence check of every agent (``converge.py``) as a stage of each seed
    check_n: int = 3000  # validation prompts per task of the check (``converge.CHECK_N``)


def available_methods() -> set[str]:
    """Engine methods registered right now (the zoo depends on agentmerge: the registry is always there)."""
    from agentmerge import METHODS

    return set(METHODS)
