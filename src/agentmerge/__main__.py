"""The ``agentmerge`` command (and ``python -m agentmerge``): the CLI, started without collector pauses.

Importing torch and numba creates about a million objects that live as long as the process. With the
cyclic garbage collector on, Python walks them again and again while they load (about 0.3 s of a
1.5 s start-up here); after loading, ``gc.freeze`` moves them out of the collector's sight, so later
collections stay cheap too. Nothing else changes: the collector is on while the command runs.
"""

from __future__ import annotations

import gc
import os
import sys


def main() -> int:
    gc.disable()
    try:
        from agentmerge import cli, merge, registry  # noqa: F401  (the heavy imports of a merge, loaded up front)
    finally:
        gc.freeze()
        gc.enable()
    try:
        return cli.main()
    except BrokenPipeError:  # the reader went away (``agentmerge methods | head``): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
