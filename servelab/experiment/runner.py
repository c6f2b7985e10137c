"""One measured point: a Target runs a LoadPlan into a results directory.

Target-agnostic on purpose: `bench` passes an HttpTarget, `simulate` a
SimTarget, and both get the same files and the same summary. Records reach
disk the moment each request ends; the summary is written at the end,
including after Ctrl-C or SIGTERM, from whatever completed.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from servelab.metrics.host import HostWatch
from servelab.metrics.records import RecordSink, RequestRecord
from servelab.metrics.results import ResultWriter
from servelab.metrics.slo import SLO
from servelab.metrics.intervals import Tier, simulated_run_intervals
from servelab.metrics.summary import DEFAULT_PERCENTILES, statistics
from servelab.schemas.results import RunInfo, Summary
from servelab.targets.base import Target, TargetRun
from servelab.workload.spec import LoadPlan


class _Tee:
    """The results file first (it is the truth), then live observers such as a progress bar."""

    def __init__(self, sinks: Sequence[RecordSink]) -> None:
        self.sinks = sinks

    def write(self, record: RequestRecord) -> None:
        for sink in self.sinks:
            sink.write(record)


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM ends a run like Ctrl-C, so `kill` still leaves a summary behind.

    Targets with their own event loop (HttpTarget) replace this handler while
    they run and put it back afterwards; others get a KeyboardInterrupt.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def client_warnings(client_stats: dict[str, Any]) -> list[str]:
    """A loud line when the load generator itself may have capped the numbers."""
    if client_stats.get("client_may_be_bottleneck"):
        return [
            "THE CLIENT MAY BE THE BOTTLENECK: "
            f"{client_stats.get('reason', 'see client_stats')}; latencies and throughput understate the server"
        ]
    return []


OVERLOAD_SERVED_SHARE = 0.9
"""Served below this share of the offered rate, with a growing queue, is an overloaded run."""
OVERLOAD_TTFT_GROWTH = 2.0
"""Mean TTFT of the last third of the requests (by send time) over the first third's: a queue that grew through
the run. A server keeping up has a flat TTFT whatever its served rate (a short run's drain lowers that rate)."""


def overload_warnings(records: Sequence[RequestRecord], plan: LoadPlan, served: float | None) -> list[str]:
    """A loud line when an open loop offered more than was served and the queue grew through the run: latencies
    then measure the backlog, not the server at that rate."""
    arrival = plan.description.get("arrival") or {}  # a probe's hand-made plan describes none
    offered = arrival.get("request_rate")
    ttfts = [
        r.first_token_time - r.send_time
        for r in sorted(records, key=lambda r: r.send_time)
        if r.ok and r.first_token_time is not None
    ]
    if not isinstance(offered, (int, float)) or arrival.get("ramp") or served is None or len(ttfts) < 6:
        return []
    third = len(ttfts) // 3
    early, late = sum(ttfts[:third]) / third, sum(ttfts[-third:]) / third
    if served >= OVERLOAD_SERVED_SHARE * offered or late <= OVERLOAD_TTFT_GROWTH * early:
        return []
    return [
        f"OVERLOADED: {offered:g} req/s offered, {served:.3g} req/s served; the queue grew through the run "
        f"(mean TTFT {early * 1e3:,.0f} ms in the first third of the requests, {late * 1e3:,.0f} ms in the last), "
        "so the latencies measure the backlog: lower --request-rate below what is served"
    ]


def point_summary(
    records: Sequence[RequestRecord],
    target_run: TargetRun | None,
    plan: LoadPlan,
    slo: SLO | None,
    percentiles: Sequence[float],
    interrupted: bool,
) -> Summary:
    """`summarize` plus what the run itself knows: interruption, the client's overhead, warnings, and a simulated
    run's 80% intervals (servelab.metrics.intervals)."""
    # With warmup the measured span starts later than the run; summarize works it out from the records.
    duration = target_run.duration if target_run is not None and plan.warmup == 0 and target_run.duration > 0 else None
    summary = statistics(records, duration=duration, warmup=plan.warmup, slo=slo, percentiles=percentiles)
    client_stats = target_run.client_stats if target_run is not None else {}
    warnings = client_warnings(client_stats)
    if interrupted:
        warnings.append(f"run interrupted: statistics cover the {len(records)} requests that ended")
    warnings += overload_warnings(records, plan, summary.get("request_throughput"))
    info = target_run.server_info if target_run is not None else {}
    if info.get("simulated") and summary["completed"]:
        counted = [r for r in records if r.send_time >= plan.warmup]
        tier = Tier(info["prediction_tier"])
        summary.update(simulated_run_intervals(counted, plan.max_concurrency, summary, tier, client_stats))
    summary.update(
        requests_recorded=len(records),
        warmup=plan.warmup,
        interrupted=interrupted,
        client_stats=client_stats,
        warnings=warnings,
    )
    return Summary.model_validate(summary)


def run_point(
    target: Target,
    plan: LoadPlan,
    result_dir: Path,
    run_info: RunInfo,
    slo: SLO | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    observers: Sequence[RecordSink] = (),
) -> Summary:
    """Run the plan, write run.json / records.jsonl / timeline.jsonl / summary.json, return the summary.

    run.json's `client_host` is what the machine running servelab was doing
    meanwhile (load, CPU steal, local GPUs' clocks): for a server on the same
    host, the conditions it ran under, which a calibration profile compares.

    An interruption is not an error: the summary says `interrupted: true`
    and the caller decides the exit code. Any other failure propagates after
    run.json has recorded it.
    """
    writer = ResultWriter(result_dir, run_info.with_keys(workload=plan.description))
    sink = _Tee([writer.records, *observers])
    target_run: TargetRun | None = None
    interrupted = False
    host = HostWatch().start()
    try:
        with sigterm_as_interrupt():
            target_run = target.run(plan, sink, writer.write_sample)
        interrupted = target_run.interrupted
    except KeyboardInterrupt:
        interrupted = True
    except BaseException as exc:
        writer.update_run_info(error=f"{type(exc).__name__}: {exc}", finished_at=time.time())
        writer.close()
        raise
    try:
        summary = point_summary(writer.records.records, target_run, plan, slo, percentiles, interrupted)
        writer.update_run_info(
            server_info=target_run.server_info if target_run is not None else {},
            interrupted=interrupted,
            finished_at=time.time(),
            client_host=host.conditions(gpus=True),
        )
        writer.write_summary(summary)
    finally:
        writer.close()
    return summary
