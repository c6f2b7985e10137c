"""The server's view of a run: samples of engine metrics against run time.

Sample values are keyed by vLLM's own Prometheus names so that a scraped
timeline and a simulated one are the same data. Counters are cumulative
(as scraped); gauges are instantaneous.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
PREEMPTIONS = "vllm:num_preemptions_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
ITERATION_TOKENS_SUM = "vllm:iteration_tokens_total_sum"
ITERATION_TOKENS_COUNT = "vllm:iteration_tokens_total_count"
TTFT_SUM = "vllm:time_to_first_token_seconds_sum"
TTFT_COUNT = "vllm:time_to_first_token_seconds_count"
PREFILL_TIME_SUM = "vllm:request_prefill_time_seconds_sum"
PREFILL_TIME_COUNT = "vllm:request_prefill_time_seconds_count"
"""The engine's own time from first scheduling a request to its first token (engine time, no client or frontend)."""
FLOPS = "vllm:estimated_flops_per_gpu_total"
READ_BYTES = "vllm:estimated_read_bytes_per_gpu_total"

GAUGES = (RUNNING, WAITING, KV_USAGE)
COUNTERS = (
    PREEMPTIONS,
    PREFIX_QUERIES,
    PREFIX_HITS,
    PROMPT_TOKENS,
    GENERATION_TOKENS,
    ITERATION_TOKENS_SUM,
    ITERATION_TOKENS_COUNT,
    TTFT_SUM,
    TTFT_COUNT,
    PREFILL_TIME_SUM,
    PREFILL_TIME_COUNT,
    FLOPS,
    READ_BYTES,
)
TRACKED = GAUGES + COUNTERS


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
