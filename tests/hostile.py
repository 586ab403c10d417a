"""Helpers of the hostile-input tests (issue 23): tiny models on disk, bounded runs, one-line CLI errors."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest
import torch
from safetensors.torch import save_file

import agentmerge
from agentmerge.cli import main

SRC = str(Path(agentmerge.__file__).resolve().parents[1])  # the agentmerge this test process imported
TESTS = str(Path(__file__).resolve().parent)
LLAMA = {
    "model.embed_tokens.weight": (16, 8),
    "model.layers.0.self_attn.q_proj.weight": (8, 8),
    "model.layers.0.mlp.down_proj.weight": (8, 12),
    "model.norm.weight": (8,),
    "lm_head.weight": (16, 8),
}


def model_folder(folder: Path, seed: int, shapes: dict[str, tuple[int, ...]] | None = None) -> Path:
    """A bf16 safetensors folder with a Llama-like config (tensor names as transformers writes them)."""
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    tensors = {n: (0.05 * torch.randn(s, generator=g)).bfloat16() for n, s in (shapes or LLAMA).items()}
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    return folder


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``main(argv)``: its status and stderr, checked to hold no traceback and at most one error line."""
    try:
        status = main(argv)
    except SystemExit as e:
        status = int(e.code or 0)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("agentmerge: error")]
    assert len(lines) <= 1, err
    return status, err


def one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str], *words: str) -> str:
    """The CLI fails with status 2 and one error line holding every one of ``words``."""
    status, err = cli(argv, capsys)
    line = next((x for x in err.splitlines() if x.startswith("agentmerge: error")), "")
    assert status == 2 and line, err
    for w in words:
        assert w in line, (w, line)
    return line


class Overran(Exception):
    """A block ran past its time limit (``within``)."""


@contextlib.contextmanager
def within(seconds: int) -> Iterator[None]:
    """Fail with ``Overran`` when the block (a Python loop) runs longer than ``seconds``."""

    def stop(signum: int, frame: FrameType | None) -> None:
        raise Overran(f"still running after {seconds} s")

    before = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))  # a read of /dev/zero fails instead of eating RAM


def bounded_python(code: str, timeout: float = 60, env: dict[str, str] | None = None) -> str:
    """Run ``code`` in a fresh interpreter with 4 GiB of address space; fail if it overruns ``timeout``.

    Returns its stdout and stderr together. For the cases whose failure is a hang in C code (a FIFO, a
    regex, ``/dev/zero``), which no signal in this process could stop.
    """
    full = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, TESTS]), **(env or {})}
    try:
        run = subprocess.run(
            [sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=timeout, preexec_fn=_limits
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running after {timeout} s (a hang)")
    return run.stdout + run.stderr


def not_a_file(path: Path, kind: str) -> Path:
    """Put at ``path`` what is no regular file: a link to ``/dev/zero``, a FIFO, or a folder."""
    if kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    return path


def bounded_merge(base: Path, model: Path, out: Path) -> str:
    """``bounded_python`` of a task_arithmetic merge of ``model`` on ``base``: 'refused: ...' on our error."""
    return bounded_python(
        "from agentmerge import MergeConfig, ModelSpec, merge\n"
        "from agentmerge.errors import AgentMergeError\n"
        f"cfg = MergeConfig(method='task_arithmetic', base={str(base)!r}, models=[ModelSpec(path={str(model)!r})])\n"
        f"try:\n    merge(cfg, {str(out)!r}, quiet=True)\nexcept AgentMergeError as e:\n    print('refused:', e)\n",
        timeout=120,
    )
