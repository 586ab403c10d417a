"""A local Ray runtime started by a sweep runs its trials at the driver's niceness, not Ray's default 15 above."""

from __future__ import annotations

import os

import pytest

from agentmerge.sweep.run import RaySession

ray = pytest.importorskip("ray")


def test_local_workers_keep_the_drivers_niceness() -> None:
    if ray.is_initialized():  # another module's runtime: this test needs the one RaySession starts
        ray.shutdown()
    with RaySession(quiet=True, num_cpus=1) as session:
        session.start()
        niceness = ray.remote(num_cpus=1)(lambda: __import__("os").nice(0))  # by value: workers cannot import tests
        worker = ray.get(niceness.remote())
    assert not ray.is_initialized()
    assert worker == os.nice(0), f"trial worker at niceness {worker}, driver at {os.nice(0)}"
