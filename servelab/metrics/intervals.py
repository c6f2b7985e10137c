"""How sure a prediction is: its regime, its limit, its tier, and the 80% interval around each predicted number.

An interval is read off the accuracy benchmark's held-out residuals
(`benchmarks/gpu_accuracy.py --write-residuals` writes them to
perf/data/prediction_residuals.yaml), not a fixed percentage: for a predicted
value v and the residuals r = log(measured / predicted) of the published runs
predicted in the same tier, regime and limit, the interval is [v * exp(lo), v * exp(hi)]
with lo and hi the finite-sample (split-conformal) 10% and 90% order statistics of
r, widened to hold v itself. The conformal order statistics rather than plain
percentiles because a cell holds tens of runs, not thousands: with n residuals
the ceil((n + 1) * 0.9)-th smallest is the smallest choice that still covers 90%
of a new exchangeable run, where numpy's interpolated q90 covers less.

A cell is thin when it holds fewer than MIN_RUNS residuals or fewer than MIN_SOURCES publishers: the residuals of
one host say how that host differs from the model, not how the user's will, and a user's deployment is a new host.
A thin cell pools, nearest first, with its sibling metric in the same regime and limit (mean ITL with mean TPOT,
request with output throughput: the same quantity, differently counted), then with the other limit in the same
regime, then with the neighbouring regimes (their own limit first), and the interval's basis names what it pooled.

The regime and the limit are decided by `classify_regime` and `classify_limit`
from what is known when the prediction is made (the plan's arrival, the
simulated run itself), so the benchmark files a published run under the same
cell a user's prediction of that run would get.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import yaml

from servelab.metrics.records import RequestRecord
from servelab.schemas.results import IntervalBasis, Json
from servelab.schemas.vocabulary import Limit as Limit, Regime as Regime, Tier as Tier  # named for their importers

LEVEL = 0.8
"""The intervals' nominal coverage."""
MIN_RUNS = 8
"""A cell with fewer residuals than this pools with its sibling metric and neighbouring regimes (and says so)."""
MIN_SOURCES = 2
"""A cell whose residuals come from fewer publishers than this pools likewise: one host cannot speak for another."""
RESIDUALS = Path(__file__).parents[1] / "perf" / "data" / "prediction_residuals.yaml"

QUEUED_SHARE_SATURATED = 0.25
"""A run where at least this share of requests waited in the engine's queue is at its knee: the batch could not grow."""
QUEUED_STEPS = 4
"""A request waited in the queue when it was first scheduled more than this many decode steps (median TPOT) after its
send: joining the next step, behind the API server, takes one or two."""
SERVED_SHARE_SATURATED = 0.9
"""An open-loop run served below this share of its offered rate fell behind it: past capacity."""
API_SERVER_BOUND_SHARE = 0.9
"""A run whose API servers' cores were busy at least this share of it is limited by them, not by the engine: a single
server at utilisation u keeps about u / (1 - u) items queued (M/M/1), 9 at 0.9, so its queue, not the GPU's step
time, sets when requests reach the engine and tokens reach the client. The simulator prices that core from CPU costs
measured on one host, and real hosts' CPUs differ more than their GPUs' datasheets do: such a run's error is its own."""


NEIGHBOURS: dict[Regime, tuple[Regime, ...]] = {
    Regime.CONCURRENCY_1: (Regime.UNDER_CAPACITY, Regime.SATURATED),
    Regime.UNDER_CAPACITY: (Regime.CONCURRENCY_1, Regime.SATURATED),
    Regime.SATURATED: (Regime.UNDER_CAPACITY, Regime.CONCURRENCY_1),
}
"""The regimes a thin cell pools with, nearest first."""


def _siblings() -> dict[str, str]:
    pairs = {"request_throughput": "output_throughput"}
    pairs |= {f"{stat}_itl_ms": f"{stat}_tpot_ms" for stat in ("mean", "median", "p90", "p99")}
    return pairs | {b: a for a, b in pairs.items()}


SIBLINGS = _siblings()
"""Metric -> the metric that measures the same quantity counted another way (a thin cell pools with it first)."""


def classify_regime(
    records: Sequence[RequestRecord], max_concurrency: int | None, summary: Mapping[str, Any]
) -> Regime:
    """The regime of a simulated run, from its plan's cap, its records and its summary.

    - concurrency 1: at most one request in flight (a cap of 1, or a single request);
    - saturated: a burst (every request released at once, no cap), an open loop served below
      SERVED_SHARE_SATURATED of its offered rate, or a run where QUEUED_SHARE_SATURATED of the requests waited
      in the engine's queue (a closed loop past max_num_seqs or the KV cache: the knee);
    - under capacity: the rest.
    """
    done = [r for r in records if r.ok]
    if max_concurrency == 1 or len(records) <= 1:
        return Regime.CONCURRENCY_1
    sends = [r.send_time for r in records]
    if max_concurrency is None and max(sends) - min(sends) <= 0:
        return Regime.SATURATED
    if max_concurrency is None and _served_share(records, summary) < SERVED_SHARE_SATURATED:
        return Regime.SATURATED
    if done and _queued_share(done, summary) >= QUEUED_SHARE_SATURATED:
        return Regime.SATURATED
    return Regime.UNDER_CAPACITY


def classify_limit(client_stats: Mapping[str, Any]) -> Limit:
    """What limited a simulated run, from its client stats (SimTarget records the API servers' busy share)."""
    share = client_stats.get("api_server_busy_share") or 0.0
    return Limit.API_SERVER if share >= API_SERVER_BOUND_SHARE else Limit.ENGINE


def _served_share(records: Sequence[RequestRecord], summary: Mapping[str, Any]) -> float:
    """Served over offered request rate of an open loop, the offered span lengthened by one mean E2E (the last
    request's own time, which even an idle server adds)."""
    sends = sorted(r.send_time for r in records)
    e2el = (summary.get("mean_e2el_ms") or 0.0) / 1e3
    offered = len(sends) / (sends[-1] - sends[0] + e2el) if sends[-1] > sends[0] else math.inf
    return float(summary.get("request_throughput") or 0.0) / offered


def _queued_share(done: Sequence[RequestRecord], summary: Mapping[str, Any]) -> float:
    """The share of completed requests first scheduled more than QUEUED_STEPS decode steps after being sent."""
    step = (summary.get("median_tpot_ms") or summary.get("median_ttft_ms") or 0.0) / 1e3
    waits = [r.schedule_time - r.send_time for r in done if r.schedule_time is not None]
    if not waits:
        return 0.0
    return sum(w > QUEUED_STEPS * step for w in waits) / len(waits)


@dataclass(frozen=True, slots=True)
class Residual:
    """One published run's held-out error on one metric: log(measured / predicted)."""

    run: str
    source: str
    value: float


ResidualTable = Mapping[str, Mapping[str, Mapping[str, Mapping[str, Sequence[Residual]]]]]
"""tier -> regime -> limit -> metric -> residuals."""


@cache
def published_residuals() -> ResidualTable:
    """The residuals the accuracy benchmark last wrote (empty when it has not: then no prediction has an interval)."""
    if not RESIDUALS.exists():
        return {}
    doc = yaml.load(RESIDUALS.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return {
        tier: {
            regime: {
                limit: {
                    metric: [Residual(r["run"], r["source"], float(r["residual"])) for r in rows]
                    for metric, rows in metrics.items()
                }
                for limit, metrics in limits.items()
            }
            for regime, limits in regimes.items()
        }
        for tier, regimes in (doc.get("residuals") or {}).items()
    }


Cell = tuple[Regime, Limit, str]
"""(regime, limit, metric): the residuals of one kind of prediction."""


@dataclass(frozen=True, slots=True)
class Bounds:
    """The log-ratio bounds of one metric's interval and where they came from."""

    low: float
    high: float
    runs: int
    sources: int
    pooled_from: tuple[Cell, ...]
    """The cells whose residuals were used (the first is the prediction's own)."""

    def around(self, value: float) -> tuple[float, float]:
        return value * math.exp(self.low), value * math.exp(self.high)

    def pooled_text(self, metric: str) -> str:
        """ "saturated api_server, saturated engine" or "saturated engine, saturated engine mean_tpot_ms": the cells
        used, naming the metric where it is not `metric` (the prediction's own)."""
        return ", ".join(
            f"{regime} {limit}" + ("" if used == metric else f" {used}") for regime, limit, used in self.pooled_from
        )


def conformal_bounds(values: Sequence[float], level: float = LEVEL) -> tuple[float, float]:
    """The finite-sample lower and upper order statistics of `values` for a central `level` interval, widened to hold 0
    (the prediction itself)."""
    ordered = np.sort(np.asarray(values, dtype=float))
    n = ordered.size
    tail = (1 - level) / 2
    upper = min(n, math.ceil((n + 1) * (1 - tail)))
    lower = max(1, math.floor((n + 1) * tail))
    return min(0.0, float(ordered[lower - 1])), max(0.0, float(ordered[upper - 1]))


def nearest_cells(regime: Regime, limit: Limit, metric: str) -> Iterator[Cell]:
    """The cells a thin one pools with, nearest first: its sibling metric, the other limit in its regime (a run
    near the line between them), then the neighbouring regimes, each with its own limit first."""
    for r in (regime, *NEIGHBOURS[regime]):
        for lim in (limit, *(other for other in Limit if other != limit)):
            for m in (metric, *([SIBLINGS[metric]] if metric in SIBLINGS else [])):
                yield r, lim, m


def metric_bounds(table: ResidualTable, tier: Tier, regime: Regime, limit: Limit, metric: str) -> Bounds | None:
    """The metric's bounds in (tier, regime, limit), pooling with the nearest cells until the residuals number
    MIN_RUNS from MIN_SOURCES publishers; None when the tier has no residuals for it at all."""
    cells = table.get(tier) or {}
    pooled: list[Residual] = []
    used: list[Cell] = []
    for r, lim, m in nearest_cells(regime, limit, metric):
        rows = ((cells.get(r) or {}).get(lim) or {}).get(m) or []
        if rows:
            pooled += rows
            used.append((r, lim, m))
        if len(pooled) >= MIN_RUNS and len({row.source for row in pooled}) >= MIN_SOURCES:
            return _bounds(pooled, used)
    return _bounds(pooled, used) if pooled else None


def _bounds(pooled: Sequence[Residual], used: Sequence[Cell]) -> Bounds:
    low, high = conformal_bounds([row.value for row in pooled])
    return Bounds(low, high, len(pooled), len({row.source for row in pooled}), tuple(used))


class SummaryIntervals(TypedDict):
    """The two keys a simulated summary gains, as summary.json holds them (Summary.intervals, .interval_basis)."""

    intervals: dict[str, list[float]]
    interval_basis: Json


def prediction_intervals(
    summary: Mapping[str, Any], tier: Tier, regime: Regime, limit: Limit, table: ResidualTable | None = None
) -> SummaryIntervals:
    """`intervals` and `interval_basis`, the keys a simulated summary gains: per predicted metric with residuals, its
    80% interval, and the tier, regime, limit and pooling it came from.

    A tier without residuals of its own (none are published yet for a calibrated one) borrows specs-only's, and
    says so: a calibrated prediction should be at least that good, so the interval is wider than it needs to be.
    """
    table = published_residuals() if table is None else table
    used_tier = tier if table.get(tier) else Tier.SPECS_ONLY
    intervals: dict[str, list[float]] = {}
    notes: list[str] = []
    if used_tier != tier:
        notes.append(f"no residuals for tier {tier} yet: {Tier.SPECS_ONLY}'s used (wider than it needs to be)")
    for metric, value in summary.items():
        if not isinstance(value, (int, float)) or value <= 0:
            continue
        bounds = metric_bounds(table, used_tier, regime, limit, metric)
        if bounds is None:
            continue
        intervals[metric] = list(bounds.around(float(value)))
        if bounds.pooled_from != ((regime, limit, metric),):
            notes.append(
                f"{metric}: {bounds.runs} runs from {bounds.sources} sources, pooled from {bounds.pooled_text(metric)}"
            )
    basis = IntervalBasis(tier=tier, regime=regime, limit=limit, level=LEVEL, residuals_tier=used_tier, notes=notes)
    return SummaryIntervals(intervals=intervals, interval_basis=basis.model_dump(mode="json"))


def value_interval(value: float, metric: str, tier: Tier, regime: Regime, limit: Limit) -> list[float] | None:
    """One predicted value's 80% interval (the published residuals, specs-only's for a tier without its own); None when
    the metric has no residuals."""
    table = published_residuals()
    bounds = metric_bounds(table, tier if table.get(tier) else Tier.SPECS_ONLY, regime, limit, metric)
    return None if bounds is None or value <= 0 else list(bounds.around(value))


def simulated_run_intervals(
    records: Sequence[RequestRecord],
    max_concurrency: int | None,
    summary: Mapping[str, Any],
    tier: Tier,
    client_stats: Mapping[str, Any],
) -> SummaryIntervals:
    """The `intervals` and `interval_basis` of a simulated run's summary: its regime and limit classified (the limit
    from the run's client stats), then its intervals."""
    regime = classify_regime(records, max_concurrency, summary)
    return prediction_intervals(summary, tier, regime, classify_limit(client_stats))


def interval_text(bounds: Sequence[float] | None) -> str:
    """ "80%: 6.9–9.8" for an interval, "" for none (a measured run has none)."""
    if not bounds:
        return ""
    low, high = bounds
    return f"{LEVEL:.0%}: {_short(low)}–{_short(high)}"


def interval_suffix(intervals: Mapping[str, Sequence[float]] | None, key: str) -> str:
    """ ", 80%: 6.9–9.8" to print after a summary's `key` when its intervals have one, else ""."""
    text = interval_text((intervals or {}).get(key))
    return f", {text}" if text else ""


def _short(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"
