"""What the zoo's subcommands share: default folders, common options, the configuration a command asks for."""

from __future__ import annotations

import argparse
import os
from typing import Any

DEFAULT_ZOO = ".zoo-cache"
DEFAULT_WORK = "bench-work"


def steps_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--steps",
        default=None,
        help="agents' RL steps instead of the regime's, e.g. memory=200,code=160 (a longer recipe continues the "
        "shorter one's saved training; what `zoo check --rounds` prints)",
    )


def common_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--smoke", action="store_true", help="tiny sizes: checks the pipeline runs, not who wins")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def set_threads(n: int | None) -> int:
    import torch

    count = n or os.cpu_count() or 1
    torch.set_num_threads(count)
    return count


def zoo_config(smoke: bool, regime: str = "bf16", suite: str = "core", steps: str | None = None) -> Any:
    from agentmerge import ConfigError
    from agentmerge_zoo.config import full_config, parse_steps, six_config, smoke_config, with_steps
    from agentmerge_zoo.tasks import SIX_DOMAINS

    if suite == "six":
        cfg = smoke_config(regime, SIX_DOMAINS) if smoke else six_config(regime)
    else:
        cfg = smoke_config(regime) if smoke else full_config(regime)
    try:
        return with_steps(cfg, parse_steps(steps)) if steps else cfg
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
