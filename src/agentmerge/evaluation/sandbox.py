"""Run a model's program in a separate, limited process: the executor of ``--suite humaneval``.

Model output is code nobody has read. Each program runs in its own process, a fresh ``python -I`` that starts
with this module's small runner (:data:`RUNNER`, trusted code) and then executes the program:

- **limits** (``setrlimit`` in the runner before the program starts): CPU seconds (``RLIMIT_CPU``), address
  space (``RLIMIT_AS``), the size of any file written (``RLIMIT_FSIZE``, the captured output included), the
  number of processes of its user (``RLIMIT_NPROC``), no core files; a **wall-time limit** in the parent, after
  which the whole process group is killed (and always killed when the program ends, so nothing it started lingers);
- **an empty temporary folder** as its working directory (the program file is read and deleted before it runs),
  removed afterwards; **stdin closed** (``/dev/null``: ``input()`` gets end of file); **the environment
  cleared**; ``python -I`` (no user site, no ``PYTHON*`` variables, the script's folder not on ``sys.path``);
- **namespaces where the platform allows them** (:func:`probe_isolation`): ``unshare --net --pid --fork
  --kill-child`` (as root, or with ``--map-root-user`` through user namespaces): no network but a private
  loopback, and every process the program starts dies with it; elsewhere the program runs without them and
  :attr:`Sandbox.notes` says so;
- **another user** when agentmerge runs as root: the runner drops to ``nobody`` (uid/gid 65534, no
  supplementary groups) before the program runs, so it cannot write files owned by root, and the process limit
  holds (the kernel does not apply ``RLIMIT_NPROC`` to root).

Not isolated: the file system is the host's. As ``nobody`` the program can read what is world-readable and write
where the world may write (``/tmp``, ``/dev/shm``; sizes capped by ``RLIMIT_FSIZE``); run as an ordinary user
it runs **as that user** and can read and write that user's files. Without the network namespace it can open
connections. A program written to attack the runner (inspecting its frames for the pass token) could forge a
pass: the sandbox guards against accidents of model-written code, not against an adversary. For untrusted
models, run the evaluation in a container or VM.

A program passes when it runs to its end without an exception (``SystemExit`` included) and the runner then
writes the token the parent gave it: an ``os._exit(0)`` or a killed process is a failure.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from agentmerge.errors import ConfigError

NOBODY = 65534
PROGRAM = "program.py"
OUTPUT_TAIL = 2000  # characters of the program's output kept for the log

# The runner: argv = cpu_s, memory_bytes, file_bytes, processes, uid (-1: keep). It reads the program (first line:
# the pass token), deletes the file, limits itself; before it drops to ``uid`` it imports the standard-library
# modules the program names (found by ast.parse, which runs nothing), because the interpreter may live in a folder
# only root can read; then it runs the program and, on success, writes the token.
RUNNER = """
import ast, os, resource, sys, traceback
SKIP = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo"}
def preload(source):
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module] + [node.module + "." + a.name for a in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] in sys.stdlib_module_names and name.split(".")[0] not in SKIP:
                try:
                    __import__(name)
                except BaseException:
                    pass
def main():
    cpu, mem, fsize, nproc, uid = (int(a) for a in sys.argv[1:6])
    with open("program.py", encoding="utf-8") as f:
        token = f.readline().rstrip("\\n")
        source = f.read()
    os.remove("program.py")
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if uid >= 0:
        preload(source)
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    try:
        exec(compile(source, "program.py", "exec"), {"__name__": "__program__"})
    except BaseException:
        sys.stdout.flush()
        sys.stderr.write(traceback.format_exc(limit=3))
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.write("\\n" + token + "\\n")
    sys.stdout.flush()
    os._exit(0)
main()
"""


@dataclass(frozen=True)
class Limits:
    """Per program: wall and CPU seconds, address space and file size in MiB, processes of its user."""

    wall_s: float = 10.0
    cpu_s: int = 10
    memory_mib: int = 1024
    file_mib: int = 16
    processes: int = 64

    def check(self) -> None:
        for name, value in self.__dict__.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"sandbox: {name} must be a positive number (got {value!r})")


@dataclass(frozen=True)
class Outcome:
    """What one program did: passed, or why not (``failed``, ``timed out``, ``killed by SIGXCPU``...)."""

    passed: bool
    status: str
    output: str  # the last OUTPUT_TAIL characters of its stdout and stderr
    seconds: float


def probe_isolation(timeout_s: float = 10.0) -> tuple[list[str], list[str]]:
    """The ``unshare`` prefix that works here (first of: as is, with ``--map-root-user``) and notes on what is
    missing; ``([], notes)`` where none does."""
    tool = shutil.which("unshare")
    if tool is None or not sys.platform.startswith("linux"):
        return [], ["no network or process namespace (no unshare here): the program can open connections"]
    base = [tool, "--net", "--pid", "--fork", "--kill-child"]
    for prefix in (base, [tool, "--map-root-user", *base[1:]]):
        try:
            done = subprocess.run([*prefix, "true"], capture_output=True, timeout=timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return prefix, []
    return [], ["unshare --net --pid is not permitted here: the program can open connections"]


@dataclass
class Sandbox:
    """Runs programs one process each under :class:`Limits`; namespaces probed once when made."""

    limits: Limits = field(default_factory=Limits)
    prefix: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    python: str = sys.executable

    @classmethod
    def make(cls, limits: Limits | None = None) -> Sandbox:
        if os.name != "posix":
            raise ConfigError("sandbox: running model code needs a POSIX system (resource limits, process groups)")
        limits = limits or Limits()
        limits.check()
        prefix, notes = probe_isolation()
        if os.geteuid() != 0:
            notes.append("not run as root: the program runs as this user and can write this user's files")
        return cls(limits, prefix, notes)

    @property
    def uid(self) -> int:
        """The user the program runs as: ``nobody`` when we are root, else unchanged (-1)."""
        return NOBODY if os.geteuid() == 0 else -1

    def command(self) -> list[str]:
        lim = self.limits
        mib = 1 << 20
        args = [lim.cpu_s, lim.memory_mib * mib, lim.file_mib * mib, lim.processes, self.uid]
        return [*self.prefix, self.python, "-I", "-c", RUNNER, *(str(int(a)) for a in args)]

    def run(self, program: str) -> Outcome:
        """Run ``program`` (Python source) once; see the module docstring."""
        token = secrets.token_hex(16)
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="agentmerge-sandbox-", ignore_cleanup_errors=True) as tmp:
            work, log = Path(tmp) / "work", Path(tmp) / "output"
            work.mkdir()
            (work / PROGRAM).write_text(f"{token}\n{program}", encoding="utf-8")
            if self.uid >= 0:
                os.chown(work, self.uid, self.uid)
            with log.open("wb") as out:
                status = self._wait(work, out)
            output = log.read_bytes()[-4 * OUTPUT_TAIL :].decode("utf-8", "replace")
        passed = status == "exited 0" and output.rstrip("\n").endswith(token)
        if passed:
            output = output.rstrip("\n")[: -len(token)]
        verdict = "passed" if passed else ("failed" if status.startswith("exited") else status)
        return Outcome(passed, verdict, output[-OUTPUT_TAIL:], time.perf_counter() - started)

    def _wait(self, work: Path, out: BinaryIO) -> str:
        """Start the runner in ``work``, wait at most the wall limit, kill its process group: how it ended."""
        proc = subprocess.Popen(
            self.command(),
            cwd=work,
            env={},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
        try:
            code = proc.wait(timeout=self.limits.wall_s)
            status = f"exited {code}" if code >= 0 else f"killed by {_signal_name(-code)}"
        except subprocess.TimeoutExpired:
            status = "timed out"
        finally:
            _kill_group(proc)
        return status


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
