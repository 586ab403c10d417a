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
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agentmerge.api import dumps_json
from agentmerge_zoo.evaluate import cache_key, file_digest
from agentmerge_zoo.real.bench import SeedInputs
from agentmerge_zoo.real.rows import merge_rows, merged_row, score_rows, top_rows

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

    def merge_row(name: str) -> dict[str, Any]:
        with merged_row(inputs, bench, name, folder / ".humaneval-merge", plan.threads) as merged:
            return score_row(scorer, merged, plan.subset, full if name in top else None)

    rows |= score_rows(names, merge_row, failed)
    out = {"run": True, "subset": plan.subset, "full": full, "top": top, "order_seed": plan.order_seed}
    out |= {"problems": [p.task_id for p in scorer.order[:full]], "rows": rows, "failed": failed}
    out["sandbox"] = list(scorer.evaluator.sandbox.notes)
    if not failed:  # kept; after a failure the next run tries again (what was scored is in the cache)
        tmp = record.with_name(f".{record.name}.tmp")
        tmp.write_text(dumps_json({"tag": tag, "humaneval": out}) + "\n")
        tmp.replace(record)
    return out


NOT_RUN = {"run": False, "why": f"not run: the model's code runs only with {CONSENT_FLAG}"}
