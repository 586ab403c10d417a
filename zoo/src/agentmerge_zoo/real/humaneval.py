"""HumanEval pass@1 in the real zoo: a held-out measurement of the base, the agents and the merges.

No agent trains on code of HumanEval's kind (the code skill writes one-line list functions), so the score is held
out, like capitals. The library's suite does the work (``agentmerge.api.HumanEvalEvaluator``: chat prompts with a
prefilled ```` ```python```` fence, the answer cut at its stop, the program assembled with the problem's tests and
run in the sandbox, each program in its own limited process; docs/evaluate.md); this module chooses which problems
each checkpoint is scored on and keeps the verdicts.

**Consent.** The model's code runs only when ``agentmerge zoo real run`` is given
``--humaneval-allow-code-execution``; without it this module is never called and the report says HumanEval was
not run.

**Budget.** One greedy pass over the 164 problems costs about 1,700 s of one core for the 135M base, so the
problems are put in one fixed seeded order (``random.Random(order_seed)``, the same for every row and seed) and

- every merge row (each benched method at its defaults and tuned) is scored on the first ``subset`` problems;
- the base, the agents and the top ``top`` methods of the seed by the bench's own objective (the mean strict score
  over the trained skills on test; a method at its better row, defaults or tuned) on the first ``full``
  (default: all 164), which hold the subset.

So every row has the subset column, and the full column exists only where it was scored; the two are never mixed.

**Scores.** Greedy pass@1 on m problems is the mean of the per-problem verdicts x_p in {0, 1}, with the standard
error over problems sqrt(p (1 - p) / (m - 1)) (``evaluate.mean_se``). The verdicts are cached per checkpoint in
``WORK/evals/humaneval-KEY.json``, KEY a hash of the weights' sha256 and the decoding settings, one entry per
problem, so each checkpoint's problems are generated and run once whoever asks (a rerun, another seed, a tuned
row equal to its defaults); the merges are made again from their test trials for it and deleted.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agentmerge.api import dumps_json
from agentmerge_zoo.evaluate import cache_key, file_digest
from agentmerge_zoo.real.aggregate import has_scale, trained_mean
from agentmerge_zoo.real.bench import SeedInputs

Log = Callable[[str], None]
CONSENT_FLAG = "--humaneval-allow-code-execution"
PROBLEMS = 164  # HumanEval's


@dataclass(frozen=True)
class HumanEvalPlan:
    """Which problems each row is scored on, and how the answers are generated."""

    subset: int = 40  # problems of every merge row
    full: int | None = None  # problems of the base, the agents and the top rows (None: all 164)
    top: int = 3  # methods scored on the full set
    max_new_tokens: int = 384
    batch_size: int = 16
    order_seed: int = 0
    threads: int = 2

    def check(self) -> None:
        from agentmerge import ConfigError

        full = PROBLEMS if self.full is None else self.full
        if not 1 <= self.subset <= full <= PROBLEMS or self.top < 0:
            raise ConfigError(
                f"humaneval: need 1 <= subset <= full <= {PROBLEMS} problems and top >= 0 "
                f"(got subset {self.subset}, full {self.full}, top {self.top})"
            )


def problem_order(problems: Sequence[Any], seed: int) -> list[Any]:
    """The problems in the fixed seeded order every row's subset and full set are prefixes of."""
    order = list(problems)
    random.Random(seed).shuffle(order)
    return order


class Scorer:
    """Per-problem verdicts of checkpoints (pass = 1), cached by the weights' digest (module docstring)."""

    def __init__(self, plan: HumanEvalPlan, cache: Path) -> None:
        from agentmerge.api import HumanEvalEvaluator, HumanEvalSettings

        settings = HumanEvalSettings(
            max_new_tokens=plan.max_new_tokens, batch_size=plan.batch_size, dtype="auto", threads=plan.threads
        )
        self.evaluator = HumanEvalEvaluator(settings)  # the sandbox is made (and probed) here
        self.order = problem_order(self.evaluator.problems, plan.order_seed)
        self.plan, self.cache = plan, cache
        self.generated = 0  # checkpoints whose answers were generated (not all read from the cache)

    def cache_file(self, folder: Path) -> Path:
        key = cache_key(file_digest(folder), "humaneval", "greedy", "chat", self.plan.max_new_tokens)
        return self.cache / f"humaneval-{key}.json"

    def verdicts(self, folder: Path, count: int) -> list[int]:
        """Pass (1) or not (0) on each of the first ``count`` problems of the order."""
        wanted = self.order[:count]
        path = self.cache_file(folder)
        done: dict[str, Any] = json.loads(path.read_text())["problems"] if path.is_file() else {}
        missing = [p for p in wanted if p.task_id not in done]
        if missing:
            done |= self.run(folder, missing)
            self.cache.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(dumps_json({"checkpoint": str(folder), "problems": done}, indent=1) + "\n")
            tmp.replace(path)
        return [int(done[p.task_id]["passed"]) for p in wanted]

    def run(self, folder: Path, problems: Sequence[Any]) -> dict[str, dict[str, Any]]:
        """Generate the answers of ``problems`` and run each one's program in the sandbox."""
        self.generated += 1
        completions, mode = self.evaluator.generate(folder, problems)
        outcomes = self.evaluator.execute(completions, mode == "chat", problems)
        return {
            p.task_id: {"passed": o.passed, "status": o.status, "completion": c}
            for p, c, o in zip(problems, completions, outcomes, strict=True)
        }


def merge_rows(bench: dict[str, Any]) -> list[str]:
    """The report's merge rows of one seed: every benched method at its defaults, then each tuned one."""
    reports = bench["reports"]
    defaults = [m for m in bench["methods"] if m in reports]
    return [*defaults, *(f"{m}.tuned" for m in defaults if has_scale(m) and f"{m}.tuned" in reports)]


def top_rows(reports: dict[str, Any], names: Sequence[str], trained: Sequence[str], k: int) -> list[str]:
    """The ``k`` best methods by the bench's objective (trained-skill mean on test), each at its better row
    (ties: the defaults row, then the name), best first."""
    ranked = sorted(names, key=lambda n: (-trained_mean(reports[n], trained), n.endswith(".tuned"), n))
    out: list[str] = []
    for name in ranked:
        if len(out) < k and name.split(".")[0] not in {o.split(".")[0] for o in out}:
            out.append(name)
    return out


def _tuned_params(bench: dict[str, Any], name: str) -> dict[str, Any]:
    """The parameters of a merge row: none for a defaults row, the chosen output scale for a tuned one."""
    if not name.endswith(".tuned"):
        return {}
    choice = bench["tuning"].get(name.removesuffix(".tuned"), {})
    return {} if choice.get("value") is None else {choice["param"]: choice["value"]}


def score_row(scorer: Scorer, folder: Path, subset: int, full: int | None) -> dict[str, Any]:
    """One row: the subset's verdicts, and the full set's where ``full`` is given (the subset is its prefix)."""
    values = scorer.verdicts(folder, full or subset)
    return {"subset": values[:subset], "full": values if full else None}


def stage_humaneval(
    plan: HumanEvalPlan, inputs: SeedInputs, bench: dict[str, Any], folder: Path, log: Log
) -> dict[str, Any]:
    """Every row of one seed on HumanEval (``folder/humaneval.json``, kept while the seed's agents and the plan
    are the same)."""
    plan.check()
    record = folder / "humaneval.json"
    tag = {"fingerprint": inputs.fingerprint, "plan": asdict(plan) | {"threads": None}}  # threads change no verdict
    if record.is_file() and (done := json.loads(record.read_text())).get("tag") == tag:
        return dict(done["humaneval"])
    scorer = Scorer(plan, inputs.cache)
    full = plan.full or len(scorer.order)
    names = merge_rows(bench)
    top = top_rows(bench["reports"], names, inputs.trained, plan.top)
    log(f"humaneval: base and {len(inputs.agents)} agents on {full} problems, {len(names)} merges on {plan.subset}")
    rows = {"base": score_row(scorer, inputs.base, plan.subset, full)}
    rows |= {f"{k} agent": score_row(scorer, p, plan.subset, full) for k, p in inputs.agents.items()}
    failed: dict[str, str] = {}
    scratch = folder / ".humaneval-merge"
    for name in names:
        try:
            rows[name] = _merge_row(scorer, inputs, bench, name, scratch, full if name in top else None)
        except Exception as e:  # one merge's failure must not lose the other rows; the report names it
            failed[name] = f"{type(e).__name__}: {e}"
    out = {"run": True, "subset": plan.subset, "full": full, "top": top, "order_seed": plan.order_seed}
    out |= {"problems": [p.task_id for p in scorer.order[:full]], "rows": rows, "failed": failed}
    out["sandbox"] = list(scorer.evaluator.sandbox.notes)
    if not failed:  # kept; after a failure the next run tries again (what was scored is in the cache)
        tmp = record.with_name(f".{record.name}.tmp")
        tmp.write_text(dumps_json({"tag": tag, "humaneval": out}) + "\n")
        tmp.replace(record)
    return out


def _merge_row(
    scorer: Scorer, inputs: SeedInputs, bench: dict[str, Any], name: str, scratch: Path, full: int | None
) -> dict[str, Any]:
    """One merge row: the merge made again from its test trial into ``scratch``, scored, deleted."""
    from agentmerge_zoo.real.kept import merge_again

    shutil.rmtree(scratch, ignore_errors=True)
    try:
        params = _tuned_params(bench, name)
        merged = merge_again(inputs, name.split(".")[0], scratch, scorer.plan.threads, params, name)
        return score_row(scorer, merged, scorer.plan.subset, full)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


NOT_RUN = {"run": False, "why": f"not run: the model's code runs only with {CONSENT_FLAG}"}
