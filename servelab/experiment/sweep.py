"""Sweeps: one run per value of the arrival knob, then the throughput-latency curve in sweep.json.

A request-rate point also says whether the server was over-saturated (servelab/experiment/saturation.py);
`--sweep auto` (auto_sweep.py) picks its own points. Only the arrival process changes between points (`request-rate` or
`max-concurrency`); every point gets a fresh plan from the same seed, so
the prompts are the same and the curve shows load, not sampling noise.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

from servelab.errors import InputError
from servelab.experiment.runner import run_point
from servelab.experiment.saturation import SaturationGuard, over_saturated
from servelab.metrics.records import RecordSink
from servelab.metrics.results import write_sweep_index
from servelab.metrics.slo import SLO
from servelab.pool import TaskPool
from servelab.metrics.summary import DEFAULT_PERCENTILES
from servelab.schemas.results import RunInfo, Summary, SweepIndex, SweepPoint, SweepSpec, SweepValue
from servelab.targets.base import Target
from servelab.workload.arrival import ArrivalConfig
from servelab.workload.spec import LoadPlan

SWEEP_KEYS = ("request-rate", "max-concurrency")
"""The arrival knobs a sweep can vary, as flags."""
CURVE_KEYS = (
    "completed",
    "failed",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "request_goodput",
    "mean_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "mean_e2el_ms",
    "p99_e2el_ms",
)
"""The columns of the curve; each point's full summary is alongside."""
Observe = Callable[[str, LoadPlan], AbstractContextManager[RecordSink | None]]
"""Gives a point's live observer (a progress bar) from its label and plan."""


class SweepError(InputError):
    """A `--sweep` that cannot be run; the message names the flag."""


@dataclass(frozen=True)
class Sweep:
    key: str
    """The flag name, e.g. `request-rate`."""
    values: tuple[float | int, ...]

    @classmethod
    def parse(cls, text: str) -> Sweep:
        key, sep, raw = text.partition("=")
        key = key.strip().removeprefix("--")
        if not sep or key not in SWEEP_KEYS:
            raise SweepError(f"--sweep {text!r}: expected KEY=V1,V2,... with KEY one of {', '.join(SWEEP_KEYS)}")
        items = [v.strip() for v in raw.split(",") if v.strip()]
        if not items:
            raise SweepError(f"--sweep {text!r}: no values after '='")
        values = tuple(_parse_value(key, item, text) for item in items)
        if len(set(values)) != len(values):
            raise SweepError(f"--sweep {text!r}: a value is repeated")
        return cls(key, values)

    def label(self, value: float | int) -> str:
        return f"{self.key}={value:g}" if isinstance(value, float) else f"{self.key}={value}"

    def arrival(self, base: ArrivalConfig, value: float | int) -> ArrivalConfig:
        if self.key == "max-concurrency":
            return replace(base, max_concurrency=int(value))
        return replace(base, request_rate=value)

    def point_values(self, value: float | int) -> dict[str, SweepValue]:
        """The point's value as run.json's `sweep_point` and its sweep.json entry name it: `{flag: value}`."""
        return {self.key: _jsonable([value])[0]}


def _parse_value(key: str, item: str, text: str) -> float | int:
    try:
        if key == "max-concurrency":
            value: float | int = int(item)
            ok = value >= 1
        else:
            value = float(item)
            ok = value > 0
    except ValueError:
        ok = False
    if not ok:
        kind = "an integer >= 1" if key == "max-concurrency" else "a rate > 0 (or inf)"
        raise SweepError(f"--sweep {text!r}: {item!r} is not {kind}")
    return value


def run_sweep(
    target: Target,
    sweep: Sweep,
    base_arrival: ArrivalConfig,
    make_plan: Callable[[ArrivalConfig], LoadPlan],
    result_dir: Path,
    run_info: RunInfo,
    slo: SLO | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    observe: Observe | None = None,
    pool: TaskPool | None = None,
) -> SweepIndex:
    """Run every point into `result_dir/KEY=VALUE/` (`run_sweep_point`), updating sweep.json after each; stop at
    an interruption. With a `pool` (simulate --ray-address) every point runs at once where the pool puts it
    (see `_spread`)."""
    index = SweepIndex(
        sweep=SweepSpec(key=sweep.key, values=_jsonable(sweep.values)),
        points=[],
        interrupted=False,
    )
    if pool is not None:
        return _spread(target, sweep, base_arrival, make_plan, result_dir, run_info, slo, percentiles, pool, index)
    for value in sweep.values:
        label = sweep.label(value)
        plan = make_plan(sweep.arrival(base_arrival, value))
        point_info = run_info.with_keys(sweep_point=sweep.point_values(value))
        open_loop = sweep.key == "request-rate" and math.isfinite(value)
        guard = SaturationGuard(value, stop=False) if open_loop else None
        if guard is not None:
            plan = replace(plan, requests=guard.requests(plan.requests))
        summary = run_sweep_point(
            target, plan, result_dir, label, point_info, slo, percentiles, observe, [guard] if guard is not None else []
        )
        point = curve_point(sweep.point_values(value), label, summary)
        if guard is not None:
            point.over_saturated = over_saturated(guard)
        index.points.append(point)
        index.interrupted = bool(summary.interrupted)
        write_sweep_index(result_dir, index)
        if index.interrupted:
            break
    return index


def run_sweep_point(
    target: Target,
    plan: LoadPlan,
    result_dir: Path,
    label: str,
    point_info: RunInfo,
    slo: SLO | None,
    percentiles: Sequence[float],
    observe: Observe | None,
    watchers: Sequence[RecordSink] = (),
) -> Summary:
    """One point into `result_dir/label/`, after emptying the server's prefix cache where the target can
    (`reset_prefix_cache`, HttpTarget): a point must not inherit the previous one's cached prefixes; its
    run.json says what happened. `watchers` see every record, beside the live observer."""
    reset = getattr(target, "reset_prefix_cache", None)
    if reset is not None:
        point_info = point_info.with_keys(prefix_cache_reset=reset())
    context = observe(label, plan) if observe is not None else nullcontext(None)
    with context as observer:
        observers = [*watchers, *([observer] if observer is not None else [])]
        return run_point(target, plan, result_dir / label, point_info, slo, percentiles, observers=observers)


def curve_point(swept: dict[str, SweepValue], label: str, summary: Summary, profile: str | None = None) -> SweepPoint:
    """One entry of sweep.json's `points`: the swept value (`{flag: value}`), `--sweep auto`'s profile, the point's
    directory, the curve's columns and its summary."""
    columns = {k: summary.statistic(k) for k in CURVE_KEYS}
    named = {"profile": profile} if profile is not None else {}
    return SweepPoint.model_validate({**swept, **named, "directory": label, **columns, "summary": summary})


@dataclass(frozen=True)
class _RemotePoint:
    """One sweep point as a pool task: run into a scratch directory on the worker, return the summary and files.

    The plan is built on the worker from the point's arrival (a plan is drawn lazily, so it does not travel)."""

    target: Target
    make_plan: Callable[[ArrivalConfig], LoadPlan]
    run_info: RunInfo
    slo: SLO | None
    percentiles: tuple[float, ...]

    def __call__(self, arrival: ArrivalConfig) -> tuple[Summary, dict[str, bytes]]:
        with tempfile.TemporaryDirectory(prefix="servelab-point-") as scratch:
            out = Path(scratch)
            summary = run_point(self.target, self.make_plan(arrival), out, self.run_info, self.slo, self.percentiles)
            return summary, {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def _spread(
    target: Target,
    sweep: Sweep,
    base_arrival: ArrivalConfig,
    make_plan: Callable[[ArrivalConfig], LoadPlan],
    result_dir: Path,
    run_info: RunInfo,
    slo: SLO | None,
    percentiles: Sequence[float],
    pool: TaskPool,
    index: SweepIndex,
) -> SweepIndex:
    """Every point submitted at once; each point's files land in its directory here, sweep.json rewritten (in
    value order) as each returns. Only for targets that do not share a server: points on one server would
    measure each other."""
    tasks: dict[int, float | int] = {}
    summaries: dict[float | int, Summary] = {}
    try:
        for value in sweep.values:
            job = _RemotePoint(
                target,
                make_plan,
                run_info.with_keys(sweep_point=sweep.point_values(value)),
                slo,
                tuple(percentiles),
            )
            tasks[pool.submit(job, sweep.arrival(base_arrival, value))] = value
        while tasks:
            task, returned = pool.next_done()
            value = tasks.pop(task)
            if isinstance(returned, BaseException):
                raise returned
            summary, files = returned
            for name, data in files.items():
                path = result_dir / sweep.label(value) / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            summaries[value] = summary
            index.points = [
                curve_point(sweep.point_values(v), sweep.label(v), summaries[v]) for v in sweep.values if v in summaries
            ]
            write_sweep_index(result_dir, index)
    except BaseException:
        pool.cancel_all()
        raise
    return index


def _jsonable(values: Sequence[float | int]) -> list[SweepValue]:
    """Swept values as sweep.json writes them: an unbounded rate as "inf" (JSON has no infinity)."""
    return ["inf" if isinstance(v, float) and math.isinf(v) else v for v in values]
