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


class Target(Protocol):
    def run(self, plan: LoadPlan, sink: RecordSink, on_sample: SampleSink | None = None) -> TargetRun: ...
