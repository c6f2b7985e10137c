"""One concurrency cap shared by every client of `bench --clients N`: the slots live in one async Ray actor.

A client asks the broker for a slot before it sends a request and tells it when the request ends (success,
error, abandonment, cancellation: every record), so a slot freed on any client can be taken by any other, and
the requests in flight across all clients never exceed the cap. Each slot carries the time it became free, on
the driver's time line, because that time is the intended send time of the closed-loop request that takes it
(the client converts it through its own clock offset, as it does its records).

Slots are leased by client id: the broker knows how many each client holds, so when the driver sees a client
dead it calls `leave` and that client's slots go back to the others (and anything it says later is ignored).
A client's `acquire` carries a ticket: a client that stops waiting (the run's end, an interrupt) withdraws it,
and the broker returns the slot if it had granted it already, so no slot is lost to a waiter that left.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any

from servelab.targets.client_stats import ms_stats
from servelab.targets.errors import TargetError

Ticket = tuple[int, int]
"""(client, that client's acquire number)."""


class SlotBroker:
    """The shared slots (an async Ray actor: its methods interleave on one event loop, so no locks are needed)."""

    def __init__(self, cap: int) -> None:
        self.free: deque[float] = deque([0.0] * cap)
        """Free slots, each the driver-time at which it became free (0: the common start)."""
        self.waiting: dict[Ticket, asyncio.Future[float]] = {}
        """Clients waiting for a slot, first come first served (a dict keeps insertion order)."""
        self.granted: dict[Ticket, float] = {}
        self.held: Counter[int] = Counter()
        self.gone: set[int] = set()
        self.withdrawn: set[Ticket] = set()
        """Tickets withdrawn before their acquire arrived (the two calls may interleave)."""

    async def ready(self) -> None:
        """Nothing: a client's first call to an actor resolves where it lives (tens of ms), so each makes this one
        before its clock starts rather than charge it to its first request."""

    async def acquire(self, client: int, ticket: int) -> tuple[float, float] | None:
        """A slot for `client`: (when it became free, seconds spent waiting here for it); None if the client left
        or withdrew this ticket. The caller subtracts the wait from its own timing: what is left is the round trip."""
        key = (client, ticket)
        if client in self.gone or key in self.withdrawn:
            self.withdrawn.discard(key)
            return None
        start = time.perf_counter()
        if self.free:
            self._grant(key, self.free.popleft())
        else:
            future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
            self.waiting[key] = future
            await future
        if key not in self.granted:  # the client left while it waited
            return None
        return self.granted[key], time.perf_counter() - start

    async def release(self, client: int, free_at: float) -> None:
        """One of `client`'s requests ended at driver-time `free_at`: its slot goes to the next waiter."""
        self._give_back(client, free_at)

    async def withdraw(self, client: int, ticket: int) -> None:
        """`client` stopped waiting for this ticket: forget it, or take back the slot it was granted meanwhile."""
        key = (client, ticket)
        future = self.waiting.pop(key, None)
        if future is not None:
            future.set_result(0.0)
        elif key in self.granted:
            self._give_back(client, self.granted[key])
        else:
            self.withdrawn.add(key)

    async def leave(self, client: int, free_at: float) -> int:
        """`client` is done (its run ended, or the driver saw it die): its slots go back, its waits end; returns how
        many slots it still held."""
        self.gone.add(client)
        for key in [k for k in self.waiting if k[0] == client]:
            self.waiting.pop(key).set_result(0.0)
        held = self.held.pop(client, 0)
        for _ in range(held):
            self._put(free_at)
        return held

    def _give_back(self, client: int, free_at: float) -> None:
        if client in self.gone or not self.held[client]:  # a dead client's slots went back when it left
            return
        self.held[client] -= 1
        self._put(free_at)

    def _grant(self, key: Ticket, free_at: float) -> None:
        self.granted[key] = free_at
        self.held[key[0]] += 1

    def _put(self, free_at: float) -> None:
        if self.waiting:
            key = next(iter(self.waiting))
            future = self.waiting.pop(key)
            self._grant(key, free_at)
            future.set_result(free_at)
        else:
            self.free.append(free_at)


class SharedSlots:
    """A client's side of the shared cap (`servelab.targets.base.Slots`): asks the broker, converting slot times
    between this client's run time and the driver's time line, and times each round trip.

    A slot this client frees while one of its own requests waits for a slot goes straight to that request: the
    broker still counts it as this client's, so the cap holds, and the request is spared a round trip (the wait
    it had already sent is withdrawn). Only a slot nobody here waits for goes back to the broker, where any client
    can take it: no slot stays idle while a client has a request waiting (benchmarks/slot_broker_cost.py).

    `shift` is this client's run time 0 on the driver's time line (its run zero on its wall clock, minus its clock
    offset to the driver, minus the driver's common start): known once the client's clock has started.
    """

    def __init__(self, broker: Any, me: int, shift: Callable[[], float]) -> None:
        self.broker = broker
        self.me = me
        self.shift = shift
        self.tickets = itertools.count()
        self.waiting: deque[asyncio.Future[float]] = deque()
        """This client's requests waiting for a slot, first come first served: a slot freed here goes to them."""
        self.round_trips: list[float] = []
        """Seconds each slot from the broker took beyond its wait for a free one: what asking it costs."""
        self.kept = 0
        """Slots passed from a finished request of this client to a waiting one, without the broker."""

    async def acquire(self) -> float:
        ticket = next(self.tickets)
        asked = time.perf_counter()
        here: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.waiting.append(here)
        there = asyncio.ensure_future(self._ask(ticket))
        there.add_done_callback(_consume)
        try:
            await asyncio.wait((here, there), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the request no longer wants a slot: neither one it was given is lost
            self._drop_here(here)
            self._drop_there(there, ticket)
            raise
        if not there.done():  # a slot freed here came first (release() took `here` off the waiting list)
            self._drop_there(there, ticket)
            self.kept += 1
            return here.result()
        self._drop_here(here)
        free_at, waited = there.result()
        self.round_trips.append(time.perf_counter() - asked - waited)
        return free_at - self.shift()

    async def _ask(self, ticket: int) -> tuple[float, float]:
        import ray

        try:
            answer = await self.broker.acquire.remote(self.me, ticket)
        except ray.exceptions.RayError as exc:
            raise TargetError(f"the slot broker was lost: {type(exc).__name__}") from None
        if answer is None:
            raise TargetError(f"the slot broker no longer serves client {self.me}")
        free_at, waited = answer
        return float(free_at), float(waited)

    def _drop_here(self, here: asyncio.Future[float]) -> None:
        """A wait is over without using a local slot: stop offering it one, or pass on the one it got."""
        if here in self.waiting:
            self.waiting.remove(here)
        elif here.done() and not here.cancelled():
            self.release(here.result())

    def _drop_there(self, there: asyncio.Future[tuple[float, float]], ticket: int) -> None:
        """A wait is over without the broker's slot: withdraw it, or pass it on if it came."""
        if not there.done():
            self.broker.withdraw.remote(self.me, ticket)
        elif not there.cancelled() and there.exception() is None:
            self.release(there.result()[0] - self.shift())

    def release(self, free_at: float) -> None:
        if self.waiting:
            self.waiting.popleft().set_result(free_at)
        else:
            self.broker.release.remote(self.me, free_at + self.shift())

    def leave(self, now: float) -> None:
        """The client's run is over (at its run time `now`): whatever it still holds goes back to the others."""
        self.broker.leave.remote(self.me, now + self.shift())

    def stats(self) -> dict[str, float | int | None]:
        """The broker's cost to this client: slots from it and their round trips (ms: the send lag each added), and
        slots passed on here without one."""
        return {"acquires": len(self.round_trips), "kept": self.kept, **ms_stats("round_trip", self.round_trips)}


def _consume(future: asyncio.Future[Any]) -> None:
    """A broker answer nobody awaits any more (withdrawn): read its error, so asyncio does not log it as lost."""
    if not future.cancelled():
        future.exception()
