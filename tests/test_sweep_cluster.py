"""``agentmerge sweep --address`` on a real Ray cluster of this machine: two nodes, a node that dies, a killed driver,
a node that cannot read the models.

The cluster (``tests/raycluster.py``) is started with the ``ray`` CLI: a head and a second node, each its own
``ray start --block`` on its own loopback address (127.0.0.2, 127.0.0.3, ...), ports and temp folder, one CPU,
and a custom resource named after it. Sweeps run as ``agentmerge sweep --address`` subprocesses, as a user
runs them, and each trial's record names the node it ran on. Every process of the cluster is ended when the
module's tests are done, also when one fails, and the teardown fails when one of them would not die.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentmerge.sweep.run import Results, run_trial
from agentmerge.sweep.sweepfile import choose, load_sweep, trials
from raycluster import ENV, LocalCluster, Node, ray_cli

pytest.importorskip("ray")
if ray_cli() is None or sys.platform != "linux":
    pytest.skip("needs the ray command (pip install 'agentmerge[sweep]') on Linux", allow_module_level=True)

SRC = Path(__file__).resolve().parents[1] / "src"
SECONDS = 240  # the most any sweep here may take
EVALUATOR = """
import json, os, time
from pathlib import Path
from safetensors.torch import load_file

HERE = Path(__file__).parent  # settings come as files: Ray workers keep the environment their node started with


def score(folder):
    node = os.environ.get("LOCALCLUSTER_NODE", "here")
    with open(HERE / "calls.log", "a") as f:
        f.write(json.dumps({"folder": str(folder), "node": node}) + "\\n")
    params = json.loads((Path(folder) / "merge.json").read_text())["config"]["params"]
    if params.get("scale") == 0.7:
        os._exit(7)  # the worker dies, every time
    pauses = json.loads((HERE / "sleep.json").read_text()) if (HERE / "sleep.json").exists() else {}
    time.sleep(pauses.get(node, pauses.get("*", 0.0)))  # seconds, by node
    if params.get("scale") == 3.0:
        raise RuntimeError("scale 3 is not allowed here")
    w = load_file(str(Path(folder) / "model.safetensors"))["model.embed_tokens.weight"].float()
    return {"score": float(w.abs().mean()) * 100, "spread": float(w.std())}
"""


class Cluster:
    """The running cluster, the environment its nodes and drivers share (HOME, caches) and its folder."""

    def __init__(self, nodes: LocalCluster, root: Path) -> None:
        self.nodes, self.root = nodes, root
        self.home = root / "home"  # HOME of the head, node_b and the drivers: ~ means the same folder on them
        self.env = {"HOME": str(self.home), "AGENTMERGE_CACHE": str(root / "cache")}

    def node(self, label: str) -> Node:
        return next(n for n in self.nodes.nodes if n.label == label)

    def sweep_command(self, path: Path, out: Path, *extra: str) -> list[str]:
        cmd = [sys.executable, "-m", "agentmerge", "sweep", str(path), "--out", str(out), "--quiet"]
        return [*cmd, "--address", self.nodes.address, *extra]

    def driver_env(self) -> dict[str, str]:
        return {**os.environ, **ENV, **self.env, "PYTHONPATH": str(SRC)}

    def sweep(self, path: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
        cmd = self.sweep_command(path, out, *extra)
        env = self.driver_env()
        return subprocess.run(cmd, env=env, cwd=path.parent, capture_output=True, text=True, timeout=SECONDS)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A head and node_b (one CPU each), up for the whole module; every process of it ended afterwards."""
    base = "/tmp" if Path("/tmp").is_dir() else None  # short: Ray's socket paths must stay under 108 bytes
    root = Path(tempfile.mkdtemp(prefix="amray-", dir=base))
    nodes = LocalCluster(root / "n")
    ctx = Cluster(nodes, root)
    ctx.home.mkdir()
    try:
        nodes.start_head(env=ctx.env)
        nodes.add_node("node_b", env=ctx.env)
        yield ctx
    finally:
        left = nodes.stop()
        shutil.rmtree(root, ignore_errors=True)
    assert not left, f"processes of the test cluster outlived it: {left}"


def write_sweep(folder: Path, family: tuple[Path, list[Path]] | None, **data: Any) -> Path:
    """A sweep file and the evaluator in ``folder``; ``family`` gives base and models unless ``data`` does."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "clustereval.py").write_text(EVALUATOR)
    if family is not None:
        data = {"base": str(family[0]), "models": [str(a) for a in family[1]], **data}
    data = {"evaluate": "python:clustereval:score", "objective": "score", **data}
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def reference(path: Path, folder: Path, skip: float | None = None) -> dict[str, dict[str, Any]]:
    """The trials of the sweep file (but scale ``skip``) run here, in this process, without Ray: the local run."""
    cfg = load_sweep(path)
    data = cfg.model_dump(mode="json")
    todo = [t for t in trials(cfg, choose(cfg)) if skip is None or dict(t.setting.params).get("scale") != skip]
    records = {t.id: run_trial(data, t, str(folder / t.id), [str(path.parent)]) for t in todo}
    (path.parent / "calls.log").unlink(missing_ok=True)
    return records


def outcome(record: dict[str, Any]) -> tuple[Any, ...]:
    return record["status"], record["metrics"], record.get("error")


def digest(file: Path) -> str:
    return hashlib.sha256(file.read_bytes()).hexdigest()


def evaluations(folder: Path) -> list[dict[str, str]]:
    log = folder / "calls.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def wait_until(check: Any, what: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {seconds:.0f} s")
        time.sleep(0.2)


def test_a_sweep_runs_on_both_nodes_and_equals_a_local_run(
    cluster: Cluster, tiny_family: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    methods = {"ram": {}, "ram_plus": {"r": [0.1, 0.5]}, "task_arithmetic": {"lambda": [0.5, 3.0]}}
    path = write_sweep(tmp_path / "s", tiny_family, methods=methods, keep="all")
    local = reference(path, tmp_path / "local")
    (tmp_path / "s" / "sleep.json").write_text('{"*": 0.5}')  # a trial holds its node a while: both get some
    out = tmp_path / "out"
    done = cluster.sweep(path, out)  # no --max-concurrent: as many at once as the cluster has CPUs
    assert done.returncode == 0, done.stderr[-3000:]
    records = Results(out / "results.jsonl").records()
    assert sorted(r["trial"] for r in records) == sorted(local)  # each trial once
    head, b = cluster.node("node_head"), cluster.node("node_b")
    assert {r["node_ip"] for r in records} == {head.ip, b.ip}  # both nodes ran trials (each its own address)
    assert len({r["node"] for r in records}) == 2
    for r in records:
        assert outcome(r) == outcome(local[r["trial"]])
        if r["status"] == "ok":  # the very same merged weights as the local run's
            assert digest(out / "trials" / r["trial"] / "model.safetensors") == digest(
                tmp_path / "local" / r["trial"] / "model.safetensors"
            )
    assert sum(r["status"] == "failed" for r in records) == 1  # lambda 3.0, as locally
    assert (out / "results.md").is_file()


def test_a_killed_driver_resumes_on_the_cluster(
    cluster: Cluster, tiny_family: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    """SIGKILL the driver mid-sweep, rerun it: every trial recorded once, none recorded evaluated again."""
    folder = tmp_path / "s"
    path = write_sweep(folder, tiny_family, methods={"task_arithmetic": {"lambda": [0.2, 0.4, 0.6, 0.8, 1.0, 1.2]}})
    local = reference(path, tmp_path / "local")
    (folder / "sleep.json").write_text('{"*": 1.0}')
    out = tmp_path / "out"
    cmd = cluster.sweep_command(path, out, "--max-concurrent", "2")
    driver = subprocess.Popen(cmd, env=cluster.driver_env(), cwd=folder, start_new_session=True)
    try:
        wait_until(lambda: len(Results(out / "results.jsonl").records()) >= 2, "two trials recorded", SECONDS)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait(timeout=30)
    before = Results(out / "results.jsonl").records()
    assert 2 <= len(before) < 6, "the sweep finished before it could be killed; lengthen its sleep"
    (folder / "sleep.json").unlink()
    again = cluster.sweep(path, out)
    assert again.returncode == 0, again.stderr[-3000:]
    after = Results(out / "results.jsonl").records()
    assert sorted(r["trial"] for r in after) == sorted(local)  # each trial exactly once
    assert after[: len(before)] == before  # the records of the killed run untouched
    assert all(outcome(r) == outcome(local[r["trial"]]) for r in after)  # none failed for the kill
    second = [e["folder"] for e in evaluations(folder)][-(6 - len(before)) :]
    assert not {str(out / "trials" / r["trial"]) for r in before} & set(second)


def test_a_node_that_cannot_read_the_models_stops_the_sweep_before_any_trial(
    cluster: Cluster, tiny_family: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    """``~/fam`` is the models on the head and node_b; node_c's HOME has none: one error naming node_c and the path."""
    family = tiny_family[0].parent
    (cluster.home / "fam").symlink_to(family, target_is_directory=True)
    elsewhere = cluster.root / "home_c"
    elsewhere.mkdir()
    node_c = cluster.nodes.add_node("node_c", env={**cluster.env, "HOME": str(elsewhere)})
    try:
        models = [f"~/fam/{a.relative_to(family)}" for a in tiny_family[1]]
        base = f"~/fam/{tiny_family[0].relative_to(family)}"
        path = write_sweep(tmp_path / "s", None, base=base, models=models, methods={"ram": {}})
        done = cluster.sweep(path, tmp_path / "out")
        assert done.returncode == 2, done.stderr[-3000:]
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
        message = lines[0]
        assert message.startswith("agentmerge: error: node ")
        assert f"node {node_c.ip} (id " in message and f", node_c) cannot read base {base} " in message
        assert f"{elsewhere}/fam/" in message and "no such file or folder" in message
        assert "and 3 more" in message  # the three models too; the head and node_b read them all
        assert not Results(tmp_path / "out" / "results.jsonl").records()  # no trial ran
    finally:
        left = cluster.nodes.stop_node(node_c)
    assert not left, f"node_c's processes outlived it: {left}"


def test_a_node_that_dies_loses_no_trial(
    cluster: Cluster, tiny_family: tuple[Path, list[Path]], tmp_path: Path
) -> None:
    """node_d's raylet is killed while it evaluates a trial: that trial runs again on another node, every trial is
    recorded exactly once, a trial whose worker always dies is recorded failed with Ray's reason."""
    folder = tmp_path / "s"
    lambdas = [0.2, 0.4, 0.6, 0.7, 0.8, 1.0]  # 0.7: the evaluator kills its worker
    path = write_sweep(
        folder, tiny_family, methods={"task_arithmetic": {"lambda": lambdas}}, resources={"cpus": 1, "retries": 1}
    )
    local = reference(path, tmp_path / "local", skip=0.7)
    node_d = cluster.nodes.add_node("node_d", env=cluster.env)
    (folder / "sleep.json").write_text('{"node_d": 30, "*": 0.5}')  # node_d's trial is sure to be killed
    out = tmp_path / "out"
    cmd = cluster.sweep_command(path, out, "--max-concurrent", "3")
    driver = subprocess.Popen(cmd, env=cluster.driver_env(), cwd=folder, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: any(e["node"] == "node_d" for e in evaluations(folder)), "a trial on node_d", SECONDS)
        cluster.nodes.kill_node(node_d)  # while that trial sleeps in its evaluation
        killed = next(e["folder"] for e in evaluations(folder) if e["node"] == "node_d")
        _, err = driver.communicate(timeout=SECONDS)
    finally:
        driver.kill()
    assert driver.returncode == 0, err[-3000:]
    wait_until(lambda: not cluster.nodes.processes(node_d), "node_d's processes ended", 30)
    records = Results(out / "results.jsonl").records()
    by_id = {r["trial"]: r for r in records}
    assert len(by_id) == len(records) == 6  # none lost, none twice
    for r in records:
        if r["params"]["scale"] == 0.7:
            assert r["status"] == "failed" and "(resources.retries = 1)" in r["error"], r
            assert r["error"].startswith("WorkerCrashedError"), r
        else:
            assert outcome(r) == outcome(local[r["trial"]]), r
    (again,) = [r for r in records if str(out / "trials" / r["trial"]) == killed]
    assert again["status"] == "ok" and again["node_ip"] != node_d.ip  # ran again on another node
    assert [e["folder"] for e in evaluations(folder)].count(killed) == 2
    rerun = cluster.sweep(path, out)
    assert rerun.returncode == 0 and "0 run now, 6 already done" in rerun.stderr, rerun.stderr[-2000:]
    assert len(Results(out / "results.jsonl").records()) == 6
