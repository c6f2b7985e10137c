"""What one event loop learned about itself while it ran requests, mergeable across worker processes.

The records say what the server did; the tally says whether the client kept
up while they were measured. Each process keeps its own and the parent adds
them, so the self-report covers every loop that timed a request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

from servelab.metrics.records import RequestRecord
from servelab.workload.spec import RequestSpec


@dataclass
class RunTally:
    schedule_lags: list[float] = field(default_factory=list)
    """Send time minus intended send time of every released request."""
    loop_lags: list[float] = field(default_factory=list)
    cpu_s: float = 0.0
    wall_s: float = 0.0
    first_send: float = float("inf")
    last_finish: float = float("-inf")
    interrupted: bool = False
    plan_error: str | None = None
    processes: int = 1
    notes: dict[str, Any] = field(default_factory=dict)
    """Extra client_stats entries (worker count, worker faults)."""

    def add(self, rec: RequestRecord) -> None:
        self.schedule_lags.append(rec.send_time - rec.intended_time)
        self.first_send = min(self.first_send, rec.send_time)
        self.last_finish = max(self.last_finish, rec.finish_time)

    def merge(self, other: RunTally) -> None:
        """Add another process's tally: lags pooled, CPU summed, the run's span widened."""
        self.schedule_lags += other.schedule_lags
        self.loop_lags += other.loop_lags
        self.cpu_s += other.cpu_s
        self.wall_s = max(self.wall_s, other.wall_s)
        self.first_send = min(self.first_send, other.first_send)
        self.last_finish = max(self.last_finish, other.last_finish)
        self.interrupted = self.interrupted or other.interrupted
        self.plan_error = self.plan_error or other.plan_error


async def aiter_specs(specs: Iterable[RequestSpec]) -> AsyncIterator[RequestSpec]:
    """A plan's (possibly lazy) request iterator as the async source the release loop reads."""
    for spec in specs:
        yield spec
