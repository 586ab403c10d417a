"""Write the zoo's test prompts as a task file for ``agentmerge eval --tasks`` (docs/evaluate.md).

    python examples/zoo_tasks.py zoo-tasks.jsonl --n 100

One defaults line per task (its generation length), then N examples per task with the zoo's reference answers,
scored by exact match. The zoo's own verifiers (``agentmerge eval --suite zoo``) also give partial credit;
exact match on the reference is the strictest of them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from agentmerge_zoo.splits import eval_set
from agentmerge_zoo.tasks import all_tasks


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--n", type=int, default=100, help="examples per task (default 100)")
    args = p.parse_args()
    lines = []
    for name, task in all_tasks().items():
        lines.append({"task": name, "defaults": {"match": "exact", "max_new_tokens": task.max_new_tokens}})
        lines += [{"task": name, "prompt": ex.prompt, "reference": ex.answer} for ex in eval_set(task, "test", args.n)]
    args.out.write_text("".join(json.dumps(line) + "\n" for line in lines))
    print(f"wrote {len(lines) - len(all_tasks())} examples of {len(all_tasks())} tasks to {args.out}")


if __name__ == "__main__":
    main()
