"""The cost of one seed from measured unit costs (``agentmerge zoo real measure``): CPU seconds per stage.

Unit costs are CPU seconds of one process: ``e_k`` per evaluated prompt of skill k (greedy, bf16, batches of 16),
``g_k`` per GRPO step of agent k, ``m`` per merge (read, merge and write a 135M model; the sweep's trial
overhead included). With T = the lineup's trained skills (``cfg.trained``), H = held-out, n_v / n_t validation /
test prompts per skill:

    agents  = sum_k steps_k * g_k
    check   = 4 * sum_{k in T+H} n_t e_k  +  3 * sum_{k in T} n_c e_k  +  9 m        (base, agents; s = 0.5, 1.5, 2)
    tuning  = S * |grid| * (sum_{k in T} n_v e_k + m)                                 (S methods with a scale)
    test    = (M + S) * (sum_{k in T+H} n_t e_k + m)                                  (defaults and tuned rows)
    pairs   = P * sum_{pairs (a,b)} (n_t (e_a + e_b + e_H) + m)                       (P methods per pair)
    dilution = 2 * sum_{k in T} (n_t e_k + m)
    fisher  = 4 * F * sum_{k in T} e_k                                                (F texts: greedy + fwd/bwd)

The wall time on ``cores`` idle cores is the sum divided by ``cores * efficiency`` (torch's two-thread speed-up
on this machine is below 2; 0.8 is assumed, not measured).
"""

from __future__ import annotations

import itertools
from typing import Any

from agentmerge_zoo.real.config import RealConfig
from agentmerge_zoo.real.suite import HELD_OUT

MERGE_CPU_SECONDS = 8.0  # per merge trial: merge 1.6-4.4, load 2.5, digest and trial overhead (docs/real/README.md)


def seed_cost(
    cfg: RealConfig,
    measured: dict[str, Any],
    methods: int,
    scaled: int,
    merge_seconds: float = MERGE_CPU_SECONDS,
    cores: int = 2,
    efficiency: float = 0.8,
) -> dict[str, float]:
    """CPU seconds per stage of one seed, their total and the wall hours on ``cores`` idle cores."""
    e = {k: float(v["cpu_per_prompt"]) for k, v in measured["eval"].items()}
    g = {k: float(v["mean"]["cpu_seconds"]) for k, v in measured["grpo"].items()}
    plan, m, trained = cfg.bench, merge_seconds, cfg.trained
    every = [*trained, *HELD_OUT]
    one_test = sum(plan.n_test * e[k] for k in every)
    cost = {"agents": sum(cfg.recipe(k).steps * g[k] for k in trained)}
    cost["check"] = 4 * one_test + 3 * sum(cfg.n_check * e[k] for k in trained) + 9 * m
    cost["tuning"] = scaled * len(plan.grid) * (sum(plan.n_val * e[k] for k in trained) + m)
    cost["test"] = (methods + scaled) * (one_test + m)
    held = sum(e[h] for h in HELD_OUT)
    pairs = itertools.combinations(trained, 2)
    cost["pairs"] = len(plan.pair_methods) * sum(plan.n_test * (e[a] + e[b] + held) + m for a, b in pairs)
    cost["dilution"] = 2 * sum(plan.n_test * e[k] + m for k in trained)
    cost["fisher"] = 4 * plan.fisher_texts * sum(e[k] for k in trained)
    total = sum(cost.values())
    return cost | {"total": total, "wall_hours": total / (cores * efficiency) / 3600}
