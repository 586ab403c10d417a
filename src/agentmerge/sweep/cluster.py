"""A sweep on a Ray cluster: what every node needs, checked before the first trial, and where each trial ran.

A trial runs on whichever node Ray gives it and reads its inputs there: the base and the models (a local
path is opened on that node, a hub id fetched by it), the Fisher files of explicit trials and what its
evaluator reads (``Evaluator.reads``: the file of ``tasks:FILE``, the module of ``python:MODULE:FUNCTION``);
it writes its merged folder under ``OUT/trials``. So every node that runs trials needs the same paths: the
same folders on every machine, or one folder they all share. A relative path is read in the node's working
folder (where ``ray start`` ran), ``~`` in the home of the user running Ray there.

:func:`check_nodes` runs one small task (no CPU asked) on every alive node that can take a trial (enough
CPUs and GPUs for ``resources``) before the first trial: it opens every input path there (each file of a
folder, one byte) and creates and removes a file in ``OUT/trials``. A node that cannot gets one error
naming the node and the path, instead of a failed trial per node and path. A node that joins later is
not checked (its trials record their errors as any failing trial does).

:func:`where` is called by each trial's task: the record in ``results.jsonl`` carries the ``node`` id and
``node_ip`` it ran on.

Before any of that, :func:`check_address` bounds how long joining a cluster may take (Ray itself retries a
closed or silent address for minutes): ``--address HOST:PORT`` (or ``ray://HOST:PORT``) must be well formed,
accept a TCP connection within ``CONNECT_SECONDS`` and answer the HTTP/2 preface every gRPC server answers
(Ray's GCS and client server are gRPC servers) with a SETTINGS frame within ``CONNECT_SECONDS`` more; the
preface is skipped when ``RAY_USE_TLS`` is on. :func:`check_resources` refuses a trial request no alive node
can hold (more CPUs or GPUs than any node has), which Ray would keep pending forever.
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentmerge.errors import CheckpointError, ConfigError
from agentmerge.sweep import evaluators

if TYPE_CHECKING:
    from agentmerge.sweep.sweepfile import Resources, SweepConfig

CHECK_SECONDS = 120.0  # how long the input check waits for a node (a busy node starts its worker slowly)
MARKER = ".nodes-check"  # written in OUT by the driver: a node that reads it back shares OUT
_RAY_RESOURCES = {"CPU", "GPU", "memory", "object_store_memory"}
CONNECT_SECONDS = 10.0  # how long --address may take to accept a connection, then to answer as gRPC does
# the HTTP/2 client preface and an empty SETTINGS frame; a gRPC server answers with its own SETTINGS frame
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_SETTINGS = 4


@dataclass(frozen=True)
class Need:
    """One input a trial reads on its node: ``path`` (a file or folder) or ``module`` (importable there)."""

    what: str  # "base", "model", "fisher file", "task file", "evaluator module"
    ref: str
    kind: str = "path"


def where() -> dict[str, str]:
    """The node this Ray task runs on: ``{"node": id, "node_ip": address}``."""
    import ray

    ip: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    return {"node": ray.get_runtime_context().get_node_id(), "node_ip": ip}


def slots(resources: Resources) -> int:
    """Trials the connected Ray runtime holds at once: its CPUs (and GPUs) over a trial's request."""
    import ray

    total: dict[str, float] = ray.cluster_resources()  # type: ignore[no-untyped-call]
    n = int(total.get("CPU", 1) // resources.cpus)
    if resources.gpus:
        n = min(n, int(total.get("GPU", 0) // resources.gpus))
    return max(1, n)


# --------------------------------------------------------------------------- joining the cluster


def check_address(address: str, seconds: float = CONNECT_SECONDS) -> None:
    """``ConfigError`` unless ``address`` names a reachable gRPC server, within ``2 * seconds`` (module docstring).

    ``auto`` and ``local`` are left to Ray (it answers them at once); a ``ray://`` address needs ``ray[client]``.
    """
    text = address.strip()
    if text in ("auto", "local"):
        return
    where = f"--address {address!r}"
    if text.startswith("ray://") and importlib.util.find_spec("grpc") is None:
        raise ConfigError(f"{where}: a ray:// address needs Ray's client: pip install 'ray[client]'")
    host, sep, port = text.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or "/" in host:
        raise ConfigError(
            f"{where}: write HOST:PORT of the cluster's head (the address `ray start --head` prints), ray://HOST:PORT "
            "for Ray's client, or leave --address out for a runtime on this machine"
        )
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=seconds) as conn:
            if os.environ.get("RAY_USE_TLS", "0").lower() in ("0", "false", ""):
                _answers_grpc(conn, where, seconds)
    except OSError as e:
        reason = "timed out" if isinstance(e, TimeoutError) else (e.strerror or type(e).__name__).lower()
        raise ConfigError(
            f"{where}: no Ray cluster answers there ({reason} within {seconds:g} s); start it (ray start --head) "
            "or fix the address"
        ) from None


def _answers_grpc(conn: socket.socket, where: str, seconds: float) -> None:
    """Send the HTTP/2 preface; a gRPC server's first 9 bytes back are a SETTINGS frame header."""
    conn.settimeout(seconds)
    conn.sendall(_PREFACE)
    head = b""
    while len(head) < 9:
        part = conn.recv(9 - len(head))
        if not part:
            break
        head += part
    if len(head) < 9 or head[3] != _SETTINGS:
        raise ConfigError(
            f"{where}: something listens there but it is no Ray cluster (no gRPC answer); give the head's address"
        )


def check_resources(wanted: Resources) -> None:
    """``ConfigError`` when no alive node of the connected Ray runtime can hold one trial's ``resources``."""
    import ray

    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]
    if any(_can_host(n, wanted) for n in nodes):
        return
    cpus = max((n.get("CPU", 0) for n in nodes), default=0)
    gpus = max((n.get("GPU", 0) for n in nodes), default=0)
    raise ConfigError(
        f"resources: a trial asks for {wanted.cpus} CPUs and {wanted.gpus:g} GPUs, but no node of the Ray runtime "
        f"has that many (the largest: {cpus:g} CPUs, {gpus:g} GPUs), so Ray would keep every trial waiting; lower "
        "resources.cpus / resources.gpus, or join a cluster with such a node (--address)"
    )


# --------------------------------------------------------------------------- what a trial needs


def needs(cfg: SweepConfig, search_path: list[str]) -> list[Need]:
    """Every input a trial of ``cfg`` may read on its node (hub ids left out: each node fetches those)."""
    out = [Need("base", cfg.base)] if cfg.base is not None else []
    out += [Need("model", m) for m in cfg.models]
    out = [Need(n.what, part) for n in out for part in _parts(n.ref) if not _is_hub_id(part)]
    out += [Need("fisher file", f) for e in cfg.trials for f in e.fisher or []]
    evaluator, arg = evaluators.parse(cfg.evaluate)
    out += [Need(*r) for r in evaluator.reads(arg, search_path)]
    return list(dict.fromkeys(out))


def _parts(ref: str) -> list[str]:
    """A model reference's paths: ``MODEL+ADAPTER`` is two (unless a file of that very name exists)."""
    return [ref] if Path(ref).expanduser().exists() or "+" not in ref else ref.rsplit("+", 1)


def _is_hub_id(ref: str) -> bool:
    from agentmerge.io.formats.localpath import is_missing_local

    return not Path(ref).expanduser().exists() and not is_missing_local(ref)


# --------------------------------------------------------------------------- on each node


def check_here(wanted: list[Need], out: str, token: str) -> dict[str, Any]:
    """Run on a node: which inputs it cannot read, whether it can write trial folders, whether it shares OUT."""
    problems = [(n.what, n.ref, why) for n in wanted if (why := _unreadable(n)) is not None]
    trials = Path(out) / "trials"
    try:
        trials.mkdir(parents=True, exist_ok=True)
        probe = trials / f".write-check-{secrets.token_hex(4)}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        problems.append(("output folder", str(trials), _reason(e)))
    try:
        shared = (Path(out) / MARKER).read_text() == token
    except OSError:
        shared = False
    return {"problems": problems, "shared": shared}


def _unreadable(need: Need) -> str | None:
    """Why ``need`` cannot be read here (None when it can): each file of a folder is opened, one byte read."""
    if need.kind == "module":
        return None if importlib.util.find_spec(need.ref) is not None else "not importable here"
    path = Path(need.ref).expanduser()
    try:
        files = [p for p in path.iterdir() if not p.is_dir()] if path.is_dir() else [path]
    except OSError as e:
        return _shown(need, path) + _reason(e)
    for file in files:  # a dangling link too (a cache's blobs left behind)
        try:
            with open(file, "rb") as f:
                f.read(1)
        except OSError as e:
            return _shown(need, file) + _reason(e)
    return None


def _shown(need: Need, path: Path) -> str:
    """``PATH: `` where it is not the reference as written (``~`` or a relative path resolved, a file inside)."""
    return "" if str(path) == need.ref and path.is_absolute() else f"{path.absolute()}: "


def _reason(e: OSError) -> str:
    if isinstance(e, FileNotFoundError):
        return "no such file or folder"
    return (e.strerror or type(e).__name__).lower() + (f" ({e.filename})" if e.filename else "")


# --------------------------------------------------------------------------- the driver's side


def check_nodes(cfg: SweepConfig, out: Path, search_path: list[str], timeout: float = CHECK_SECONDS) -> list[str]:
    """Check every node that can take a trial before the first one (module docstring); notes for the user.

    Raises ``CheckpointError`` naming the first node and path that fail (and how many more do).
    """
    import ray

    every: list[dict[str, Any]] = ray.nodes()  # type: ignore[no-untyped-call]
    nodes = [n for n in every if n.get("Alive") and _can_host(n.get("Resources", {}), cfg.resources)]
    if not nodes:
        return ["no node can take a trial yet (resources: cpus, gpus); the trials wait for one"]
    token = secrets.token_hex(8)
    marker = out / MARKER
    marker.write_text(token)
    try:
        answers, notes = _ask(nodes, needs(cfg, [*search_path]), str(out), token, timeout)
    finally:
        marker.unlink(missing_ok=True)
    problems = [
        f"{_describe(n)} cannot read {what} {ref} ({why})" for n, a in answers for what, ref, why in a["problems"]
    ]
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise CheckpointError(
            f"{problems[0]}{more}: every node that runs trials needs the same paths, or a folder they all share "
            "(docs/sweep.md, 'Running on a cluster')"
        )
    apart = [_describe(n) for n, a in answers if not a["shared"]]
    if apart and cfg.keep != "none":
        notes.append(
            f"{', '.join(apart)} do not share {out}: merged folders of the trials run there stay on those nodes "
            f"(keep: {cfg.keep}); put --out on a folder every node shares"
        )
    return notes


def _ask(
    nodes: list[dict[str, Any]], wanted: list[Need], out: str, token: str, timeout: float
) -> tuple[list[tuple[dict[str, Any], dict[str, Any]]], list[str]]:
    """``check_here`` on each node (pinned to it, no CPU asked, no retry); the answers and notes on the silent."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(check_here)
    refs = {
        task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(
            wanted, out, token
        ): n
        for n in nodes
    }
    ready, silent = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
    answers, notes = [], []
    for ref in ready:
        try:
            answers.append((refs[ref], ray.get(ref)))
        except ray.exceptions.RayError as e:  # the node left during the check: no trial will run there
            notes.append(f"{_describe(refs[ref])} left during the input check ({type(e).__name__})")
    for ref in silent:
        ray.cancel(ref, force=True)
        notes.append(f"{_describe(refs[ref])} did not answer the input check in {timeout:.0f} s (not checked)")
    return answers, notes


def _can_host(resources: dict[str, float], wanted: Resources) -> bool:
    return resources.get("CPU", 0) >= wanted.cpus and resources.get("GPU", 0) >= wanted.gpus


def _describe(node: dict[str, Any]) -> str:
    """``node 10.0.0.7 (id 3f2a1b0c, node_b)``: address, short id, custom resources."""
    labels = sorted(
        k for k in node.get("Resources", {}) if k not in _RAY_RESOURCES and not k.startswith(("node:", "accelerator"))
    )
    tail = "".join(f", {k}" for k in labels)
    return f"node {node.get('NodeManagerAddress', '?')} (id {str(node.get('NodeID', '?'))[:8]}{tail})"
