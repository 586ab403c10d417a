"""Scoring checkpoints: the user's own task files (``taskfile``, ``scoring``), lm-evaluation-harness
(``lmeval``) and the diagonal Fisher some methods weight by (``fisher``).
"""
