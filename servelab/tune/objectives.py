"""What "best" means, and how one configuration is scored on a target.

Three questions users ask, each a number plus a constraint:

- goodput:    the highest request rate at which the SLO holds (found by
              searching over the rate: a deployment's goodput is a property
              of the deployment, not of one load level).
- throughput: output tokens/s at the given workload, with the SLO's bounds
              as limits on the chosen latency percentile.
- cost:       dollars per million output tokens at a target rate, SLO held.

"The SLO holds" means the same everywhere: for every bounded metric the
chosen percentile (p99 by default) is within its bound, and no more than
(100 - percentile)% of requests failed. The amount by which it fails is kept
(`violation`, 0 when it holds) so a search can tell "nearly" from "far off".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from servelab.metrics.intervals import simulated_run_intervals
from servelab.metrics.records import MemorySink
from servelab.metrics.slo import SLO
from servelab.metrics.summary import DEFAULT_PERCENTILES, summarize
from servelab.targets.base import Target
from servelab.targets.sim import SimTarget
from servelab.tune.errors import TuneError
from servelab.schemas.results import Json
from servelab.schemas.tune import KEY_STATISTICS, KeyMetrics, ObjectiveInfo
from servelab.schemas.vocabulary import Direction, ObjectiveKind
from servelab.tune.workload import TuneWorkload

HOURS_PER_S = 1 / 3600
UNITS = {ObjectiveKind.GOODPUT: "req/s", ObjectiveKind.THROUGHPUT: "tok/s", ObjectiveKind.COST: "$/Mtok"}

Summary = Json
"""A run's summary.json as summarize() returns it."""


def kind_named(word: str) -> ObjectiveKind:
    """--objective's word as its kind: a word the user typed is refused with the choices, not a ValueError."""
    if word not in tuple(ObjectiveKind):
        raise TuneError(f"unknown objective {word!r}; use one of {', '.join(ObjectiveKind)}")
    return ObjectiveKind(word)


@dataclass(frozen=True)
class Objective:
    kind: ObjectiveKind
    slo: SLO | None
    percentile: float = 99.0
    target_rate: float | None = None
    """Requests/s the cost objective must sustain (its workload's rate)."""
    gpu_cost_per_hour: Mapping[str, float] = field(default_factory=dict)
    """GPU name -> $/hour; the key "*" prices any GPU not named."""
    rate_tolerance: float = 0.02
    """The goodput search stops when the bracket is this tight (relative)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", kind_named(self.kind))
        if not 0 < self.percentile < 100:
            raise TuneError(f"--slo-percentile must be in (0, 100), got {self.percentile}")
        if self.kind == ObjectiveKind.GOODPUT and self.slo is None:
            raise TuneError("the goodput objective needs an SLO: --goodput ttft:MS tpot:MS")
        if self.kind == ObjectiveKind.COST:
            if not self.target_rate or self.target_rate <= 0:
                raise TuneError("the cost objective needs the rate to sustain: --request-rate R")
            if not self.gpu_cost_per_hour:
                raise TuneError(
                    "the cost objective needs prices: --gpu-cost-per-hour 2.5 (or H100-SXM=2.5,A100-80GB-SXM=1.6)"
                )
        if not 0 < self.rate_tolerance < 1:
            raise TuneError("the rate tolerance must be in (0, 1)")

    @property
    def direction(self) -> Direction:
        return Direction.MINIMIZE if self.kind == ObjectiveKind.COST else Direction.MAXIMIZE

    @property
    def unit(self) -> str:
        return UNITS[self.kind]

    def info(self) -> ObjectiveInfo:
        """What tune.json records of the objective (and what a resumed study must share)."""
        return ObjectiveInfo(
            kind=self.kind,
            direction=self.direction,
            unit=self.unit,
            slo=None if self.slo is None else self.slo.terms(),
            percentile=self.percentile,
            target_rate=self.target_rate,
            gpu_cost_per_hour=dict(self.gpu_cost_per_hour),
        )

    @property
    def percentiles(self) -> tuple[float, ...]:
        return tuple(sorted({*DEFAULT_PERCENTILES, self.percentile}))

    def violation(self, summary: Summary) -> float:
        """0 when the SLO holds on this summary, else how far off (relative excess of the worst metric)."""
        total = int(summary["completed"]) + int(summary["failed"])
        if total == 0:
            return 1.0
        allowed_failures = (100 - self.percentile) / 100
        worst = max(0.0, int(summary["failed"]) / total - allowed_failures)
        if self.slo is None:
            return worst
        for metric, bound in self.slo.terms().model_dump(exclude_unset=True).items():
            value = summary[f"p{self.percentile:g}_{metric}_ms"]
            if value is None:  # nothing to measure (no second token for TPOT): the bound cannot be broken
                continue
            worst = max(worst, value / bound - 1)
        return worst

    def price_per_hour(self, gpu: str, gpus: int) -> float | None:
        price = self.gpu_cost_per_hour.get(gpu, self.gpu_cost_per_hour.get("*"))
        return None if price is None else price * gpus

    def cost_per_million_tokens(self, summary: Summary, gpu: str, gpus: int) -> float | None:
        price = self.price_per_hour(gpu, gpus)
        tokens_per_s = float(summary["output_throughput"])
        if price is None:
            return None
        return math.inf if tokens_per_s <= 0 else price * HOURS_PER_S / tokens_per_s * 1e6

    def score_point(self, summary: Summary, gpu: str, gpus: int) -> float:
        """The objective's number for one run at the workload's own load (stage 2 and the fixed-load objectives)."""
        if self.kind == ObjectiveKind.GOODPUT:
            return float(summary["request_goodput"] or 0.0)
        if self.kind == ObjectiveKind.THROUGHPUT:
            return float(summary["output_throughput"])
        cost = self.cost_per_million_tokens(summary, gpu, gpus)
        if cost is None:
            raise TuneError(f"no price for {gpu}: add it to --gpu-cost-per-hour ({gpu}=DOLLARS) or give a '*' price")
        return cost


@dataclass
class Probe:
    """One run at one load: the rate (None = the workload's own arrivals) and what came of it."""

    rate: float | None
    violation: float
    summary: Summary

    def brief(self) -> Summary:
        """tune.json's record of the probe: its load, how far off the SLO, and the key statistics of its run."""
        return {"rate": self.rate, "violation": self.violation, **key_metrics(self.summary).model_dump()}


@dataclass
class Evaluation:
    """A configuration scored: the objective's number, whether the SLO held, and the run it rests on."""

    score: float
    violation: float
    summary: Summary
    """The run the score rests on (for goodput: the highest rate that held, else the lowest tried)."""
    rate: float | None = None
    probes: list[Probe] = field(default_factory=list)

    @property
    def feasible(self) -> bool:
        return self.violation <= 0


KEY_METRICS = KEY_STATISTICS
"""What a trial keeps of its run's summary: the fields of tune.json's typed metrics, so the two cannot drift."""


def key_metrics(summary: Summary) -> KeyMetrics:
    """The key statistics, and a prediction's intervals of them."""
    intervals = {k: v for k, v in (summary.get("intervals") or {}).items() if k in KEY_METRICS}
    return KeyMetrics(**{k: summary.get(k) for k in KEY_METRICS}, intervals=intervals or None)


def run_summary(
    target: Target,
    workload: TuneWorkload,
    objective: Objective,
    rate: float | None = None,
    *,
    burst: bool = False,
    open_loop: bool = False,
) -> Summary:
    """The plan's summary on `target`; on the simulator with its 80% intervals (servelab.metrics.intervals)."""
    sink = MemorySink()
    plan = workload.plan(rate, burst=burst, open_loop=open_loop)
    run = target.run(plan, sink)
    summary = summarize(sink.records, slo=objective.slo, percentiles=objective.percentiles).model_dump(
        exclude_unset=True
    )
    if isinstance(target, SimTarget) and summary["completed"]:
        summary.update(
            simulated_run_intervals(sink.records, plan.max_concurrency, summary, target.tier, run.client_stats)
        )
    return summary


def evaluate(target: Target, workload: TuneWorkload, objective: Objective, *, gpu: str, gpus: int) -> Evaluation:
    """Score one configuration on `target` (the simulator in stage 1)."""
    if objective.kind == ObjectiveKind.GOODPUT:
        capacity = run_summary(target, workload, objective, burst=True, open_loop=True)["request_throughput"]
        return max_goodput_rate(
            lambda rate: run_summary(target, workload, objective, rate, open_loop=True),
            objective,
            capacity=float(capacity),
        )
    rate = objective.target_rate if objective.kind == ObjectiveKind.COST else None
    summary = run_summary(target, workload, objective, rate)
    violation = objective.violation(summary)
    return Evaluation(
        objective.score_point(summary, gpu, gpus), violation, summary, rate, [Probe(rate, violation, summary)]
    )


def max_goodput_rate(
    run_at: Callable[[float], Summary], objective: Objective, *, capacity: float, max_probes: int = 16
) -> Evaluation:
    """The highest Poisson rate at which the SLO holds, searched below the saturated `capacity`.

    `capacity` is the request throughput with everything sent at once: above
    it a queue grows without bound however good the first few hundred
    requests look, so it caps the answer. Below it the bracket halves until a
    rate holds, then bisects geometrically until its ends are within
    `rate_tolerance`. Assumes feasibility is monotone in the rate, which holds
    for one fixed set of requests whose gaps only scale.
    """
    probes: list[Probe] = []

    def holds(rate: float) -> bool:
        summary = run_at(rate)
        probes.append(Probe(rate, objective.violation(summary), summary))
        return probes[-1].violation <= 0

    if capacity <= 0:
        summary = run_at(1e-3)
        return Evaluation(0.0, max(objective.violation(summary), 1.0), summary, None, [Probe(1e-3, 1.0, summary)])
    lo, hi = None, capacity
    if holds(capacity):
        lo = capacity
    rate = capacity
    while lo is None and len(probes) < max_probes // 2:
        rate /= 2
        if holds(rate):
            lo = rate
        else:
            hi = rate
    if lo is None:  # nothing held even at a small fraction of capacity
        lowest = probes[-1]
        return Evaluation(0.0, lowest.violation, lowest.summary, None, probes)
    while hi / lo > 1 + objective.rate_tolerance and len(probes) < max_probes:
        mid = math.sqrt(lo * hi)
        if holds(mid):
            lo = mid
        else:
            hi = mid
    best = next(p for p in probes if p.rate == lo)
    return Evaluation(lo, 0.0, best.summary, lo, probes)
