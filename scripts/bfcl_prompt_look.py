"""Greedy answers of one checkpoint on the BFCL skill's first test prompts, with or without the names hint.

Prints each answer with its offered functions and scores, then the share of answers that name only offered
functions, the mean partial credit and the strict accuracy (docs/real/bfcl.md, "The names hint"):

    PYTHONPATH=src:zoo/src python scripts/bfcl_prompt_look.py real-work/base --per 4 [--no-hint] [--threads 2]

``--per K`` takes the first K test items of each non-live category (the skill's ``fixed_set``, the bench's test
prompts); ``--no-hint`` removes the names hint from every user turn (the prompt before session 13).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from agentmerge_zoo.real.bfcl_credit import called_names
from agentmerge_zoo.real.skill_bfcl import HINT, TEST_CATEGORIES, BfclSkill
from agentmerge_zoo.real.tasks import Example


def unhinted(example: Example) -> Example:
    """The example as it was before the names hint: each user turn its question alone."""
    shots = tuple((user.split("\n\n", 1)[1] if user.startswith(HINT) else user, a) for user, a in example.shots)
    return replace(example, user=example.data["question"], shots=shots)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--per", type=int, default=4, help="test items per category (default 4)")
    parser.add_argument("--no-hint", action="store_true", help="without the names hint")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentmerge_zoo.real.sampling import greedy, prompt_ids

    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
    model = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype="auto").eval()
    skill = BfclSkill()
    examples = skill.fixed_set("test", args.per * len(TEST_CATEGORIES)) or []
    examples = [unhinted(e) for e in examples] if args.no_hint else examples
    ids = [prompt_ids(tokenizer, e.messages()) for e in examples]
    print("prompt tokens, median:", sorted(len(i) for i in ids)[len(ids) // 2])
    outputs = greedy(model, tokenizer, ids, skill.max_new_tokens, 8)
    named = strict = partial = 0.0
    for example, output in zip(examples, outputs, strict=True):
        score = skill.score(example, output)
        offered = {f["name"] for f in example.data["function"]}
        names = called_names(output)
        named += bool(names) and names <= offered
        strict, partial = strict + score["strict"], partial + score["partial"]
        print(example.data["category"], sorted(offered)[:4], "->", repr(output[:140]), score)
    n = len(examples)
    print(f"named only offered functions {named:.0f}/{n}; partial {partial / n:.3f}; strict {strict:.0f}/{n}")


if __name__ == "__main__":
    main()
