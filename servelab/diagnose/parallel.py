"""Independent what-ifs spread over this machine's CPUs (forked processes), with their memoised results shared back.

diagnose simulates dozens of changes of one deployment; each simulation is deterministic and independent of the
others, so a loop's what-ifs can run at once on several cores and give the results a serial loop would. The
workers are forked: they find the work in this module, so nothing of it is pickled; what comes back is each
result and the entries the work added to the caches registered with `share` (the simulated outcomes and
ceilings), so that a later lookup in this process finds them.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any, TypeVar, cast

T = TypeVar("T")
R = TypeVar("R")

_SHARED: list[MutableMapping[Any, Any]] = []
_TASK: list[Callable[[int], object]] = []


def share(cache: MutableMapping[Any, Any]) -> None:
    """Bring back into this process the entries a worker adds to `cache` (a module-level memo of what-ifs)."""
    _SHARED.append(cache)


def cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _in_worker(index: int) -> tuple[object, list[dict[Any, Any]]]:
    before = [set(cache) for cache in _SHARED]
    result = _TASK[0](index)
    return result, [{k: v for k, v in cache.items() if k not in seen} for cache, seen in zip(_SHARED, before)]


def parallel_map(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """[fn(x) for x in items], in forked processes when this machine has several CPUs and there are several items.

    A call from inside a worker runs serially (no nested pools), and so does one where processes cannot fork.
    """
    if (
        cpus() < 2
        or len(items) < 2
        or _TASK
        or multiprocessing.current_process().daemon
        or "fork" not in multiprocessing.get_all_start_methods()
    ):
        return [fn(x) for x in items]
    _TASK.append(lambda i: fn(items[i]))
    try:
        with multiprocessing.get_context("fork").Pool(min(cpus(), len(items))) as pool:
            done = pool.map(_in_worker, range(len(items)), chunksize=1)
    finally:
        _TASK.clear()
    for _, added in done:
        for cache, entries in zip(_SHARED, added):
            cache.update(entries)
    return [cast(R, result) for result, _ in done]
