"""What the commands share: argument parsing helpers (``--param``: ``agentmerge.paramtext``'s one grammar) and
importing torch without collector pauses."""

from __future__ import annotations

import argparse
import contextlib
import gc
from collections.abc import Iterator, Sequence

from agentmerge.errors import ConfigError
from agentmerge.paramtext import Value, parse_assignments, parse_value

__all__ = ["check_fisher_args", "check_threads", "heavy_imports", "parse_params", "parse_value", "parse_weights"]


@contextlib.contextmanager
def heavy_imports() -> Iterator[None]:
    """Import torch and numba (the merge, the probe, the evaluation) without collector pauses.

    Importing them creates about a million objects that live as long as the process. With the cyclic
    garbage collector on, Python walks them again and again while they load (about 0.3 s of a 1.5 s
    start-up); after loading, ``gc.freeze`` moves them out of the collector's sight, so later collections
    stay cheap too. Commands enter this only once their arguments and config are checked, so help, the
    method list and input errors answer without torch.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def check_threads(threads: int | None) -> None:
    """``--threads`` is absent or at least 1 (checked before anything runs)."""
    if threads is not None and threads < 1:
        raise ConfigError(f"--threads must be at least 1 (got {threads}); leave it out to use every core")


def parse_weights(text: str) -> list[float]:
    """``"1,0.5"`` -> [1.0, 0.5]; anything that is not a number is one clear error."""
    out = []
    for i, item in enumerate(text.split(",")):
        try:
            out.append(float(item))
        except ValueError:
            raise ConfigError(
                f"--weights: value {i + 1} ({item.strip()!r}) is not a number; write e.g. 1,0.5"
            ) from None
    return out


def check_fisher_args(args: argparse.Namespace) -> None:
    """fisher's counts must be positive (its output folder is checked against its inputs by ``io.guards.pathargs``)."""
    if args.samples is not None and args.samples < 1:
        raise ConfigError(f"--samples must be at least 1 (got {args.samples})")
    if args.max_tokens < 1:
        raise ConfigError(f"--max-tokens must be at least 1 (got {args.max_tokens}); 0 tokens give an all-zero Fisher")


def parse_params(items: Sequence[str]) -> dict[str, Value]:
    """``--param NAME=VALUE`` items, each value read by the one grammar of ``agentmerge.paramtext``."""
    return parse_assignments(items, "--param")
