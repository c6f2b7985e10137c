"""The interface every source of records implements.

A Target takes a LoadPlan and emits one RequestRecord per request released
(including failed ones) into a sink, plus timeline samples. It returns
what it learned about the server. Everything downstream is source-agnostic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from servelab.metrics.records import RecordSink
from servelab.metrics.timeline import TimelineSample
from servelab.workload.spec import LoadPlan

SampleSink = Callable[[TimelineSample], None]


@dataclass
class TargetRun:
    """What a target reports after a run, besides the records."""

    duration: float
    """Seconds from the first send to the last finish (or to interruption)."""
    interrupted: bool = False
    server_info: dict[str, Any] = field(default_factory=dict)
    client_stats: dict[str, Any] = field(default_factory=dict)
    """The load generator's own overhead: schedule lag, loop lag, CPU share."""


class Slots(Protocol):
    """A concurrency cap: `acquire` waits for a free slot and says when it became free (run time, the intended send
    time of the request that takes it); `release` gives one back at a request's finish time, whatever its end.

    One event loop's own cap is a local queue (http.py); `bench --clients N` shares one cap between all clients
    through a Ray actor (servelab/cluster/slot_broker.py)."""

    async def acquire(self) -> float: ...

    def release(self, free_at: float) -> None: ...


class Target(Protocol):
    def run(self, plan: LoadPlan, sink: RecordSink, on_sample: SampleSink | None = None) -> TargetRun: ...
