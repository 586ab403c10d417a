"""The sandbox that runs model-written code: what passes, what fails, and what it contains."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from agentmerge.evaluation.sandbox import Limits, Sandbox

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the sandbox needs a POSIX system")


@pytest.fixture(scope="module")
def box() -> Sandbox:
    return Sandbox.make(Limits(wall_s=2.0, cpu_s=2, memory_mib=512, file_mib=1, processes=16))


def test_a_correct_program_passes_and_a_wrong_one_fails(box: Sandbox) -> None:
    good = box.run("def inc(x):\n    return x + 1\n\nassert inc(1) == 2\nprint('seen')\n")
    assert good.passed and good.status == "passed" and "seen" in good.output
    bad = box.run("def inc(x):\n    return x\n\nassert inc(1) == 2\n")
    assert not bad.passed and bad.status == "failed" and "AssertionError" in bad.output
    assert not box.run("def inc(x) return x\n").passed  # a syntax error


@pytest.mark.parametrize("exit_call", ["import os\nos._exit(0)\n", "import sys\nsys.exit(0)\n", "raise SystemExit\n"])
def test_leaving_early_is_not_a_pass(box: Sandbox, exit_call: str) -> None:
    assert not box.run(exit_call + "assert False\n").passed


def test_an_endless_loop_is_killed_at_the_time_limit(box: Sandbox) -> None:
    started = time.perf_counter()
    out = box.run("while True:\n    pass\n")
    took = time.perf_counter() - started
    assert not out.passed and out.status in ("timed out", "killed by SIGXCPU", "killed by SIGKILL")
    assert took < box.limits.wall_s + 3


def test_a_fork_bomb_is_contained(box: Sandbox) -> None:
    started = time.perf_counter()
    out = box.run("import os\nwhile True:\n    os.fork()\n")
    assert not out.passed and time.perf_counter() - started < box.limits.wall_s + 3


def test_nothing_it_starts_outlives_it(box: Sandbox) -> None:
    """Children that leave the process group and sleep are gone once the run is over (the pid namespace)."""
    if not box.prefix:
        pytest.skip(f"no pid namespace here, a child that calls setsid() can outlive the run: {box.notes}")
    program = (
        "import os, time\n"
        "for _ in range(3):\n"
        "    if os.fork() == 0:\n"
        "        os.setsid()\n"
        "        print('child', os.readlink('/proc/self'), flush=True)\n"
        "        time.sleep(60)\n"
        "        os._exit(0)\n"
        "time.sleep(0.5)\n"
    )
    out = box.run(program)
    pids = [int(line.split()[1]) for line in out.output.splitlines() if line.startswith("child ")]
    assert len(pids) == 3
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_a_huge_allocation_and_a_huge_file_are_refused(box: Sandbox) -> None:
    big = box.run("x = bytearray(8 << 30)\n")
    assert not big.passed and "MemoryError" in big.output
    written = box.run("with open('big.bin', 'wb') as f:\n    f.write(b'x' * (64 << 20))\n")
    assert not written.passed and ("File too large" in written.output or written.status == "killed by SIGXFSZ")
    flood = box.run("while True:\n    print('x' * 10000)\n")  # its output is a file too
    assert not flood.passed and len(flood.output) <= 2000


def test_stdin_is_closed_and_the_environment_empty(box: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTMERGE_SECRET_FOR_TEST", "1")
    started = time.perf_counter()
    read = box.run("input()\n")
    assert not read.passed and "EOFError" in read.output and time.perf_counter() - started < box.limits.wall_s
    env = box.run("import os\nassert 'AGENTMERGE_SECRET_FOR_TEST' not in os.environ and 'HOME' not in os.environ\n")
    assert env.passed
    assert box.run("import os\nassert os.listdir('.') == []\n").passed  # an empty folder (the program deleted)


@pytest.mark.skipif(os.geteuid() != 0, reason="as an ordinary user the program runs as that user (docs)")
def test_it_cannot_write_or_delete_outside_its_folder(box: Sandbox, tmp_path: Path) -> None:
    kept = tmp_path / "kept.txt"
    kept.write_text("mine")
    target = tmp_path / "written.txt"
    out = box.run(f"open({str(target)!r}, 'w').write('x')\n")
    assert not out.passed and not target.exists()
    out = box.run(f"import os\nos.remove({str(kept)!r})\n")
    assert not out.passed and kept.read_text() == "mine"


def test_no_network_where_namespaces_are_allowed(box: Sandbox) -> None:
    if not box.prefix:
        pytest.skip(f"no network namespace here: {box.notes}")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(0.5)
        port = server.getsockname()[1]
        out = box.run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\n")
        assert not out.passed
        with pytest.raises(TimeoutError):
            server.accept()


def test_bad_limits_are_one_line() -> None:
    from agentmerge.errors import ConfigError

    with pytest.raises(ConfigError, match="wall_s must be a positive number"):
        Sandbox.make(Limits(wall_s=0))
