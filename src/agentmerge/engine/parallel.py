"""Chunk jobs on a thread pool: a bounded window of tasks in flight, results in task order, torch single-threaded."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

import torch
from tqdm import tqdm


def run_parallel(tasks: Sequence[Callable[[], Any]], threads: int, progress: tqdm | None = None) -> list[Any]:
    """Run ``tasks`` on ``threads`` workers with at most 2 x threads in flight; results in task order.

    A new task is submitted as soon as any one finishes, so a slow task never leaves workers idle.
    """
    if threads == 1:
        return [_tick(t(), progress) for t in tasks]
    results: list[Any] = [None] * len(tasks)
    with ThreadPoolExecutor(threads) as pool:
        window: dict[Future[Any], int] = {}
        for i, task in enumerate(tasks):
            window[pool.submit(task)] = i
            if len(window) >= 2 * threads:
                finished, _ = wait(window, return_when=FIRST_COMPLETED)
                for fut in finished:
                    results[window.pop(fut)] = _tick(fut.result(), progress)
        for fut, j in sorted(window.items(), key=lambda item: item[1]):
            results[j] = _tick(fut.result(), progress)
    return results


def _tick(result: Any, progress: tqdm | None) -> Any:
    if progress is not None:
        progress.update(1)
    return result


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run torch single-threaded inside each worker (parallelism comes from the pool); restore after."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
