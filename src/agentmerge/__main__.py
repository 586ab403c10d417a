"""The ``agentmerge`` command (and ``python -m agentmerge``).

It imports only the command line; each command imports what it needs once its arguments are checked
(``cli.common.heavy_imports``), so ``--help``, ``methods`` and input errors answer without loading torch.
"""

from __future__ import annotations

import os
import sys


def main() -> int:
    from agentmerge import cli

    try:
        return cli.main()
    except BrokenPipeError:  # the reader went away (``agentmerge methods | head``): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
