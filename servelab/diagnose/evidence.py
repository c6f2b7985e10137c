"""The numbers a diagnosis rests on, read off one run whatever its source.

Everything here is derived from a results directory (records, timeline,
run.json) so a real `bench` run and a simulated one are judged by the same
code. Fields are None when the run did not carry the data (for example a
server without /metrics).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from servelab.diagnose.outside_engine import outside_engine
from servelab.errors import InputError
from servelab.metrics import timeline as tl
from servelab.metrics.records import RequestRecord
from servelab.metrics.results import RunResult
from servelab.metrics.server_timings import ttft_split
from servelab.metrics.summary import summarize
from servelab.metrics.timeline import TimelineSample, counter_delta
from servelab.schemas.diagnosis import Evidence


def _gauge(samples: list[TimelineSample], name: str) -> np.ndarray:
    return np.asarray([s.values[name] for s in samples if name in s.values], dtype=float)


def _rate(samples: list[TimelineSample], name: str) -> float | None:
    seen = [(s.t, s.values[name]) for s in samples if name in s.values]
    if len(seen) < 2 or seen[-1][0] <= seen[0][0]:
        return None
    return (seen[-1][1] - seen[0][1]) / (seen[-1][0] - seen[0][0])


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or not den else num / den


def mean_in_flight(records: list[RequestRecord]) -> float:
    """Time-averaged number of requests outstanding at the client (Little's law, measured)."""
    if not records:
        return 0.0
    start = min(r.send_time for r in records)
    end = max(r.finish_time for r in records)
    busy = sum(r.finish_time - r.send_time for r in records)
    return busy / (end - start) if end > start else float(len(records))


def _loaded_window(samples: list[TimelineSample]) -> list[TimelineSample]:
    """Samples while the server had work: idle head and tail would dilute every average."""
    busy = [i for i, s in enumerate(samples) if s.values.get(tl.RUNNING, 0) + s.values.get(tl.WAITING, 0) > 0]
    return samples[busy[0] : busy[-1] + 1] if busy else samples


def arrival_of(run: RunResult) -> dict[str, Any]:
    """The arrival process of a run: bench/simulate nest it under run.json's workload description."""
    described = (run.run_info.get("workload") or {}).get("arrival")
    return described or run.run_info.get("arrival") or {}


def workload_of(run: RunResult) -> dict[str, Any]:
    workload = run.run_info.get("workload") or {}
    return workload.get("workload", workload)


def client_stats_of(run: RunResult) -> dict[str, Any]:
    """The load generator's self-measurement: in summary.json for bench runs, in run.json for others."""
    return (run.summary or {}).get("client_stats") or run.run_info.get("client_stats") or {}


def gather(run: RunResult, warmup: float = 0.0) -> Evidence:
    """The run's evidence; InputError when no request completed (no latency was measured: nothing to diagnose)."""
    records = [r for r in run.records if r.send_time >= warmup]
    summary = summarize(records).model_dump(exclude_unset=True)
    if not summary["completed"]:
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(summary["errors_by_kind"].items())) or "none sent"
        raise InputError(
            f"no request completed in this run ({kinds}): there is no latency or throughput to diagnose; "
            "fix what the errors say and measure again"
        )
    ok = [r for r in records if r.ok]
    arrival = arrival_of(run)
    rate = arrival.get("request_rate")
    samples = _loaded_window(run.timeline)
    running, waiting, kv = (_gauge(samples, n) for n in (tl.RUNNING, tl.WAITING, tl.KV_USAGE))
    client = client_stats_of(run)
    # The whole run's records: the server's histograms count every request, warm-up included.
    split = ttft_split(run.records, run.timeline)
    return Evidence(
        completed=int(summary["completed"]),
        failed=int(summary["failed"]),
        duration_s=float(summary["duration"]),
        request_rate=float(summary["request_throughput"]),
        offered_rate=float(rate) if rate not in (None, "inf") and float(rate) != float("inf") else None,
        max_concurrency=arrival.get("max_concurrency"),
        mean_input_tokens=float(np.mean([r.prompt_tokens for r in ok])) if ok else 0.0,
        mean_output_tokens=float(np.mean([r.output_tokens for r in ok])) if ok else 0.0,
        mean_in_flight=mean_in_flight(records),
        output_throughput=float(summary["output_throughput"]),
        mean_ttft_ms=float(summary["mean_ttft_ms"]),
        median_ttft_ms=float(summary["median_ttft_ms"]),
        p99_ttft_ms=float(summary["p99_ttft_ms"]),
        median_tpot_ms=summary["median_tpot_ms"],
        p99_tpot_ms=summary["p99_tpot_ms"],
        p99_itl_ms=summary["p99_itl_ms"],
        median_e2el_ms=float(summary["median_e2el_ms"]),
        mean_running=float(running.mean()) if running.size else None,
        max_running=float(running.max()) if running.size else None,
        mean_waiting=float(waiting.mean()) if waiting.size else None,
        max_waiting=float(waiting.max()) if waiting.size else None,
        frac_waiting=float((waiting > 0).mean()) if waiting.size else None,
        max_kv_usage=float(kv.max()) if kv.size else None,
        mean_kv_usage=float(kv.mean()) if kv.size else None,
        preemptions=counter_delta(run.timeline, tl.PREEMPTIONS),
        prefix_hit_rate=_ratio(
            counter_delta(run.timeline, tl.PREFIX_HITS), counter_delta(run.timeline, tl.PREFIX_QUERIES)
        ),
        mean_server_ttft_ms=_ms(
            _ratio(counter_delta(run.timeline, tl.TTFT_SUM), counter_delta(run.timeline, tl.TTFT_COUNT))
        ),
        mean_iteration_tokens=_ratio(
            counter_delta(run.timeline, tl.ITERATION_TOKENS_SUM), counter_delta(run.timeline, tl.ITERATION_TOKENS_COUNT)
        ),
        achieved_flops=_rate(samples, tl.FLOPS),
        achieved_read_bandwidth=_rate(samples, tl.READ_BYTES),
        steps_per_s=_rate(samples, tl.ITERATION_TOKENS_COUNT),
        engine_busy=_busy(run.run_info, float(summary["duration"])),
        ttft_split=split,
        outside_engine=outside_engine(run.records, split),
        client_may_be_bottleneck=bool(client.get("client_may_be_bottleneck", False)),
        client_reason=client.get("reason"),
        client_added_delay_ms=(client.get("added_delay") or {}).get("mean_ms"),
        source=run.run_info.get("source"),
    )


def _busy(run_info: dict[str, Any], duration: float) -> float | None:
    busy = run_info.get("engine_busy_s")
    if not busy or duration <= 0:
        return None
    return min(1.0, sum(busy) / (len(busy) * duration))


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3
