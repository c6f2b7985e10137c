"""The server's view of a run: samples of engine metrics against run time.

Sample values are keyed by vLLM's own Prometheus names (servelab/sim/vllm_metrics.py)
so that a scraped timeline and a simulated one are the same data. Counters are cumulative
(as scraped); gauges are instantaneous.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from servelab.sim.vllm_metrics import (  # re-exported: readers of a timeline name metrics through this module
    COUNTERS,
    DECODE_TIME_COUNT,
    DECODE_TIME_SUM,
    E2E_COUNT,
    E2E_SUM,
    FLOPS,
    GAUGES,
    GENERATION_TOKENS,
    ITERATION_TOKENS_COUNT,
    ITERATION_TOKENS_SUM,
    KV_USAGE,
    PREEMPTIONS,
    PREFILL_TIME_COUNT,
    PREFILL_TIME_SUM,
    PREFIX_HITS,
    PREFIX_QUERIES,
    PROMPT_TOKENS,
    QUEUE_TIME_COUNT,
    QUEUE_TIME_SUM,
    READ_BYTES,
    RUNNING,
    TRACKED,
    TTFT_COUNT,
    TTFT_SUM,
    WAITING,
)

__all__ = [  # the re-exported metric names, and this module's own
    "COUNTERS",
    "DECODE_TIME_COUNT",
    "DECODE_TIME_SUM",
    "E2E_COUNT",
    "E2E_SUM",
    "FLOPS",
    "GAUGES",
    "GENERATION_TOKENS",
    "ITERATION_TOKENS_COUNT",
    "ITERATION_TOKENS_SUM",
    "KV_USAGE",
    "PREEMPTIONS",
    "PREFILL_TIME_COUNT",
    "PREFILL_TIME_SUM",
    "PREFIX_HITS",
    "PREFIX_QUERIES",
    "PROMPT_TOKENS",
    "QUEUE_TIME_COUNT",
    "QUEUE_TIME_SUM",
    "READ_BYTES",
    "RUNNING",
    "TRACKED",
    "TTFT_COUNT",
    "TTFT_SUM",
    "WAITING",
    "TimelineSample",
    "counter_delta",
    "gauge_max",
    "read_timeline",
]


@dataclass(slots=True)
class TimelineSample:
    t: float
    """Seconds from the start of the run."""
    values: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"t": self.t, "values": self.values}, separators=(",", ":"))


def read_timeline(path: Path) -> Iterator[TimelineSample]:
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                data = json.loads(line)
                yield TimelineSample(t=data["t"], values=data["values"])


def counter_delta(samples: list[TimelineSample], name: str) -> float | None:
    """Increase of a cumulative counter over the run (None when never scraped)."""
    seen = [s.values[name] for s in samples if name in s.values]
    return (seen[-1] - seen[0]) if seen else None


def gauge_max(samples: list[TimelineSample], name: str) -> float | None:
    seen = [s.values[name] for s in samples if name in s.values]
    return max(seen) if seen else None
