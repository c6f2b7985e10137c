"""Several client processes for one run, so the load generator is never the bottleneck it looks for.

One Python event loop that timestamps streamed chunks saturates one core at
roughly 200k chunks/s (benchmarks/client_capacity.py); a large server with
thousands of streams can produce more, and a saturated client delays every
timestamp it takes. Threads would share one interpreter, so the extra loops
are processes.

The split of work follows what must stay global and what must stay close to
the socket:
- the parent reads the plan (lazily, in order), checks dependencies, routes
  each request to a worker shortly before its send time, writes every
  record to the sink the moment it arrives (a crash loses nothing already
  measured), scrapes /metrics and handles signals;
- each worker owns a share of the concurrency cap and does the timing:
  release at the intended time, stream, timestamp in the read callback.
All processes read CLOCK_MONOTONIC (`time.perf_counter`), so the parent's
run zero is every worker's run zero.

A conversation stays on one worker (a later turn waits for the earlier one's
finish, which only that worker sees). Under a concurrency cap each worker
owns a share of the slots and is sent a request only when it has a free one,
so a freed slot is refilled by whichever worker freed it, as with one global
semaphore. The price is one parent round trip per refill, which shows in the
schedule lag; queueing requests on workers ahead of their slots was cheaper
but left a closed loop's last requests waiting on a busy worker while
another sat idle (a whole extra wave in benchmarks/client_capacity.py's
paced phase).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, Final

import uvloop

from servelab.metrics.records import (
    CLIENT_WORKER_DIED,
    CONNECTION_REFUSED,
    ERROR,
    RecordSink,
    RequestRecord,
)
from servelab.targets.errors import TargetError, unmet_dependency
from servelab.targets.stop_signals import on_stop_signals, stop_with_parent
from servelab.targets.replicas import Replicas
from servelab.targets.tally import RunTally
from servelab.workload.spec import LoadPlan, RequestSpec

if TYPE_CHECKING:
    from servelab.targets.http import HttpTarget

LOOKAHEAD_S = 0.5
"""Requests reach their worker this long before their send time: IPC never delays a release."""
READY_TIMEOUT_S = 120.0
"""Starting a worker imports the client stack; on a loaded machine that can take tens of seconds."""
POLL_S = 0.5
"""How often the parent checks that every worker is still alive."""
WORKER_DIED = CLIENT_WORKER_DIED
SERVER_GONE: Final = "server_gone"
"""client_stats note: when the run stopped releasing requests because the server refused a connection."""


def split_cap(cap: int | None, workers: int) -> list[int | None]:
    """Each worker's share of the concurrency cap; shares differ by at most one."""
    if cap is None:
        return [None] * workers
    return [cap // workers + (1 if i < cap % workers else 0) for i in range(workers)]


class WorkerPool:
    """The parent side: starts the workers, feeds them the plan, collects their records and tallies."""

    def __init__(self, target: HttpTarget, plan: LoadPlan, sink: RecordSink, workers: int) -> None:
        self.target = target
        self.plan = plan
        self.sink = sink
        self.caps = split_cap(plan.max_concurrency, workers)
        self._ctx = multiprocessing.get_context("spawn")
        self._messages: Any = self._ctx.Queue()
        self._pipes: list[Connection] = []
        self._procs: list[Any] = []
        self._inbox: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()
        self._outstanding: list[dict[int, RequestSpec]] = [{} for _ in range(workers)]
        self._progress = asyncio.Event()
        self._zero = 0.0
        self._interrupted = False
        self._server_gone: str | None = None
        self._owner: dict[int, int] = {}
        """Which worker each routed request went to: a later turn of a conversation follows it."""
        self._rest: Iterator[RequestSpec] = iter(())

    # -- start ------------------------------------------------------------

    async def start(self, wave: Sequence[RequestSpec], rest: Iterator[RequestSpec]) -> None:
        """Spawn the workers, hand each its share of the first `wave`, and wait until each has built those
        bodies and opened its connections (before the run's clock starts); raises TargetError if one does not.
        `rest` is the plan after the wave, routed once the run starts."""
        self._rest = rest
        await self._spawn()
        for spec in wave:
            wid = max(range(len(self._pipes)), key=lambda w: (self._room(w), -len(self._outstanding[w])))
            self._route(wid, spec)
        for pipe in self._pipes:
            pipe.send(("prepare", None))
        await self._all_say("prepared")

    async def _spawn(self) -> None:
        loop = asyncio.get_running_loop()
        threading.Thread(target=self._pump, args=(loop,), daemon=True, name="servelab-worker-inbox").start()
        for wid, cap in enumerate(self.caps):
            reader, writer = self._ctx.Pipe(duplex=False)
            proc = self._ctx.Process(
                target=worker_main,
                args=(wid, self.target, cap, self.plan.duration, reader, self._messages),
                daemon=True,
                name=f"servelab-client-{wid}",
            )
            proc.start()
            reader.close()
            self._pipes.append(writer)
            self._procs.append(proc)
        await self._all_say("ready")

    async def _all_say(self, what: str) -> None:
        """Wait until every worker has sent `what`; a worker that dies or stays silent is a TargetError."""
        loop = asyncio.get_running_loop()
        ready: set[int] = set()
        deadline = loop.time() + READY_TIMEOUT_S
        while len(ready) < len(self._procs):
            try:
                kind, wid, *_ = await asyncio.wait_for(self._inbox.get(), POLL_S)
            except TimeoutError:
                dead = [p.name for p in self._procs if not p.is_alive()]
                if dead or loop.time() > deadline:
                    self._shutdown()
                    raise TargetError(
                        f"client worker {', '.join(dead) or 'start'} failed: "
                        f"{'exited' if dead else f'not ready after {READY_TIMEOUT_S:g} s'}"
                    ) from None
                continue
            if kind == what:
                ready.add(wid)

    def _pump(self, loop: asyncio.AbstractEventLoop) -> None:
        """Moves worker messages onto the parent's loop; a None message (sent by the parent itself) ends it."""
        while (msg := self._messages.get()) is not None:
            loop.call_soon_threadsafe(self._inbox.put_nowait, msg)

    # -- run --------------------------------------------------------------

    async def run(self, zero: float, handle_signals: bool) -> RunTally:
        self._zero = zero
        cpu0 = time.process_time()
        for pipe in self._pipes:
            pipe.send(("start", zero))
        feeding = asyncio.create_task(self._feed())

        def on_signal() -> None:
            self._interrupted = True
            feeding.cancel()
            self._stop_workers()

        restore = on_stop_signals(on_signal) if handle_signals else None
        tally = RunTally(processes=len(self._procs))
        faults: list[str] = []
        try:
            await self._collect(tally, faults, feeding)
        finally:
            if restore is not None:
                restore()
            if not feeding.done():
                feeding.cancel()
            plan_error = await asyncio.gather(feeding, return_exceptions=True)
            self._shutdown()
        if isinstance(plan_error[0], TargetError):
            tally.plan_error = str(plan_error[0])
        tally.interrupted = tally.interrupted or self._interrupted
        tally.notes = {"workers": len(self._procs), "coordinator_cpu_s": time.process_time() - cpu0}
        if faults:
            tally.notes["worker_faults"] = faults
        if self._server_gone:
            tally.notes[SERVER_GONE] = self._server_gone
        return tally

    async def _collect(self, tally: RunTally, faults: list[str], feeding: asyncio.Task[None]) -> None:
        """Write records as they come; end when every worker has reported or died."""
        running = set(range(len(self._procs)))
        while running:
            try:
                msg = await asyncio.wait_for(self._inbox.get(), POLL_S)
            except TimeoutError:
                if feeding.done() and not feeding.cancelled() and feeding.exception() is not None:
                    self._stop_workers()
                for wid in [w for w in running if not self._procs[w].is_alive()]:
                    running.discard(wid)
                    faults.append(self._lose_worker(wid))
                continue
            kind, wid, payload = msg
            if kind == "record":
                self._outstanding[wid].pop(payload.index, None)
                self._progress.set()
                self.sink.write(payload)
                if payload.error_kind == CONNECTION_REFUSED and self._server_gone is None:
                    # The server is gone: route nothing more; each worker ends once its requests in flight have.
                    self._server_gone = (
                        f"connection refused at {payload.finish_time:.3f} s: no request released after it"
                    )
                    feeding.cancel()
            elif kind == "done":
                running.discard(wid)
                tally.merge(payload)

    def _lose_worker(self, wid: int) -> str:
        """A worker that died took its unfinished requests with it: each still gets a record, as an error."""
        proc = self._procs[wid]
        lost = self._outstanding[wid]
        now = time.perf_counter() - self._zero
        for spec in lost.values():
            self.sink.write(
                RequestRecord(
                    index=spec.index,
                    intended_time=spec.arrival_time,
                    send_time=now,
                    finish_time=now,
                    status=ERROR,
                    error_kind=WORKER_DIED,
                    error=f"client worker {wid} exited (code {proc.exitcode}) before reporting this request",
                    prefix_group=spec.prefix_group,
                    priority=spec.priority,
                )
            )
        self._progress.set()
        fault = f"worker {wid} exited with code {proc.exitcode}; {len(lost)} requests recorded as {WORKER_DIED}"
        lost.clear()
        return fault

    async def _feed(self) -> None:
        """Route the plan's requests to workers shortly before their send time, in plan order."""
        duration = self.plan.duration
        everyone = range(len(self._pipes))
        owner = self._owner
        try:
            for spec in self._rest:
                if duration is not None and spec.arrival_time >= duration:
                    return
                if spec.depends_on is not None and spec.depends_on not in owner:
                    raise unmet_dependency(spec)
                candidates = everyone if spec.depends_on is None else (owner[spec.depends_on],)
                wid = await self._wait_for_room(candidates, spec)
                if wid is None:
                    return
                self._route(wid, spec)
        finally:
            for pipe in self._pipes:
                try:
                    pipe.send(("end", None))
                except OSError:
                    pass  # that worker is gone; _collect records what it took with it

    def _route(self, wid: int, spec: RequestSpec) -> None:
        self._owner[spec.index] = wid
        self._outstanding[wid][spec.index] = spec
        self._pipes[wid].send(("spec", spec))

    def _room(self, wid: int) -> float:
        cap = self.caps[wid]
        return float("inf") if cap is None else cap - len(self._outstanding[wid])

    async def _wait_for_room(self, candidates: Sequence[int], spec: RequestSpec) -> int | None:
        """The candidate with the most free slots (then the fewest unfinished requests), once the request is
        near its send time and a candidate has a free slot; None once the run is over."""
        duration = self.plan.duration
        while True:
            now = time.perf_counter() - self._zero
            if duration is not None and now >= duration:
                return None
            if (early := spec.arrival_time - LOOKAHEAD_S - now) > 0:
                await asyncio.sleep(min(early, POLL_S))
                continue
            wid = max(candidates, key=lambda w: (self._room(w), -len(self._outstanding[w])))
            if self._room(wid) > 0:
                return wid
            self._progress.clear()
            try:
                await asyncio.wait_for(self._progress.wait(), POLL_S)
            except TimeoutError:
                pass

    # -- stop -------------------------------------------------------------

    def _stop_workers(self) -> None:
        """SIGTERM is each worker's own interrupt: it cancels its requests, which still write their records."""
        for proc in self._procs:
            if proc.is_alive():
                proc.terminate()

    def _shutdown(self) -> None:
        for proc in self._procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        for pipe in self._pipes:
            pipe.close()
        self._messages.put(None)


# --------------------------------------------------------------------------- worker side


class _ForwardSink:
    """A worker's sink: each record goes to the parent the moment its request ends."""

    def __init__(self, wid: int, messages: Any) -> None:
        self.wid = wid
        self.messages = messages

    def write(self, record: RequestRecord) -> None:
        self.messages.put(("record", self.wid, record))


def worker_main(
    wid: int, target: HttpTarget, cap: int | None, duration: float | None, specs: Connection, messages: Any
) -> None:
    """Entry point of a worker process (spawned, so it must be importable at module level)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; it forwards a stop as SIGTERM
    parent = multiprocessing.parent_process()
    if parent is not None and parent.pid is not None:
        stop_with_parent(parent.pid)  # a SIGTERM before the loop runs ends the process; after, it is the run's stop
    uvloop.run(_work(wid, target, cap, duration, specs, messages))


async def _work(
    wid: int, target: HttpTarget, cap: int | None, duration: float | None, specs: Connection, messages: Any
) -> None:
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    def read() -> None:
        while True:
            try:
                msg = specs.recv()
            except (EOFError, OSError):
                msg = ("end", None)
            loop.call_soon_threadsafe(inbox.put_nowait, msg)
            if msg[0] == "end":
                return

    threading.Thread(target=read, daemon=True, name="servelab-worker-specs").start()
    messages.put(("ready", wid, None))
    wave: list[RequestSpec] = []
    while (msg := await inbox.get())[0] == "spec":
        wave.append(msg[1])
    if msg[0] != "prepare":
        return
    client = Replicas(target.base_urls, target.route)
    bodies = await target.prepare(client, wave, cap or len(wave))
    messages.put(("prepared", wid, None))
    kind, zero = await inbox.get()
    if kind != "start":
        client.close()
        return

    async def routed() -> AsyncIterator[RequestSpec]:
        for spec in wave:
            yield spec
        while (msg := await inbox.get())[0] == "spec":
            yield msg[1]

    sink = _ForwardSink(wid, messages)
    tally = await target.serve(routed(), cap, duration, sink, zero, True, client, bodies)
    messages.put(("done", wid, tally))
    messages.close()
    messages.join_thread()
