"""How many of the convergence check's validation prompts (past the first n_val) occur in the training streams.

    PYTHONPATH=src:zoo/src python scripts/zoo_check_overlap.py [--seed 0] [--regime fp32_bf16] [--n 1000] \\
        [--rl-factor 8]

The training streams skip only the first ``n_val`` validation prompts; the check scores ``n`` (docs/zoo.md, "The
fair bench"). Counts the check's later prompts that the pretraining stream and each agent's RL stream (at
``rl-factor`` times its recipe's steps, the convergence loop's reach) emit.
"""

from __future__ import annotations

import argparse

from agentmerge_zoo.config import full_config
from agentmerge_zoo.splits import eval_set, held_out_prompts, train_stream
from agentmerge_zoo.tasks import all_tasks, domain_tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--regime", default="fp32_bf16")
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--rl-factor", type=int, default=8)
    args = parser.parse_args()
    cfg = full_config(args.regime)
    exclude = held_out_prompts(cfg.n_val, cfg.n_test, cfg.domains)
    pre = cfg.pretrain
    stream = train_stream(pre.mixture, args.seed, "pretrain", exclude, pre.distractor_rate)
    seen = {next(stream).prompt for _ in range(pre.steps * pre.batch_size)}
    for r in cfg.recipes:
        rl = train_stream({r.domain: 1.0}, args.seed, f"rl-{r.domain}-{r.team}", exclude)
        seen |= {next(rl).prompt for _ in range(args.rl_factor * r.steps * r.prompts_per_step)}
    tasks = all_tasks(cfg.domains)
    for domain in cfg.domains:
        for name in domain_tasks(domain):
            later = [ex.prompt for ex in eval_set(tasks[name], "val", args.n)[cfg.n_val :]]
            print(f"{name}: {sum(p in seen for p in later)} of {len(later)} occur in training")


if __name__ == "__main__":
    main()
