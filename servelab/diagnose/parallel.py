"""Independent what-ifs spread over this machine's CPUs (forked processes), with their memoised results shared back.

diagnose simulates dozens of changes of one deployment; each simulation is deterministic and independent of the
others, so a loop's what-ifs can run at once on several cores and give the results a serial loop would. The
workers are forked: they find the work in this module, so nothing of it is pickled; what comes back is each
result and the entries the work added to the caches registered with `share` (the simulated outcomes and
ceilings), so that a later lookup in this process finds them.

A `Batch` may also run in the background while this process goes on (`start`): what-ifs a later loop will ask
for run beside a chain of simulations that cannot be split (a bisection), and a lookup of one of them waits for
its batch (`wait_for`) instead of simulating it again. Background workers can run at a lower priority (`nice`),
so that the chain this process waits on keeps its core.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
from collections.abc import Callable, Hashable, Iterable, Iterator, MutableMapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar, cast

T = TypeVar("T")
R = TypeVar("R")

_SHARED: list[MutableMapping[Any, Any]] = []
_TASKS: dict[int, Callable[[int], object]] = {}
"""The work of each batch by its number, as the batch's workers find it when they are forked."""
_PENDING: list[Batch] = []
"""Batches started in the background and not yet waited for (in this process; a worker has none)."""
_IN_WORKER: list[bool] = []
_NUMBERS = itertools.count()


def share(cache: MutableMapping[Any, Any]) -> None:
    """Bring back into this process the entries a worker adds to `cache` (a module-level memo of what-ifs)."""
    _SHARED.append(cache)


def cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def can_fork() -> bool:
    """Whether work can go to other processes here: several CPUs, not inside a worker, fork available."""
    return (
        cpus() >= 2
        and not _IN_WORKER
        and not multiprocessing.current_process().daemon
        and "fork" in multiprocessing.get_all_start_methods()
    )


def _start_worker(nice: int) -> None:
    _IN_WORKER.append(True)
    _PENDING.clear()  # the parent's batches are not this process's to wait for
    if nice:
        os.nice(nice)


_CLAIMS: dict[int, Any] = {}
"""Per batch, a shared byte per item: who took it (0: nobody yet, 1: a worker, 2: the parent, which then computes it
itself rather than wait while it sits in the queue)."""


def _in_worker(job: tuple[int, int]) -> tuple[object, list[dict[Any, Any]]] | None:
    number, index = job
    claims = _CLAIMS[number]
    with claims.get_lock():
        if claims[index]:
            return None  # the parent computed it
        claims[index] = 1
    before = [set(cache) for cache in _SHARED]
    result = _TASKS[number](index)
    return result, [{k: v for k, v in cache.items() if k not in seen} for cache, seen in zip(_SHARED, before)]


class Batch:
    """[fn(x) for x in items] running in forked processes from the moment it is made; `wait` gives the results
    and brings the workers' cache entries into this process. `keys[i]` names what item i computes, so that a
    lookup waits for that item only (`wait_for`), and only once a worker has begun it."""

    def __init__(
        self,
        fn: Callable[[T], object],
        items: Sequence[T],
        keys: Sequence[Iterable[Hashable]] = (),
        nice: int = 0,
    ) -> None:
        self._number = next(_NUMBERS)
        self._keys = [frozenset(k) for k in keys] or [frozenset()] * len(items)
        self._results: dict[int, object] = {}
        context = multiprocessing.get_context("fork")
        _TASKS[self._number] = lambda i: fn(items[i])
        _CLAIMS[self._number] = self._claims = context.Array("b", len(items))
        self._pool = context.Pool(min(cpus(), len(items)), initializer=_start_worker, initargs=(nice,))
        self._async = [self._pool.apply_async(_in_worker, ((self._number, i),)) for i in range(len(items))]
        _PENDING.append(self)

    def claim(self, key: Hashable) -> list[int]:
        """Take back the items computing `key` that no worker has begun (the caller computes them); the others."""
        begun = []
        for i, keys in enumerate(self._keys):
            if key in keys and i not in self._results:
                with self._claims.get_lock():
                    queued = not self._claims[i]
                    if queued:
                        self._claims[i] = 2
                if queued:
                    self._results[i] = None
                else:
                    begun.append(i)
        return begun

    def _collect(self, i: int) -> None:
        if i not in self._results:
            done = self._async[i].get()
            if done is not None:
                for cache, entries in zip(_SHARED, done[1]):
                    cache.update(entries)
            self._results[i] = None if done is None else done[0]

    def wait_for(self, key: Hashable) -> None:
        """Take in the items computing `key` that a worker has begun; leave to the caller those still queued."""
        for i in self.claim(key):
            self._collect(i)

    def wait(self) -> list[object]:
        try:
            for i in range(len(self._async)):
                self._collect(i)
        finally:
            self._retire(self._pool.close)
        return [self._results[i] for i in range(len(self._async))]

    def cancel(self) -> None:
        """Stop the workers, whatever they hold: the work the batch was for has failed."""
        self._retire(self._pool.terminate)

    def _retire(self, stop: Callable[[], None]) -> None:
        """Once: take the batch out of the pending ones, `stop` its pool (`close` lets the workers finish what they
        hold, `terminate` does not), wait for the workers and drop the batch's shared tables."""
        if self in _PENDING:
            _PENDING.remove(self)
            stop()
            self._pool.join()
            _TASKS.pop(self._number, None)
            _CLAIMS.pop(self._number, None)


def start(
    fn: Callable[[T], object], items: Sequence[T], keys: Sequence[Iterable[Hashable]], nice: int = 0
) -> Batch | None:
    """`fn` over `items` in the background, `keys[i]` naming what item i computes (None: nothing to do, or no
    second process to do it in: a later lookup then computes what it needs itself)."""
    return Batch(fn, items, keys, nice) if items and can_fork() else None


def claim(key: Hashable) -> bool:
    """Whether a background worker has begun computing `key` (then `wait_for` it); items still queued that would
    compute it are taken back, so that the caller computes it now rather than wait for the queue."""
    return any([bool(batch.claim(key)) for batch in _PENDING])


def wait_for(key: Hashable) -> None:
    """Wait for the background work computing `key`, if any, and take in what it found."""
    for batch in list(_PENDING):
        batch.wait_for(key)


@contextmanager
def settled() -> Iterator[None]:
    """Background batches end with the block: waited for when it ends (their results stay in the caches), stopped
    when it raises. No worker outlives the work it was started for."""
    try:
        yield
    except BaseException:
        for batch in list(_PENDING):
            batch.cancel()
        raise
    for batch in list(_PENDING):
        batch.wait()


def parallel_map(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """[fn(x) for x in items], in forked processes when this machine has several CPUs and there are several items.

    A call from inside a worker runs serially (no nested pools), and so does one where processes cannot fork.
    """
    if len(items) < 2 or not can_fork():
        return [fn(x) for x in items]
    return [cast(R, result) for result in Batch(fn, items).wait()]
