"""Scoring checkpoints through one interface (``evaluator.Evaluator``): the user's own task files (``taskfile``,
``scoring``), lm-evaluation-harness (``lmeval``), a Python function (``pyfunction``) and the installed plug-ins'
(``kinds``); and the diagonal Fisher some methods weight by (``fisher``).
"""
