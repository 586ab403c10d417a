"""What the commands share: argument parsing helpers and importing torch without collector pauses."""

from __future__ import annotations

import argparse
import contextlib
import gc
from collections.abc import Iterator, Sequence

from agentmerge.errors import ConfigError
from agentmerge.methods.spec import ParamValue


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


def parse_value(text: str) -> ParamValue:
    """``"0.1"`` -> 0.1, ``"3"`` -> 3, ``"true"`` -> True, anything else stays a string."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


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


def parse_params(items: Sequence[str]) -> dict[str, ParamValue]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--param {item!r}: write NAME=VALUE, e.g. --param r=0.1")
        out[key.strip()] = parse_value(value)
    return out
