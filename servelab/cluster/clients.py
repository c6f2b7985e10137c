"""`bench --ray-address ADDR --clients N`: one plan sent by N client actors, records merged here as they arrive.

Each actor runs the single-machine client (`HttpTarget.arun`) on its share
of the plan: every actor builds the same plan from the same flags and seed,
and keeps the requests it owns. A conversation is owned whole by the client
of its first turn (a later turn waits for the earlier one's finish, which
only that client sees); other requests go round-robin. An open loop keeps
its global schedule (each client sends its requests at their planned times).
A concurrency cap is one cap for all clients, held by a `SlotBroker` actor
(slot_broker.py) on the driver's node: a client asks it for a slot before
each send and gives the slot back at each record, so the requests in flight
across the clients never exceed the cap; a slot a client frees goes to its
own waiting request if it has one (no round trip), else back to the broker,
for whichever client asks next. A dead client's slots are reclaimed when the
driver sees it dead. One client (`--clients 1`) keeps its own local
cap (and its `--workers`); with several, a shared cap runs one event loop per
client (`--workers` is refused with it: the clients are the scale-out).

Clocks: each actor's offset to the driver is measured as NTP does (the
driver's send and receive times around the actor's reading, the sample with
the shortest round trip kept, half of it being the error bound), and each
client's records are shifted onto the driver's time line by its own run zero
minus that offset. All clients wait for one common start (the driver's clock
through each offset); what differs is their own preparation before the
clock starts (connections, first bodies), recorded with the offsets and round
trips in client_stats.clients as `start_skew_ms`.

Records reach the driver's records.jsonl as they arrive (polled every
POLL_S), so a client that dies loses only what it had not yet reported; its
death is in its client_stats entry (which alone makes the run "disturbed",
exit code 3, as with a dead --workers process) and each request of its share
still unfinished gets a record as a `client_worker_died` error. The driver
does not learn that share from the client, which takes it lazily and reports
what it took only at the next poll (a client killed in its start-up, or
within a poll of taking a request, would take that news with it): it
divides its own copy of the plan as the clients do (`owned`), so for a plan
of --num-prompts every request of the dead client's share without a record
gets one. A --duration plan's share is open-ended (a closed loop's requests
are all due at once), so there only the requests the client reported taking
do.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, TypedDict

import uvloop

from servelab.cluster.ray_pool import ClusterError, connect
from servelab.cluster.slot_broker import SharedSlots, SlotBroker
from servelab.errors import InputError
from servelab.metrics.records import CLIENT_WORKER_DIED, ERROR, RecordSink, RequestRecord
from servelab.targets.base import SampleSink, TargetRun
from servelab.targets.http import HttpTarget
from servelab.workload.spec import LoadPlan, RequestSpec

POLL_S = 0.5
START_AHEAD_S = 1.0
"""The clients start together this long after the driver asks them to (each waits for it on its own clock)."""
CLOCK_SAMPLES = 8


class _Buffer:
    """The actor's sink: records wait here until the driver drains them (a deque: the run's thread appends while
    `drain`'s takes, and neither loses an item)."""

    def __init__(self) -> None:
        self.records: deque[RequestRecord] = deque()

    def write(self, record: RequestRecord) -> None:
        self.records.append(record)


def _take_all(items: deque[Any]) -> list[Any]:
    taken = []
    while items:
        taken.append(items.popleft())
    return taken


def owned(plan: LoadPlan, clients: int, me: int, taken: deque[RequestSpec]) -> LoadPlan:
    """The requests of `plan` that client `me` of `clients` sends: whole conversations, the rest round-robin; the
    cap stays the whole plan's (shared through the broker when there are several clients).

    Each request the client takes from its share is appended to `taken` (the driver's list of what a client that
    dies had in hand)."""
    owner: dict[int, int] = {}  # request index -> client; a first turn opens the next conversation in turn
    opened = 0

    def mine(spec: RequestSpec) -> bool:
        nonlocal opened
        if spec.depends_on is None:
            owner[spec.index] = opened % clients
            opened += 1
        else:
            owner[spec.index] = owner[spec.depends_on]
        return owner[spec.index] == me

    def share_of_requests() -> Iterator[RequestSpec]:
        for spec in plan.requests:
            if mine(spec):
                taken.append(spec)
                yield spec

    return LoadPlan(share_of_requests(), plan.max_concurrency, plan.duration, plan.warmup, plan.description)


class ClientActor:
    """One load-generating client on a cluster node (a threaded Ray actor: `drain` runs while `run` does)."""

    def __init__(
        self, target_options: dict[str, Any], make_plan: Callable[[], LoadPlan], clients: int, me: int
    ) -> None:
        self.target = HttpTarget(**target_options)
        self.taken: deque[RequestSpec] = deque()
        self.plan = owned(make_plan(), clients, me, self.taken)
        self.buffer = _Buffer()
        self.me = me

    def now(self) -> float:
        return time.time()

    def host(self) -> str:
        return socket.gethostname()

    def run(self, start_at: float, broker: Any | None = None) -> ClientResult:
        """Start at `start_at` on this host's clock (the driver's common start, through this host's offset); take
        the cap's slots from `broker` when the clients share one."""
        if broker is not None:
            import ray

            ray.get(broker.ready.remote())
        time.sleep(max(0.0, start_at - time.time()))
        slots = None if broker is None else SharedSlots(broker, self.me, functools.cache(lambda: self._shift(start_at)))
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            try:
                run = runner.run(self.target.arun(self.plan, self.buffer, slots=slots))
            finally:
                if slots is not None and self.target.clock_zero is not None:
                    slots.leave(time.perf_counter() - self.target.clock_zero)
        stats = run.client_stats if slots is None else {**run.client_stats, "slot_broker": slots.stats()}
        return {
            "duration": run.duration,
            "server_info": run.server_info,
            "client_stats": stats,
            "interrupted": run.interrupted,
        }

    def _shift(self, start_at: float) -> float:
        """This client's run time 0 on the driver's time line: its clock's zero on this host's wall clock, less the
        common start on it (which is the driver's zero through this host's offset)."""
        zero = self.target.clock_zero
        assert zero is not None, "the shared slots are used only once the client's clock has started"
        return zero + time.time() - time.perf_counter() - start_at

    def drain(self) -> tuple[float | None, list[tuple[int, float, int]], list[RequestRecord]]:
        """The run's zero on this host's wall clock (None before it starts), the requests taken from the plan
        (index, planned time, prompt tokens) and the records finished, each since the last call."""
        zero = self.target.clock_zero
        taken = [(s.index, s.arrival_time, s.prompt_len) for s in _take_all(self.taken)]
        records = _take_all(self.buffer.records)
        return (None if zero is None else zero + time.time() - time.perf_counter()), taken, records


def _shift(record: RequestRecord, by: float) -> RequestRecord:
    record.intended_time += by
    record.send_time += by
    record.finish_time += by
    if record.first_token_time is not None:
        record.first_token_time += by
    record.chunk_times = [t + by for t in record.chunk_times]
    return record


class RayClients:
    """A Target whose load comes from `clients` actors on the cluster at `address` (see the module docstring)."""

    def __init__(
        self, address: str, clients: int, target_options: dict[str, Any], make_plan: Callable[[], LoadPlan]
    ) -> None:
        self.ray = connect(address)
        self.clients = clients
        self.target_options = target_options
        self.make_plan = make_plan

    def _broker(self, cap: int) -> Any:
        """The shared cap's actor, on the driver's node: if that node is lost, so is the driver, and the run with it."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(self.ray.get_runtime_context().get_node_id(), soft=True)
        return self.ray.remote(num_cpus=0, max_restarts=0)(SlotBroker).options(scheduling_strategy=here).remote(cap)

    def _reclaim(self, broker: Any, client: int, now: float) -> int | None:
        """A dead client's slots, given back to the others; None if the broker is gone too (then so is the cap)."""
        try:
            held: int = self.ray.get(broker.leave.remote(client, now))
        except self.ray.exceptions.RayActorError:
            return None
        return held

    def _clock(self, actor: Any) -> tuple[float, float]:
        """(offset of the actor's clock to ours, round trip) in seconds, from the quickest of CLOCK_SAMPLES readings."""
        best: tuple[float, float] | None = None
        for _ in range(CLOCK_SAMPLES):
            sent = time.time()
            theirs = self.ray.get(actor.now.remote())
            back = time.time()
            if best is None or back - sent < best[1]:
                best = (theirs - (sent + back) / 2, back - sent)
        assert best is not None
        return best

    def run(self, plan: LoadPlan, sink: RecordSink, on_sample: SampleSink | None = None) -> TargetRun:
        cap = plan.max_concurrency if self.clients > 1 else None  # one client keeps its own (local) cap
        if cap is not None and self.target_options.get("workers", 1) > 1:
            raise InputError(
                f"--max-concurrency is one cap shared by the --clients {self.clients}, each on one event "
                "loop: drop --workers (more clients are the way to more client processes)"
            )
        broker = None if cap is None else self._broker(cap)
        remote = self.ray.remote(num_cpus=0, max_concurrency=2, max_restarts=0)(ClientActor)
        actors = [
            remote.options(scheduling_strategy="SPREAD").remote(self.target_options, self.make_plan, self.clients, i)
            for i in range(self.clients)
        ]
        started = [*actors, *([broker] if broker is not None else [])]
        """Every actor of this run, all stopped when it ends (or fails to start)."""
        try:
            places = [self._place(i, actor) for i, actor in enumerate(actors)]
            run = _DriverRun(self, plan, sink, actors, places, broker)
            run.follow()
        finally:
            for each in started:
                self.ray.kill(each)
        return run.merged()

    def _place(self, i: int, actor: Any) -> ClientPlace:
        """Client `i`'s host and clock; ClusterError if it died before the run (nothing was sent, nothing lost)."""
        try:
            offset, rtt = self._clock(actor)
            host = self.ray.get(actor.host.remote())
        except self.ray.exceptions.RayActorError as exc:
            raise ClusterError(
                f"client {i} died before the run started ({type(exc).__name__}); nothing was sent "
                "(see `ray status` for its node)"
            ) from None
        return {"client": i, "host": host, "clock_offset_ms": 1000 * offset, "clock_rtt_ms": 1000 * rtt}


class ClientPlace(TypedDict):
    """Where a client runs and how its clock relates to the driver's: the head of its client_stats entry."""

    client: int
    host: str
    clock_offset_ms: float
    clock_rtt_ms: float


class ClientResult(TypedDict, total=False):
    """What a client's `run` returned (its TargetRun's parts), or why it died: the driver's view of one client."""

    duration: float
    server_info: dict[str, Any]
    client_stats: dict[str, Any]
    interrupted: bool
    died: str
    slots_reclaimed: int | None


class _DriverRun:
    """One run of RayClients as the driver follows it: the clients' records shifted onto its time line as they
    arrive, each client's result or death, and the records a dead client owes (see the module docstring)."""

    def __init__(
        self,
        owner: RayClients,
        plan: LoadPlan,
        sink: RecordSink,
        actors: list[Any],
        places: list[ClientPlace],
        broker: Any | None,
    ) -> None:
        self.owner, self.ray, self.plan, self.sink = owner, owner.ray, plan, sink
        self.actors, self.places, self.broker = actors, places, broker
        self.zero = time.time() + START_AHEAD_S
        self.shifts: list[float | None] = [None] * len(actors)
        self.open: list[dict[int, tuple[float, int]]] = [{} for _ in actors]  # per client: taken, not yet recorded
        self.recorded: list[set[int]] = [set() for _ in actors]
        self.results: dict[int, ClientResult] = {}
        self.interrupted = False

    def follow(self) -> None:
        """Start every client at the common zero, then poll: drain records, keep each result or death, until all
        have ended (or Ctrl-C)."""
        runs = {
            actor.run.remote(self.zero + self.places[i]["clock_offset_ms"] / 1000, self.broker): i
            for i, actor in enumerate(self.actors)
        }
        try:
            while runs:
                done, _ = self.ray.wait(list(runs), num_returns=1, timeout=POLL_S)
                for i in range(len(self.actors)):
                    if i not in self.results:
                        self.drain(i)
                for ref in done:
                    i = runs.pop(ref)
                    self.drain(i)
                    self.ended(i, ref)
        except KeyboardInterrupt:
            self.interrupted = True

    def ended(self, i: int, ref: Any) -> None:
        """Client `i`'s result; if it died, records for what it owed and its slots back to the others."""
        try:
            self.results[i] = self.ray.get(ref)
        except self.ray.exceptions.RayError as exc:
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            self.results[i] = {"died": why}
            self.lose(i, why)
            if self.broker is not None:  # its slots go back to the others, and the broker ignores it from now
                self.results[i]["slots_reclaimed"] = self.owner._reclaim(self.broker, i, time.time() - self.zero)

    def drain(self, i: int) -> None:
        """Client `i`'s records since the last poll, shifted onto the driver's time line, into the sink."""
        try:
            their_zero, taken, records = self.ray.get(self.actors[i].drain.remote())
        except self.ray.exceptions.RayActorError:
            return
        if their_zero is not None and self.shifts[i] is None:
            self.shifts[i] = their_zero - self.places[i]["clock_offset_ms"] / 1000 - self.zero
        self.open[i].update((index, (planned, prompt)) for index, planned, prompt in taken)
        for record in records:
            self.open[i].pop(record.index, None)
            self.recorded[i].add(record.index)
            self.sink.write(_shift(record, self.shifts[i] or 0.0))

    def lose(self, i: int, why: str) -> None:
        """A dead client's unfinished requests still get a record each, as errors (as a dead --workers process's
        do): those it reported taking, and with a finite plan the rest of its share (see the module docstring)."""
        now = time.time() - self.zero
        unfinished = dict(self.open[i])
        if self.plan.duration is None:
            share = owned(self.owner.make_plan(), len(self.actors), i, deque()).requests
            unfinished.update(
                (spec.index, (spec.arrival_time, spec.prompt_len))
                for spec in share
                if spec.index not in self.recorded[i]
            )
        for index, (planned, prompt) in sorted(unfinished.items()):
            self.sink.write(
                RequestRecord(
                    index=index,
                    intended_time=planned + (self.shifts[i] or 0.0),
                    send_time=now,
                    finish_time=now,
                    prompt_tokens=prompt,
                    status=ERROR,
                    error_kind=CLIENT_WORKER_DIED,
                    error=f"client {i} died before reporting this request: {why}",
                )
            )
        self.open[i].clear()

    def merged(self) -> TargetRun:
        """The run as one target's: the longest client's duration, the first live client's server info, and
        client_stats with one entry per client (its place, its start skew, its stats or its death)."""
        clients = [self._entry(i, place) for i, place in enumerate(self.places)]
        bottlenecks = [
            f"client {c['client']} ({c['host']}): {c.get('reason', '')}"
            for c in clients
            if c.get("client_may_be_bottleneck")
        ]
        dead = [f"client {c['client']} ({c['host']}) died: {c['died']}" for c in clients if "died" in c]
        stats: dict[str, Any] = {"clients": clients, "client_may_be_bottleneck": bool(bottlenecks or dead)}
        if bottlenecks or dead:
            stats["reason"] = "; ".join(dead + bottlenecks)
        ok = [r for r in self.results.values() if "died" not in r]
        return TargetRun(
            duration=max((r["duration"] for r in ok), default=time.time() - self.zero),
            interrupted=self.interrupted or any(r.get("interrupted") for r in ok),
            server_info=ok[0]["server_info"] if ok else {},
            client_stats=stats,
        )

    def _entry(self, i: int, place: ClientPlace) -> dict[str, Any]:
        """Client `i`'s client_stats entry: its place, its start skew, then its own stats, or why it died."""
        result: ClientResult = self.results.get(i, {"died": "interrupted"})
        shift = self.shifts[i]
        entry: dict[str, Any] = {**place, "start_skew_ms": None if shift is None else 1000 * shift}
        if "died" not in result:
            return {**entry, **result["client_stats"]}
        entry["died"] = result["died"]
        if "slots_reclaimed" in result:
            entry["slots_reclaimed"] = result["slots_reclaimed"]
        return entry
