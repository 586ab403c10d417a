"""The convergence check's sizes (``converge.py``), apart so that the command line reads them without torch."""

from __future__ import annotations

CHECK_N = 3000  # validation prompts per task of the check (converge.py's docstring says why 3,000)
GROWTH = 1.0  # an extension adds growth x the current steps (1.0: doubles them)
ROUNDS = 3  # extensions at most
