"""`--sweep auto`: find the load range by itself, as GuideLLM's sweep does, and say where the server stops keeping up.

Three stages, each a point with its own results directory:
1. `synchronous`: one request at a time (max-concurrency 1): the rate of an idle server, and its best latency;
2. `throughput`: everything at once (or at the user's --max-concurrency): the most the server can serve;
3. `request-rate=R`: open loops at rates evenly spaced strictly between the two.

A rate point stops releasing requests once the server is over-saturated
(servelab/experiment/saturation.py), so a point past the knee costs seconds,
not the whole --num-prompts. The index then names the knee (the highest
offered rate the server kept up with) and, with --goodput, the highest
offered rate at which at least `SLO_ATTAINMENT` of the requests met the SLO.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np

from servelab.experiment.saturation import SaturationGuard, over_saturated
from servelab.experiment.sweep import Observe, Sweep, SweepError, curve_point, run_sweep_point
from servelab.metrics.results import write_sweep_index
from servelab.metrics.slo import SLO
from servelab.metrics.summary import DEFAULT_PERCENTILES
from servelab.schemas.results import AutoSweepResult, RunInfo, SweepIndex, SweepPoint, SweepSpec
from servelab.targets.base import Target
from servelab.workload.arrival import ArrivalConfig
from servelab.workload.spec import LoadPlan

AUTO = "auto"
DEFAULT_RATES = 4
"""Rates between the synchronous and the throughput point when `--sweep auto` names no count."""
MAX_RATES = 32
SLO_ATTAINMENT = 0.9
"""A rate meets --goodput when at least this share of its requests (failures included) met every bound."""
KEPT_UP = 0.8
"""A rate point kept up when no over-saturation was found and it served at least this share of the rate its arrivals
actually came at (a finite run's tail, the last requests' own latency, keeps the ratio below 1 even on an idle
server; a short Poisson run's realized rate can be far from the nominal one: 16 requests at 15.3 req/s were
served at 9.7 req/s on the real vLLM CPU server with flat TTFT)."""
SYNCHRONOUS, THROUGHPUT, CONSTANT = "synchronous", "throughput", "constant"
RATE_KEY = "request-rate"


@dataclass(frozen=True)
class AutoSweep:
    rates: int = DEFAULT_RATES
    """Open-loop rates between the synchronous and the throughput point."""


def parse_sweep(text: str) -> Sweep | AutoSweep:
    """`--sweep`: `auto`, `auto=N` (N rates in between), or `KEY=V1,V2,...` (Sweep.parse)."""
    key, sep, raw = text.partition("=")
    if key.strip() != AUTO:
        return Sweep.parse(text)
    if not sep:
        return AutoSweep()
    try:
        rates = int(raw)
    except ValueError:
        rates = 0
    if not 1 <= rates <= MAX_RATES:
        raise SweepError(f"--sweep {text!r}: auto=N takes a number of rates N from 1 to {MAX_RATES}")
    return AutoSweep(rates)


def run_auto_sweep(
    target: Target,
    auto: AutoSweep,
    base_arrival: ArrivalConfig,
    make_plan: Callable[[ArrivalConfig], LoadPlan],
    result_dir: Path,
    run_info: RunInfo,
    slo: SLO | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    observe: Observe | None = None,
) -> SweepIndex:
    """Run the three stages into `result_dir`, updating sweep.json (points in order of load) after each point."""
    stages = _Stages(target, make_plan, result_dir, run_info, slo, percentiles, observe)
    sync = stages.run(SYNCHRONOUS, SYNCHRONOUS, replace(base_arrival, request_rate=math.inf, max_concurrency=1), None)
    if stages.index.interrupted:
        return stages.index
    peak = stages.run(THROUGHPUT, THROUGHPUT, replace(base_arrival, request_rate=math.inf), None)
    low, high = sync.request_throughput or 0.0, peak.request_throughput or 0.0
    if stages.index.interrupted or not (low > 0 and high > 0):
        stages.note("no rates run: the synchronous or throughput point completed no request")
        return stages.index
    for rate in np.linspace(min(low, high), max(low, high), auto.rates + 2)[1:-1].tolist():
        stages.run(CONSTANT, f"{RATE_KEY}={rate:.4g}", replace(base_arrival, request_rate=rate), rate)
        if stages.index.interrupted:
            break
    return stages.index


@dataclass
class _Stages:
    """An auto sweep's points as they are run: each point is written to sweep.json, with the conclusions drawn from
    the points so far, the moment it ends, so an interrupted sweep keeps what it measured."""

    target: Target
    make_plan: Callable[[ArrivalConfig], LoadPlan]
    result_dir: Path
    run_info: RunInfo
    slo: SLO | None
    percentiles: Sequence[float]
    observe: Observe | None
    index: SweepIndex = field(
        default_factory=lambda: SweepIndex(sweep=SweepSpec(key=RATE_KEY, values=[]), points=[], interrupted=False)
    )

    def run(self, profile: str, label: str, arrival: ArrivalConfig, rate: float | None) -> SweepPoint:
        """One point (a rate point under a SaturationGuard that stops it once over-saturated), then sweep.json."""
        plan = self.make_plan(arrival)
        guard = SaturationGuard(rate) if rate is not None else None
        if guard is not None:
            plan = replace(plan, requests=guard.requests(plan.requests))
        info = self.run_info.with_keys(sweep_point={"profile": profile, RATE_KEY: _rate_json(rate)})
        watchers = [guard] if guard is not None else []
        summary = run_sweep_point(
            self.target, plan, self.result_dir, label, info, self.slo, self.percentiles, self.observe, watchers
        )
        offered = summary.request_throughput if profile == SYNCHRONOUS else _rate_json(rate)
        point = curve_point({RATE_KEY: offered}, label, summary, profile)  # one at a time offers what it achieves
        if guard is not None:
            _note_guard(point, guard)
        self.index.points = sorted([*self.index.points, point], key=_load_order)
        self.index.sweep.values = [p.swept(RATE_KEY) for p in self.index.points]
        self.index.interrupted = bool(summary.interrupted)
        self.index.auto = _conclusions(self.index.points, self.slo)
        write_sweep_index(self.result_dir, self.index)
        return point

    def note(self, text: str) -> None:
        """A note beside the conclusions (why no rate was run), in sweep.json at once."""
        self.index.auto = self.index.auto or _conclusions(self.index.points, self.slo)
        self.index.auto.note = text
        write_sweep_index(self.result_dir, self.index)


def _note_guard(point: SweepPoint, guard: SaturationGuard) -> None:
    """A rate point's early stop, over-saturation, and the rate its arrivals actually came at, (n - 1) / span."""
    point.stopped_early = guard.stopped_early
    point.over_saturated = over_saturated(guard)
    arrivals = guard.arrivals
    span = max(arrivals) - min(arrivals) if len(arrivals) > 1 else 0.0
    point.offered_rate_realized = (len(arrivals) - 1) / span if span > 0 else None


def _rate_json(rate: float | None) -> float | Literal["inf"]:
    return "inf" if rate is None else rate


def _load_order(point: SweepPoint) -> tuple[int, float]:
    if point.profile == CONSTANT:
        return (1, float(point.swept(RATE_KEY)))
    return (0, 0.0) if point.profile == SYNCHRONOUS else (2, 0.0)


def _conclusions(points: Sequence[SweepPoint], slo: SLO | None) -> AutoSweepResult:
    """The knee, the peak and (with an SLO) the highest rate that meets it, from the points run so far."""
    sync = next((p for p in points if p.profile == SYNCHRONOUS), None)
    peak = next((p for p in points if p.profile == THROUGHPUT), None)
    offered = [(float(p.swept(RATE_KEY)), p) for p in points if p.profile == CONSTANT]
    if sync is not None and sync.request_throughput:
        offered.insert(0, (sync.request_throughput, sync))
    kept_up = [rate for rate, p in offered if _kept_up(rate, p)]
    meets = [rate for rate, p in offered if slo is not None and _slo_share(p) >= SLO_ATTAINMENT]
    return AutoSweepResult(
        synchronous_rate=sync.request_throughput if sync is not None else None,
        throughput_rate=peak.request_throughput if peak is not None else None,
        knee_rate=max(kept_up) if kept_up else None,
        first_over_saturated_rate=min((r for r, p in offered if p.over_saturated), default=None),
        max_goodput_rate=max(meets) if meets else None,
        slo_attainment=SLO_ATTAINMENT if slo is not None else None,
    )


def _kept_up(rate: float, point: SweepPoint) -> bool:
    if point.profile == SYNCHRONOUS:
        return bool(point.completed)
    offered = point.offered_rate_realized or rate  # a short Poisson run offers noticeably more or less
    return not point.over_saturated and (point.request_throughput or 0.0) >= KEPT_UP * offered


def _slo_share(point: SweepPoint) -> float:
    """The share of the point's counted requests (failures included) that met every SLO bound."""
    summary = point.summary
    if summary is None:
        return 0.0
    counted = (summary.completed or 0) + (summary.failed or 0)
    good = (summary.request_goodput or 0.0) * summary.duration
    return good / counted if counted else 0.0
