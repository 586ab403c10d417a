"""Model references no file system or Hub can hold (issue 23): 5,000-character hub ids, 100 k-character paths,
a 5,000-character revision. Each gave an ``OSError: File name too long`` traceback before; now one line."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.hostile import model_folder, one_line_error

from agentmerge.io.formats.hubref import parse_hub_ref

LONG = ["org/" + "x" * 5000, "/tmp/" + "y" * 100_000, "org/name@" + "r" * 5000, "a/" * 3000 + "b"]


@pytest.mark.parametrize("ref", LONG)
def test_overlong_references_are_one_line_in_every_subcommand(
    tmp_path: Path, ref: str, capsys: pytest.CaptureFixture[str]
) -> None:
    good = str(model_folder(tmp_path / "good", 0))
    out = str(tmp_path / "out")
    for argv in (
        ["merge", "--method", "ram", "--base", ref, "--model", good, "--model", good, "-o", out, "--quiet"],
        ["merge", "--method", "ram", "--base", good, "--model", ref, "--model", good, "-o", out, "--dry-run"],
        ["probe", "--base", ref, good, "--quiet"],
        ["convert", ref, out],
        ["fisher", ref, "--out", out],
        ["lm-eval", ref, "--tasks", "x"],
        ["eval", ref, "--tasks", str(tmp_path / "t.jsonl")],
    ):
        one_line_error(argv, capsys)
    assert not Path(out).exists()


def test_an_overlong_name_is_no_hub_id() -> None:
    assert parse_hub_ref("org/" + "x" * 97) is None
    assert parse_hub_ref("org/" + "x" * 96) is not None
