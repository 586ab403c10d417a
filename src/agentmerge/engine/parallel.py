"""Chunk jobs on a thread pool: a bounded window of tasks in flight, results in task order, torch single-threaded.

``run_parallel`` returns every task's result; ``fold_parallel`` folds them into one value in task order as they
come, so a pass over thousands of chunks holds only the results of the tasks in flight. (Keeping one small result
per chunk until a pass ends is not only its bytes: allocated among the chunk's freed temporaries, each splits
their hole, and glibc's heap grows by about a chunk's temporaries a chunk.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

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


T = TypeVar("T")


def fold_parallel(
    tasks: Sequence[Callable[[], Any]],
    threads: int,
    fold: Callable[[T, Any], T],
    start: T,
    progress: tqdm | None = None,
) -> T:
    """``fold(...fold(fold(start, r0), r1)..., rn)`` of the tasks' results ``r0 .. rn``, in task order whatever the
    threads (so a floating-point sum is the same bits), each result folded as soon as every earlier one is.

    At most 2 x threads tasks run at once, as in ``run_parallel``, and at most 4 x threads results wait for a
    slower earlier task (then no new task starts until it is in): a bounded number, never one per task.
    """
    if threads == 1:
        for t in tasks:
            start = fold(start, _tick(t(), progress))
        return start
    ready: dict[int, Any] = {}
    window: dict[Future[Any], int] = {}
    folded = 0

    def collect() -> None:  # wait for a task, then fold every result whose predecessors are all folded
        nonlocal start, folded
        finished, _ = wait(window, return_when=FIRST_COMPLETED)
        for fut in finished:
            ready[window.pop(fut)] = _tick(fut.result(), progress)
        while folded in ready:
            start = fold(start, ready.pop(folded))
            folded += 1

    with ThreadPoolExecutor(threads) as pool:
        for i, task in enumerate(tasks):
            window[pool.submit(task)] = i
            while len(window) >= 2 * threads or len(window) + len(ready) >= 4 * threads:
                collect()
        while window:
            collect()
    return start


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
