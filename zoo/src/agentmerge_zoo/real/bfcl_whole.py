"""BFCL's whole test in the BFCL zoo: the base, the BFCL agent and the leading merges on ``n / 4`` items of each
non-live category (400: 100 each, the issue's floor), after the bench scored every merge on its smaller test.

BFCL prompts are long (function docs and demonstrations: 500-1,000 tokens), so a BFCL test prompt costs several
times a code or memory one and the whole test cannot be run for every row of a seed. The bench scores every row on
``BenchPlan.n_test`` prompts per skill (16 per BFCL category at 64); this stage scores

- the base and the BFCL agent,
- the ``top`` best methods by the bench's objective (the mean strict score over the trained skills on test), each
  at its better row (``rows.top_rows``),
- RAM and RAM+ at their better rows, when ``ram`` (the paper's methods, whatever their rank),

on the whole test (``BfclSkill.fixed_set`` with ``n``: a fixed seeded subset of each category, in file order, the
same for every row and seed). The merges are made again from their test trials and deleted; every report is
cached by the weights' digest (``evaluate_cached``), so a rerun scores nothing twice. A row is a seed's BFCL
report (strict, its SE, partial credit, the per-prompt verdicts in category order); the report's "BFCL whole
test" section (``report_bfcl.whole_numbers``) turns the rows into per-category cells and paired differences.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agentmerge.api import dumps_json
from agentmerge_zoo.real.bench import SeedInputs
from agentmerge_zoo.real.evaluate import evaluate_cached
from agentmerge_zoo.real.rows import merge_rows, merged_row, score_rows, top_rows
from agentmerge_zoo.real.skill_bfcl import TEST_CATEGORIES

Log = Callable[[str], None]
RAM_ROWS = ("ram", "ram_plus")
RECORD = "bfcl-whole.json"


@dataclass(frozen=True)
class WholePlan:
    """Which rows get BFCL's whole test, and its size."""

    n: int = 400  # test prompts, n / 4 per category
    top: int = 3  # methods by the bench's objective
    ram: bool = True  # RAM and RAM+ as well
    threads: int = 2

    def check(self) -> None:
        from agentmerge import ConfigError

        k = len(TEST_CATEGORIES)
        if self.n < k or self.n % k or self.top < 0:
            raise ConfigError(f"bfcl whole test: n must be a positive multiple of {k} and top >= 0 (got {self})")


def whole_rows(bench: dict[str, Any], trained: tuple[str, ...], plan: WholePlan) -> tuple[list[str], list[str]]:
    """The merge rows scored on the whole test: the top methods, and RAM and RAM+ (each at its better row) where
    the bench has them and they are not among the top."""
    names = merge_rows(bench)
    top = top_rows(bench["reports"], names, trained, plan.top)
    extra: list[str] = []
    for method in RAM_ROWS if plan.ram else ():
        if method not in {r.split(".")[0] for r in top}:
            extra += top_rows(bench["reports"], [n for n in names if n.split(".")[0] == method], trained, 1)
    return top, extra


def stage_bfcl_whole(
    plan: WholePlan, inputs: SeedInputs, bench: dict[str, Any], folder: Path, log: Log
) -> dict[str, Any]:
    """The whole-test rows of one seed (``folder/bfcl-whole.json``, kept while the seed's agents and the plan are
    the same)."""
    plan.check()
    record = folder / RECORD
    tag = {"fingerprint": inputs.fingerprint, "plan": asdict(plan) | {"threads": None}}  # threads change no verdict
    if record.is_file() and (done := json.loads(record.read_text())).get("tag") == tag:
        return dict(done["whole"])
    top, extra = whole_rows(bench, inputs.trained, plan)
    merges = [*top, *extra]
    log(f"bfcl whole test: base, the bfcl agent and {len(merges)} merges ({', '.join(merges)}) on {plan.n} prompts")

    def score(path: Path) -> dict[str, Any]:
        return dict(evaluate_cached(path, ["bfcl"], "test", plan.n, inputs.cache)["bfcl"])

    def merge_row(name: str) -> dict[str, Any]:
        with merged_row(inputs, bench, name, folder / ".bfcl-whole-merge", plan.threads) as merged:
            return score(merged)

    rows = {"base": score(inputs.base), "bfcl agent": score(inputs.agents["bfcl"])}
    failed: dict[str, str] = {}
    rows |= score_rows(merges, merge_row, failed)
    out = {"run": True, "n": plan.n, "top": top, "merges": merges, "rows": rows, "failed": failed}
    if not failed:  # kept; after a failure the next run tries again (what was scored is in the cache)
        tmp = record.with_name(f".{record.name}.tmp")
        tmp.write_text(dumps_json({"tag": tag, "whole": out}) + "\n")
        tmp.replace(record)
    return out
