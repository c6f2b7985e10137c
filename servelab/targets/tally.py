"""What one event loop learned about itself while it ran requests, mergeable across worker processes.

The records say what the server did; the tally says whether the client kept
up while they were measured. Each process keeps its own and the parent adds
them, so the self-report covers every loop that timed a request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np

from servelab.metrics.records import RequestRecord
from servelab.targets.client_stats import client_stats
from servelab.workload.spec import RequestSpec


class RunNotes(TypedDict, total=False):
    """What a run adds to client_stats beside its overhead: the --workers processes (their number, the coordinator's
    CPU, their faults) and why release stopped early (`server_gone`: the server refused connections)."""

    workers: int
    coordinator_cpu_s: float
    worker_faults: list[str]
    server_gone: str


@dataclass
class RunTally:
    schedule_lags: list[float] = field(default_factory=list)
    """Send time minus intended send time of every released request."""
    intended: list[float] = field(default_factory=list)
    """Intended send time of every released request (same order): finds the start-up wave."""
    loop_lags: list[float] = field(default_factory=list)
    """How long each delay-probe read waited for the event loop."""
    loop_at: list[float] = field(default_factory=list)
    """Run time each probe was written."""
    loop_weights: list[int] = field(default_factory=list)
    """Requests in flight when each probe was read."""
    gaps: list[float] = field(default_factory=list)
    """Each successful streamed request's mean inter-chunk gap: what a client-added delay is compared with."""
    ttfts: list[float] = field(default_factory=list)
    lifetimes: list[float] = field(default_factory=list)
    """Each successful request's send-to-finish time: what its send lag is compared with."""
    cpu_s: float = 0.0
    wall_s: float = 0.0
    first_send: float = float("inf")
    last_finish: float = float("-inf")
    interrupted: bool = False
    plan_error: str | None = None
    processes: int = 1
    notes: RunNotes = field(default_factory=lambda: RunNotes())
    """Extra client_stats entries (worker count, worker faults)."""

    def add(self, rec: RequestRecord) -> None:
        self.schedule_lags.append(rec.send_time - rec.intended_time)
        self.intended.append(rec.intended_time)
        if rec.ok:
            self.lifetimes.append(rec.e2el)
            if rec.ttft is not None:
                self.ttfts.append(rec.ttft)
            if len(rec.chunk_times) > 1:
                self.gaps.append((rec.chunk_times[-1] - rec.chunk_times[0]) / (len(rec.chunk_times) - 1))
        self.first_send = min(self.first_send, rec.send_time)
        self.last_finish = max(self.last_finish, rec.finish_time)

    def merge(self, other: RunTally) -> None:
        """Add another process's tally: lags pooled, CPU summed, the run's span widened."""
        self.schedule_lags += other.schedule_lags
        self.intended += other.intended
        self.loop_lags += other.loop_lags
        self.loop_at += other.loop_at
        self.loop_weights += other.loop_weights
        self.gaps += other.gaps
        self.ttfts += other.ttfts
        self.lifetimes += other.lifetimes
        self.cpu_s += other.cpu_s
        self.wall_s = max(self.wall_s, other.wall_s)
        self.first_send = min(self.first_send, other.first_send)
        self.last_finish = max(self.last_finish, other.last_finish)
        self.interrupted = self.interrupted or other.interrupted
        self.plan_error = self.plan_error or other.plan_error

    def client_stats(self) -> dict[str, object]:
        """The self-report (servelab/targets/client_stats.py), judged against this run's own latencies."""
        typical = np.median(self.gaps) if self.gaps else (np.median(self.ttfts) if self.ttfts else None)
        return client_stats(
            self.schedule_lags,
            self.loop_lags,
            self.cpu_s,
            self.wall_s,
            self.processes,
            intended_s=self.intended,
            loop_at_s=self.loop_at,
            loop_weights=self.loop_weights,
            typical_gap_ms=None if typical is None else float(typical) * 1e3,
            mean_lifetime_ms=float(np.mean(self.lifetimes)) * 1e3 if self.lifetimes else None,
        )


async def aiter_specs(specs: Iterable[RequestSpec]) -> AsyncIterator[RequestSpec]:
    """A plan's (possibly lazy) request iterator as the async source the release loop reads."""
    for spec in specs:
        yield spec
