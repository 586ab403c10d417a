"""Silence transformers' info logs and progress bars inside the zoo (our own tqdm reports progress)."""

from __future__ import annotations

from transformers.utils import logging as hf_logging


def quiet_transformers() -> None:
    """Only errors from transformers; no weight-loading or shard-writing progress bars."""
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
