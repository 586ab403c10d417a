"""A throwaway Ray cluster of several nodes on this machine, started with the ``ray`` CLI (tests, benchmarks).

Every node is one ``ray start --block`` process in a session of its own (``setsid``), on a loopback address
of its own (127.0.0.2 for the head, 127.0.0.3, ... for the others), with its own block of ports, its own temp
folder under the cluster's root, ``--num-cpus`` of its own and a custom resource named after it
(``--resources '{"node_b": 1}'``); its processes, Ray's workers included, see ``LOCALCLUSTER_NODE=<label>``.
Nothing started here outlives :meth:`LocalCluster.stop`: it kills each node's session and says which process,
if any, would not die; a node's ``ray start`` also gets SIGTERM if the process that started it dies. Every
wait is bounded. ``ENV`` is the environment the nodes run with; a driver joining them should use it too.

    cluster = LocalCluster(root)                  # root: a short path (Ray's socket paths are < 108 bytes)
    try:
        cluster.start_head()                      # ray start --head --block ... (returns once it runs)
        cluster.add_node("node_b")                # ray start --block --address=HEAD ... (once registered)
        ...                                       # agentmerge sweep ... --address cluster.address
    finally:
        left = cluster.stop()                     # [] when every process of it ended
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

_LIBC = ctypes.CDLL(None) if sys.platform == "linux" else None  # loaded here: the forked child must not import
PORTS_PER_NODE = 24  # 8 named ports, then the workers' range
NAMED = (
    "port",
    "node-manager-port",
    "object-manager-port",
    "dashboard-agent-listen-port",
    "dashboard-agent-grpc-port",
    "runtime-env-agent-port",
    "metrics-export-port",
    "dashboard-port",
)
HEAD_ONLY = {"port", "dashboard-port"}
# For every process of the cluster and its drivers: quick failure detection (a killed raylet is declared dead
# in ~3 s, not ~30 s), a short drain on SIGTERM, and no token authentication (loopback only; a token file in
# ~/.ray, which other Ray users of this machine may write, would otherwise switch it on for some processes).
ENV = {
    "RAY_AUTH_MODE": "disabled",
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
    "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "3",
    "RAY_USAGE_STATS_ENABLED": "0",
}

STARTED = "Ray runtime started."  # what ``ray start`` prints once its node has registered with the head


def ray_cli() -> str | None:
    """The ``ray`` command of this Python's environment (or on PATH), None when there is none."""
    here = Path(sys.executable).parent / "ray"
    return str(here) if here.is_file() else shutil.which("ray")


def free_block(n: int, rng: random.Random, tries: int = 200) -> int:
    """The first of ``n`` consecutive ports that are free on every interface now (Ray binds them on all)."""
    for _ in range(tries):
        start = rng.randrange(30000, 60000 - n)
        if all(_free(p) for p in range(start, start + n)):
            return start
    raise RuntimeError(f"no block of {n} free ports found")


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


@dataclass
class Node:
    """One ``ray start --block`` process; its session id is its pid, shared by everything it starts."""

    label: str
    ip: str
    proc: subprocess.Popen[bytes]
    temp: Path
    log: Path
    ports: dict[str, int]

    @property
    def session(self) -> int:
        return self.proc.pid


@dataclass
class LocalCluster:
    """Nodes started with the ``ray`` CLI under ``root``; :meth:`stop` (or leaving the ``with``) ends them all."""

    root: Path
    cpus: int = 1
    seed: int | None = None
    subnet: str = "127.0.0"  # node i listens on SUBNET.(2 + i): loopback addresses, one per node
    nodes: list[Node] = field(default_factory=list)
    ray: str = field(default_factory=lambda: ray_cli() or "ray")

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._rng = random.Random(self.seed if self.seed is not None else os.getpid() ^ time.time_ns())

    @property
    def address(self) -> str:
        return f"{self.nodes[0].ip}:{self.nodes[0].ports['port']}"

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start_head(self, label: str = "node_head", env: dict[str, str] | None = None, timeout: float = 120) -> Node:
        """Start the head; returns once it runs."""
        return self._start(label, True, env, timeout)

    def add_node(self, label: str, env: dict[str, str] | None = None, timeout: float = 120) -> Node:
        """Start a node that joins the head; returns once it has registered with it."""
        return self._start(label, False, env, timeout)

    def _start(self, label: str, head: bool, env: dict[str, str] | None, timeout: float) -> Node:
        first = free_block(PORTS_PER_NODE, self._rng)
        ports = {name: first + i for i, name in enumerate(NAMED) if head or name not in HEAD_ONLY}
        temp = self.root / label
        ip = f"{self.subnet}.{2 + len(self.nodes)}"
        temp.mkdir(exist_ok=True)
        args = [self.ray, "start", "--block", "--disable-usage-stats", f"--node-ip-address={ip}"]
        args += [f"--{name}={port}" for name, port in ports.items()]
        args += [f"--min-worker-port={first + len(NAMED)}", f"--max-worker-port={first + PORTS_PER_NODE - 1}"]
        args += [f"--num-cpus={self.cpus}", "--num-gpus=0", f"--resources={json.dumps({label: 1})}"]
        args += ["--object-store-memory=80000000", f"--temp-dir={temp}"]
        args += ["--head", "--include-dashboard=false"] if head else [f"--address={self.address}"]
        log = self.root / f"{label}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                args,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **ENV, "LOCALCLUSTER_NODE": label, **(env or {})},
                cwd=temp,
                start_new_session=True,
                preexec_fn=_end_with_parent,
            )
        node = Node(label, ip, proc, temp, log, ports)
        self.nodes.append(node)
        self._wait_started(node, timeout)
        return node

    def _wait_started(self, node: Node, timeout: float) -> None:
        """Until the node's ``ray start`` says it runs (it has then registered with the head), or fails."""
        deadline = time.monotonic() + timeout
        while STARTED not in node.log.read_text(errors="replace"):
            if node.proc.poll() is not None:
                raise RuntimeError(f"{node.label} did not start:\n{node.log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{node.label} not up after {timeout:.0f} s (log: {node.log})")
            time.sleep(0.2)

    def processes(self, node: Node | None = None) -> list[tuple[int, str]]:
        """The live processes of the nodes' sessions (or of one node's): ``(pid, command line)``."""
        sessions = {n.session for n in ([node] if node else self.nodes)}
        out = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            try:
                if os.getsid(pid) in sessions and _state(pid) != "Z":
                    out.append((pid, (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")))
            except (OSError, ProcessLookupError):
                continue
        return out

    def raylet_pid(self, node: Node) -> int:
        found = [pid for pid, cmd in self.processes(node) if "/raylet " in cmd or cmd.startswith("raylet ")]
        if len(found) != 1:
            raise RuntimeError(f"{node.label}: expected one raylet, found {found}")
        return found[0]

    def kill_node(self, node: Node) -> None:
        """SIGKILL the node's raylet, as when its machine dies (its ``ray start --block`` then ends the rest)."""
        os.kill(self.raylet_pid(node), signal.SIGKILL)

    def stop_node(self, node: Node, grace: float = 8.0) -> list[tuple[int, str]]:
        """End one node as :meth:`stop` ends them all (SIGTERM: it drains, the head marks it gone)."""
        self._signal(node, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self.processes(node) and time.monotonic() < deadline:
            time.sleep(0.2)
        self._signal(node, signal.SIGKILL)
        _kill_each(self.processes(node))
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.proc.wait(timeout=5)
        return self.processes(node)

    def _signal(self, node: Node, sig: signal.Signals) -> None:
        """``sig`` to the node's process group (its session leader's), while any process of its session lives."""
        if self.processes(node):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(node.session, sig)

    def stop(self, grace: float = 0.0) -> list[tuple[int, str]]:
        """End every node: SIGTERM to each session (workers first, head last), SIGKILL after ``grace`` s
        (default at once: nothing of a throwaway cluster needs a graceful end).

        Returns the processes still alive after that (empty when all went), so a caller can fail on them.
        """
        if grace > 0:
            for node in reversed(self.nodes):
                self._signal(node, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while self.processes() and time.monotonic() < deadline:
                time.sleep(0.2)
        for node in self.nodes:
            self._signal(node, signal.SIGKILL)
            _kill_each(self.processes(node))
        for node in self.nodes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.proc.wait(timeout=5)
        deadline = time.monotonic() + 5
        while (left := self.processes()) and time.monotonic() < deadline:
            time.sleep(0.2)
        return left


def _end_with_parent() -> None:
    """In a node's ``ray start`` before it runs: SIGTERM when the process that started it dies (Linux's
    ``PR_SET_PDEATHSIG``), so a test run killed outright leaves no cluster behind."""
    if _LIBC is not None:
        _LIBC.prctl(1, signal.SIGTERM)


def _kill_each(processes: list[tuple[int, str]]) -> None:
    """SIGKILL processes of a node's session that left its process group (by pid, each checked first)."""
    for pid, _ in processes:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _state(pid: int) -> str:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2]
