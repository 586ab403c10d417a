"""Silence transformers' info logs and progress bars inside the zoo (our own tqdm reports progress)."""

from __future__ import annotations

from typing import Any

from transformers.utils import logging as _hf_logging

hf_logging: Any = _hf_logging


def quiet_transformers() -> None:
    """Only errors from transformers; no weight-loading or shard-writing progress bars."""
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
