"""BFCL as an evaluator: ``agentmerge eval MODEL... --suite bfcl[:CATEGORIES]``, ``evaluate: bfcl:...`` in a sweep.

Each question goes through the checkpoint's chat template in BFCL's prompt mode (``prompt``), is answered
greedily in batches (``generation.Generator``), decoded (``decode``) and checked (``checker``); ``metrics`` names
the results. ``score_outputs`` scores generations made elsewhere (``outputs``) with the same checker.

Categories: any of ``data.CATEGORIES`` and the groups ``all``, ``non_live`` (= ``test``), ``live`` (=
``validation``). A sweep's ``evaluate: bfcl`` scores ``validation`` (tune on live, never on the non-live
test); ``agentmerge eval --suite bfcl`` scores ``all`` (``--split val``: ``validation``). Options (a
sweep's ``evaluate_options``; the eval command's flags): ``n`` items per category (a fixed seeded subset),
``few_shot`` demonstrations (from live categories not scored), ``batch_size``, ``max_new_tokens``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from agentmerge.errors import ConfigError
from agentmerge.evaluation.bfcl import data, outputs, prompt
from agentmerge.evaluation.bfcl.checker import Verdict, mode_of, verdict
from agentmerge.evaluation.bfcl.metrics import as_score, category_score
from agentmerge.evaluation.evaluator import Context, Evaluator, Score, set_threads
from agentmerge.io.guards import jsontext
from agentmerge.io.guards.safety import check_report_path, write_report_with

DEFAULT_MAX_NEW_TOKENS = 256
DEFAULT_BATCH_SIZE = 8


class BfclEvaluator(Evaluator):
    """BFCL v4's single-turn AST categories in prompt mode; see the module docstring."""

    kind = "bfcl"
    usage = "bfcl[:CATEGORIES]"
    objective = "bfcl_avg"
    options: ClassVar[Mapping[str, type]] = {"n": int, "few_shot": int, "batch_size": int, "max_new_tokens": int}

    def __init__(
        self,
        categories: str = "all",
        *,
        n: int | None = None,
        few_shot: int = 0,
        batch_size: int = DEFAULT_BATCH_SIZE,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        device: str = "cpu",
        dtype: str = "auto",
        log_samples: str | Path | None = None,
        chat_template: bool = True,
        threads: int | None = None,
        quiet: bool = True,
    ) -> None:
        self.categories = data.parse_categories(categories)
        self.n, self.few_shot, self.batch_size, self.max_new_tokens = n, few_shot, batch_size, max_new_tokens
        self.device, self.dtype, self.threads, self.quiet = device, dtype, threads, quiet
        self.log_samples = Path(log_samples) if log_samples is not None else None
        self.chat_template = chat_template
        self.demos = self._demonstrations()
        whole = data.load(self.categories)  # read before any model
        self.sizes = {c: len(items) for c, items in whole.items()}  # each category's size, for "k of N items"
        self.items = {c: data.subset(items, n) for c, items in whole.items()}

    @property
    def name(self) -> str:
        return f"bfcl:{','.join(self.categories)}"

    def _demonstrations(self) -> dict[str, tuple[str, list[data.Item]]]:
        """Per scored category: the live category its demonstrations come from and the demonstrations."""
        if not self.few_shot:
            return {}
        out = {}
        for category in self.categories:
            kind = category.removeprefix("live_").replace("simple_python", "simple")
            source = prompt.demo_source(kind, self.categories)
            out[category] = (source, prompt.demonstrations(data.load_category(source), self.few_shot))
        return out

    def score(self, checkpoint: Path) -> Score:
        from agentmerge.evaluation.generation import Generator

        set_threads(self.threads)
        items = [it for c in self.categories for it in self.items[c]]
        gen = Generator.load(str(checkpoint), self.device, self.dtype, chat=self.chat_template)
        texts = [self._text(gen, it, checkpoint) for it in items]
        answers = gen.complete_texts(
            texts, self.max_new_tokens, self.batch_size, f"bfcl {Path(checkpoint).name}", self.quiet
        )
        return self._scored(str(checkpoint), items, texts, answers, self.sizes)

    def _text(self, gen: Any, item: data.Item, checkpoint: Path) -> str:
        """The question as the model reads it; a chat template that refuses the conversation: one line."""
        from jinja2 import TemplateError

        try:
            return str(gen.chat_text(prompt.chat(item, self.demos.get(item.category, ("", []))[1])))
        except TemplateError as e:
            raise ConfigError(
                f"{checkpoint}: its chat template refuses BFCL question {item.id} ({' '.join(str(e).split())[:200]}); "
                "leave out its category or pass --no-chat-template"
            ) from None

    def score_outputs(self, file: Path) -> Score:
        """Score generations made elsewhere (``outputs``): the ids' categories, no model."""
        given = outputs.read_outputs(file)
        by_category = outputs.matched(file, given, self.categories)
        items = [it for c in by_category for it in by_category[c]]
        texts = [jsontext.dumps(prompt.chat(it), ensure_ascii=False) for it in items]  # no tokenizer: the messages
        totals = {c: len(data.load_category(c)) for c in by_category}
        return self._scored(str(file), items, texts, [given[it.id] for it in items], totals)

    def _scored(
        self,
        label: str,
        items: Sequence[data.Item],
        texts: Sequence[str],
        answers: Sequence[str],
        totals: Mapping[str, int],
    ) -> Score:
        verdicts = [
            verdict(a, it.functions, it.answer, mode_of(it.category)) for it, a in zip(items, answers, strict=True)
        ]
        scores = {}
        for category in dict.fromkeys(it.category for it in items):
            mine = [v for it, v in zip(items, verdicts, strict=True) if it.category == category]
            scores[category] = category_score(category, mine, totals[category])
        record: dict[str, Any] = {"suite": self.name, "checkpoint": label, "notes": self._notes(scores, answers)}
        if self.demos:
            record["few_shot"] = {c: {"from": s, "ids": [d.id for d in ds]} for c, (s, ds) in self.demos.items()}
        if self.log_samples is not None:
            record["samples_file"] = self._log(label, items, texts, answers, verdicts)
        return as_score(scores, record)

    def _notes(self, scores: Mapping[str, Any], answers: Sequence[str]) -> list[str]:
        notes = [
            f"{c}: {s.count} of {s.of} items, {s.parseable:.0%} parseable" for c, s in scores.items() if s.count < s.of
        ]
        if self.demos:
            sources = sorted({s for s, _ in self.demos.values()})
            notes.append(f"few-shot: {self.few_shot} demonstrations from {', '.join(sources)} (not scored)")
        if not any(a.strip() for a in answers):
            notes.append(f"no answer: all {len(answers)} outputs are empty (check the chat template and end token)")
        return notes

    def _log(
        self,
        label: str,
        items: Sequence[data.Item],
        texts: Sequence[str],
        answers: Sequence[str],
        verdicts: Sequence[Verdict],
    ) -> str:
        """Every prompt, output and verdict, one JSON line each, in ``log_samples/bfcl_<label>.jsonl``."""
        assert self.log_samples is not None
        self.log_samples.mkdir(parents=True, exist_ok=True)
        path = self.log_samples / f"bfcl_{Path(label).name.removesuffix('.jsonl') or 'outputs'}.jsonl"
        rows = [
            {"id": it.id, "category": it.category, "prompt": t, "output": a, **v.__dict__}
            for it, t, a, v in zip(items, texts, answers, verdicts, strict=True)
        ]
        text = "".join(jsontext.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        write_report_with(path, "--log-samples", lambda tmp: tmp.write_text(text, encoding="utf-8"))
        return str(path)

    @classmethod
    def check_spec(cls, spec: str, arg: str) -> None:
        data.parse_categories(arg)

    @classmethod
    def from_spec(cls, arg: str, options: Mapping[str, Any], context: Context) -> BfclEvaluator:
        return cls(arg or "validation", **options, threads=context.threads, quiet=context.quiet)

    @classmethod
    def from_command(cls, args: argparse.Namespace) -> BfclEvaluator:
        """``eval --suite bfcl[:CATEGORIES]``: ``--n``, ``--few-shot``, ``--batch-size``, ``--max-new-tokens``,
        ``--split val``, ``--device``, ``--dtype``, ``--log-samples DIR``, ``--threads``, ``--outputs``."""
        check_command(args)
        _, _, arg = args.suite.partition(":")
        return cls(
            arg or ("validation" if args.split == "val" else "all"),
            n=args.n,
            few_shot=args.few_shot or 0,
            batch_size=args.batch_size or DEFAULT_BATCH_SIZE,
            max_new_tokens=args.max_new_tokens or DEFAULT_MAX_NEW_TOKENS,
            device=args.device,
            dtype=args.dtype or "auto",
            log_samples=args.log_samples,
            chat_template=not args.no_chat_template,
            threads=args.threads or os.cpu_count() or 1,
            quiet=args.quiet,
        )


def check_command(args: argparse.Namespace) -> None:
    """Counts and paths before anything is loaded; a model folder must be one (not with ``--outputs``)."""
    for flag, value, least in (("--n", args.n, 1), ("--few-shot", args.few_shot, 0)):
        if value is not None and value < least:
            raise ConfigError(f"{flag} must be at least {least} (got {value})")
    if args.json_out:
        check_report_path(Path(args.json_out), "--json")
    if args.outputs:
        if args.few_shot:
            raise ConfigError("--few-shot shapes the prompts of a model run here; it does nothing with --outputs")
        return
    from agentmerge.evaluation.fisher import check_causal_lm_folder

    for ckpt in args.checkpoints:
        check_causal_lm_folder(ckpt)
