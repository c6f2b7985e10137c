"""The numbers a diagnosis rests on, read off one run whatever its source.

Everything here is derived from a results directory (records, timeline,
run.json) so a real `bench` run and a simulated one are judged by the same
code. Fields are None when the run did not carry the data (for example a
server without /metrics).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict, TypeVar

import numpy as np
from pydantic import BaseModel, ValidationError

from servelab.diagnose.outside_engine import outside_engine
from servelab.errors import InputError
from servelab.metrics import timeline as tl
from servelab.metrics.records import RequestRecord
from servelab.metrics.results import RunResult
from servelab.metrics.server_timings import ttft_split
from servelab.metrics.summary import summarize
from servelab.metrics.timeline import TimelineSample, counter_delta
from servelab.schemas.diagnosis import Evidence
from servelab.schemas.results import ArrivalInfo, ClientStats, DatasetInfo

Part = TypeVar("Part", bound=BaseModel)


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


def mean_chunks(ok: list[RequestRecord]) -> float | None:
    """Streamed chunks with output per request, over the requests whose chunks were recorded (None: none were)."""
    counts = [len(r.chunk_times) for r in ok if r.chunk_times]
    return float(np.mean(counts)) if counts else None


def _loaded_window(samples: list[TimelineSample]) -> list[TimelineSample]:
    """Samples while the server had work: idle head and tail would dilute every average."""
    busy = [i for i, s in enumerate(samples) if s.values.get(tl.RUNNING, 0) + s.values.get(tl.WAITING, 0) > 0]
    return samples[busy[0] : busy[-1] + 1] if busy else samples


def typed_part(model: type[Part], data: object, run: RunResult, where: str) -> Part:
    """A part of a results directory's files read as its model; InputError naming the directory, the part and the
    first field the model refuses (a hand-edited or foreign file), before any simulation."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InputError(
            f"{where} of {run.directory} is not one this servelab reads: {first['loc']}: {first['msg']}"
        ) from exc


def arrival_of(run: RunResult) -> ArrivalInfo:
    """The arrival process of a run, from run.json's workload description (a plan that does not say: all unset)."""
    plan = run.run_info.workload
    return plan.arrival if plan is not None and plan.arrival is not None else ArrivalInfo()


@dataclass(frozen=True)
class WorkloadWords:
    """What run.json's plan says about the prompts that a replay of the run needs."""

    dataset_name: str | None
    prefix_len: int
    """Tokens of the shared prefix before each prompt (0: none)."""
    system_prompt_len: int
    system_prompts: int
    """How many system prompts a multiturn run's conversations drew from."""


def workload_of(run: RunResult) -> WorkloadWords:
    """The prompts' description: bench/simulate nest it under run.json's workload description; a plan that does not
    say leaves each word empty."""
    plan = run.run_info.workload
    described = plan.workload if plan is not None and plan.workload is not None else DatasetInfo()
    return WorkloadWords(
        described.dataset_name,
        described.prefix_len or 0,
        described.system_prompt_len or 0,
        described.system_prompts or 0,
    )


def client_stats_of(run: RunResult) -> ClientStats:
    """The load generator's self-measurement: in summary.json for bench runs, in run.json for others."""
    given = (run.summary or {}).get("client_stats") or _run_json_extra(run, "client_stats") or {}
    return typed_part(ClientStats, given, run, "the client_stats")


def _run_json_extra(run: RunResult, key: str) -> Any:
    """A key of run.json that RunInfo does not name (a verb's own: tune's client_stats, a what-if's engine_busy_s)."""
    return (run.run_info.model_extra or {}).get(key)


def gather(run: RunResult, warmup: float = 0.0) -> Evidence:
    """The run's evidence; InputError when no request completed (no latency was measured: nothing to diagnose)."""
    records = [r for r in run.records if r.send_time >= warmup]
    summary = summarize(records)
    if not summary.completed:
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(summary.errors_by_kind.items())) or "none sent"
        raise InputError(
            f"no request completed in this run ({kinds}): there is no latency or throughput to diagnose; "
            "fix what the errors say and measure again"
        )
    ok = [r for r in records if r.ok]
    arrival = arrival_of(run)
    rate = arrival.request_rate
    # The whole run's records: the server's histograms count every request, warm-up included.
    split = ttft_split(run.records, run.timeline)
    stats = client_stats_of(run)
    # Each engine's busy seconds: simulate's summary.json, or a what-if's run.json (it has no summary).
    busy_s = stats.engine_busy_s or _run_json_extra(run, "engine_busy_s")
    return Evidence(
        completed=summary.completed,
        failed=summary.failed,
        duration_s=summary.duration,
        request_rate=summary.request_throughput,
        offered_rate=float(rate) if rate not in (None, "inf") and float(rate) != float("inf") else None,
        max_concurrency=arrival.max_concurrency,
        mean_input_tokens=float(np.mean([r.prompt_tokens for r in ok])) if ok else 0.0,
        mean_output_tokens=float(np.mean([r.output_tokens for r in ok])) if ok else 0.0,
        mean_chunks=mean_chunks(ok),
        mean_in_flight=mean_in_flight(records),
        output_throughput=summary.output_throughput,
        mean_ttft_ms=float(summary.statistic("mean_ttft_ms")),
        median_ttft_ms=float(summary.statistic("median_ttft_ms")),
        p99_ttft_ms=float(summary.statistic("p99_ttft_ms")),
        median_tpot_ms=summary.statistic("median_tpot_ms"),
        p99_tpot_ms=summary.statistic("p99_tpot_ms"),
        p99_itl_ms=summary.statistic("p99_itl_ms"),
        median_e2el_ms=float(summary.statistic("median_e2el_ms")),
        **_queue_gauges(_loaded_window(run.timeline)),
        **_server_counters(run.timeline),
        engine_busy=_busy(busy_s, summary.duration),
        ttft_split=split,
        outside_engine=outside_engine(run.records, split),
        **_client_verdict(stats),
        source=run.run_info.source,
    )


class _QueueGauges(TypedDict):
    mean_running: float | None
    max_running: float | None
    mean_waiting: float | None
    max_waiting: float | None
    frac_waiting: float | None
    max_kv_usage: float | None
    mean_kv_usage: float | None


def _queue_gauges(samples: list[TimelineSample]) -> _QueueGauges:
    """What the server held while loaded: requests running and waiting, and its KV cache's fill (None: not
    scraped, e.g. a server without /metrics)."""
    running, waiting, kv = (_gauge(samples, n) for n in (tl.RUNNING, tl.WAITING, tl.KV_USAGE))
    return _QueueGauges(
        mean_running=float(running.mean()) if running.size else None,
        max_running=float(running.max()) if running.size else None,
        mean_waiting=float(waiting.mean()) if waiting.size else None,
        max_waiting=float(waiting.max()) if waiting.size else None,
        frac_waiting=float((waiting > 0).mean()) if waiting.size else None,
        max_kv_usage=float(kv.max()) if kv.size else None,
        mean_kv_usage=float(kv.mean()) if kv.size else None,
    )


class _ServerCounters(TypedDict):
    preemptions: float | None
    prefix_hit_rate: float | None
    mean_server_ttft_ms: float | None
    mean_iteration_tokens: float | None
    achieved_flops: float | None
    achieved_read_bandwidth: float | None
    steps_per_s: float | None


def _server_counters(timeline: list[TimelineSample]) -> _ServerCounters:
    """The server's own counters over the run: preemptions and prefix-cache hits over the whole timeline, rates
    (FLOP/s, bytes read, steps) over its loaded window, where idle head and tail would dilute them."""

    def per(num: str, den: str) -> float | None:
        return _ratio(counter_delta(timeline, num), counter_delta(timeline, den))

    loaded = _loaded_window(timeline)
    return _ServerCounters(
        preemptions=counter_delta(timeline, tl.PREEMPTIONS),
        prefix_hit_rate=per(tl.PREFIX_HITS, tl.PREFIX_QUERIES),
        mean_server_ttft_ms=_ms(per(tl.TTFT_SUM, tl.TTFT_COUNT)),
        mean_iteration_tokens=per(tl.ITERATION_TOKENS_SUM, tl.ITERATION_TOKENS_COUNT),
        achieved_flops=_rate(loaded, tl.FLOPS),
        achieved_read_bandwidth=_rate(loaded, tl.READ_BYTES),
        steps_per_s=_rate(loaded, tl.ITERATION_TOKENS_COUNT),
    )


class _ClientVerdict(TypedDict):
    client_may_be_bottleneck: bool
    client_reason: str | None
    client_added_delay_ms: float | None


def _client_verdict(client: ClientStats) -> _ClientVerdict:
    """The load generator's verdict on itself: whether its own delays distort the figures, and by how much."""
    return _ClientVerdict(
        client_may_be_bottleneck=bool(client.client_may_be_bottleneck),
        client_reason=client.reason,
        client_added_delay_ms=client.added_delay.mean_ms if client.added_delay else None,
    )


def _busy(busy: list[float] | None, duration: float) -> float | None:
    """The engines' mean busy share of the run (a simulated run records each engine's busy seconds)."""
    if not busy or duration <= 0:
        return None
    return min(1.0, sum(busy) / (len(busy) * duration))


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3
