"""`validate`: held-out workloads measured on the live server and simulated with a profile, side by side.

"Held out" means nothing the probes ran: lengths drawn from ranges instead
of fixed, concurrencies between the probed powers of two, and Poisson open
loop arrivals, which the probes never use. Each point is seeded, so the
simulator serves the very requests the server did. Open-loop rates are set
from the profile's own predicted capacity, so the default points load any
server to the same relative degree.

Two things the simulator does not model are kept out of the comparison,
openly. A closed-loop point's first wave (every slot filled at t=0) is not
counted: a burst of simultaneous arrivals measures the HTTP frontend's serial
admission of requests, not the engine. And a shared machine is noisy: other
processes steal CPU in bursts of a second or less, which only ever makes
things slower. So each point runs several times with fresh requests,
interleaved with the other points, and each metric is judged on the repeat
that measured best (lowest time, highest throughput) against the simulation
of that same repeat's requests: the estimate of the machine's own speed,
as calibration's lower-quartile figures are. A repeat in which the client
itself stalled (many tokens read at once, see calibrate.MAX_BUNCHED) did not
observe the server's timing and is not judged; a point with no other repeat
has no figures, and the report says how many repeats were set aside.

A host that changed since calibration is caught the same way, openly: the
reference step time (servelab.calibrate.reference) is timed before each
round of points and after the last, and compared with the profile's. A round
bracketed by a timing that moved beyond the run-to-run spread of both ran on
a server of another speed; its repeats are reported as disturbed and not
judged, and the report says by how much the speed moved.
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NotRequired, TypedDict

import numpy as np

from servelab.atomic import write_text_atomic
from servelab.calibrate.calibrate import compare
from servelab.calibrate.probes import PROBE_EXTRA_BODY, bunched_fraction, client_stalled, random_prompt, run_into
from servelab.calibrate.reference import time_reference
from servelab.metrics.host import HostWatch, condition_changes
from servelab.metrics.records import MemorySink, RequestRecord
from servelab.metrics.summary import summarize
from servelab.perf.calibration import load_profile
from servelab.schemas.profile import CalibrationProfile, ReferenceTiming, SpeedChange, reference_too_wide
from servelab.perf.errors import PerfConfigError
from servelab.schemas.results import RunInfo, Summary
from servelab.targets.deployment import Deployment
from servelab.targets.base import Target
from servelab.schemas.validation import PointResult, ProfileRef, ServerRef, ValidationReport
from servelab.targets.http import HttpTarget
from servelab.targets.profile import deployment_from_profile
from servelab.targets.sim import SimTarget
from servelab.workload.spec import LoadPlan, RequestSpec

METRICS = ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "median_e2el_ms")
"""The reported metrics, named as `summarize` (and `vllm bench serve`) names them."""
BOUNDS_PCT = {"output_throughput": 10.0, "median_ttft_ms": 20.0, "median_tpot_ms": 10.0}
"""Median |error| over the points that the issue requires (its goal is 5 / 10 / 5)."""
GOALS_PCT = {"output_throughput": 5.0, "median_ttft_ms": 10.0, "median_tpot_ms": 5.0}


class Repeat(TypedDict):
    """One run of a point as the report keeps it (validation.json's `points[].repeats[]`)."""

    workload: dict[str, object]
    """The load plan's description: the point's shape, its seed and (Poisson points) the request rate."""
    directory: str
    bunched: float
    """Share of token gaps the client read in bunches (see probes.bunched_fraction)."""
    measured: dict[str, float | None]
    simulated: dict[str, float | None]
    round: int
    disturbed: NotRequired[bool]
    """Whether a reference timing around its round found the server at another speed; set once all rounds ran."""


class ValidateError(PerfConfigError):
    """A point list or setting that validate cannot run."""


@dataclass(frozen=True)
class Point:
    """One held-out workload: uniform length ranges, and closed loop (`concurrency`) or Poisson (`load` x capacity)."""

    name: str
    prompt_len: tuple[int, int]
    output_len: tuple[int, int]
    num_requests: int
    concurrency: int | None = None
    load: float | None = None
    """Poisson rate as a fraction of the simulated capacity for these lengths."""

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.load is None):
            raise ValidateError(f"point {self.name}: give exactly one of concurrency or load")
        for lo, hi in (self.prompt_len, self.output_len):
            if not 1 <= lo <= hi:
                raise ValidateError(f"point {self.name}: length range ({lo}, {hi}) is empty or not positive")
        if self.load is not None and not 0 < self.load < 1:
            raise ValidateError(f"point {self.name}: load is a fraction of capacity in (0, 1), got {self.load}")


DEFAULT_POINTS = (
    Point("closed-c3", (100, 300), (40, 120), 30, concurrency=3),
    Point("closed-c6", (32, 256), (16, 160), 48, concurrency=6),
    Point("closed-c12", (16, 128), (64, 192), 72, concurrency=12),
    Point("closed-c24", (48, 96), (32, 128), 120, concurrency=24),
    Point("poisson-30pct", (64, 512), (32, 96), 60, load=0.3),
    Point("poisson-70pct", (16, 192), (48, 160), 100, load=0.7),
    Point("poisson-long-prompts", (700, 1500), (8, 32), 40, load=0.5),
)
QUICK_POINTS = (
    Point("closed-c3", (100, 300), (40, 120), 18, concurrency=3),
    Point("closed-c6", (32, 256), (16, 160), 30, concurrency=6),
    Point("closed-c12", (16, 128), (64, 160), 48, concurrency=12),
    Point("closed-c24", (48, 96), (32, 128), 72, concurrency=24),
    Point("poisson-30pct", (64, 512), (32, 96), 36, load=0.3),
    Point("poisson-70pct", (16, 192), (48, 160), 60, load=0.7),
)
"""Fewer requests per point, for tests on a busy two-core machine."""
POINT_SETS = {"default": DEFAULT_POINTS, "quick": QUICK_POINTS}


def points_named(name: str) -> tuple[Point, ...]:
    try:
        return POINT_SETS[name]
    except KeyError:
        raise ValidateError(f"unknown point set {name!r}; known: {', '.join(POINT_SETS)}") from None


def point_requests(point: Point, vocab_size: int, max_model_len: int, seed: int) -> list[RequestSpec]:
    """The point's requests (arrival times 0: the load plan decides when they go), lengths clipped to fit the model."""
    rng = np.random.default_rng(seed)
    specs = []
    for i in range(point.num_requests):
        out = int(rng.integers(point.output_len[0], point.output_len[1] + 1))
        prompt = min(int(rng.integers(point.prompt_len[0], point.prompt_len[1] + 1)), max_model_len - out - 1)
        specs.append(RequestSpec(index=i, prompt_ids=random_prompt(rng, prompt, vocab_size), max_tokens=out))
    return specs


def counted(records: list[RequestRecord], plan: LoadPlan) -> list[RequestRecord]:
    """The records a point is judged on: a closed loop's first wave (indices below the concurrency) left out."""
    first_wave = plan.max_concurrency or 0
    return [r for r in records if r.index >= first_wave]


def simulate(sim: SimTarget, plan: LoadPlan) -> Summary:
    sink = MemorySink()
    sim.run(plan, sink)
    return summarize(counted(sink.records, plan))


def capacity(sim: SimTarget, specs: list[RequestSpec]) -> float:
    """Requests/s the simulated deployment sustains on these requests with every sequence slot busy."""
    cap = sim.config.max_num_seqs or 1
    sink = MemorySink()
    sim.run(LoadPlan(list(specs), max_concurrency=cap), sink)
    return summarize(sink.records).request_throughput


def point_plan(point: Point, deployment: Deployment, sim: SimTarget, seed: int) -> LoadPlan:
    vocab = deployment.model.vocab_size
    max_len = deployment.config.max_model_len or deployment.model.max_position_embeddings
    specs = point_requests(point, vocab, max_len, seed)
    description: dict[str, object] = {"point": asdict(point), "seed": seed}
    if point.concurrency is not None:
        return LoadPlan(specs, max_concurrency=point.concurrency, description=description)
    assert point.load is not None
    rate = point.load * capacity(sim, specs)
    gaps = np.random.default_rng([seed, 1]).exponential(1.0 / rate, len(specs))
    arrivals = np.concatenate([[0.0], np.cumsum(gaps)[:-1]])
    for spec, t in zip(specs, arrivals):
        spec.arrival_time = float(t)
    description["request_rate"] = rate
    return LoadPlan(specs, description=description)


def figures(summary: Summary) -> dict[str, float | None]:
    """The compared figures; None where the run measured nothing (no request completed)."""
    values = {name: summary.statistic(name) for name in METRICS}
    return {name: None if value is None else float(value) for name, value in values.items()}


def best_of(repeats: list[Repeat]) -> tuple[dict[str, float | None], dict[str, float | None]]:
    """Per metric, the best measured repeat (highest throughput, lowest time) and the simulation of the same repeat.

    Repeats in which the client stalled, or that ran while the server's speed had changed, are not
    candidates; with none left every figure is None.
    """
    valid = [r for r in repeats if not client_stalled(r) and not r.get("disturbed")]
    measured: dict[str, float | None] = dict.fromkeys(METRICS)
    simulated: dict[str, float | None] = dict.fromkeys(METRICS)
    for k in METRICS:
        candidates = [(value, r["simulated"][k]) for r in valid if (value := r["measured"][k]) is not None]
        if candidates:
            pick = max if k == "output_throughput" else min
            measured[k], simulated[k] = pick(candidates, key=lambda pair: pair[0])
    return measured, simulated


def median_abs_errors(points: list[PointResult]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for name in METRICS:
        errors = [abs(e) for p in points if (e := p.error_pct.get(name)) is not None]
        out[name] = statistics.median(errors) if errors else None
    return out


@dataclass(frozen=True)
class ValidateRequest:
    """`servelab validate`: which profile, which live server, which points, and where the report goes.

    The measured runs go to `<out>.runs/` beside the report; an earlier report or runs there are data, replaced only
    with `overwrite`. `engine_args` are the server's flags where they differ from the calibrated ones.
    """

    calibration: Path
    base_url: str
    out: Path = Path("validation.json")
    points: str = "default"
    engine_args: str = ""
    repeats: int = 3
    served_model: str | None = None
    api_key: str | None = None
    overwrite: bool = False

    @property
    def runs_dir(self) -> Path:
        return self.out.with_name(self.out.stem + ".runs")


def run(request: ValidateRequest, progress: Callable[[str], None] = lambda _: None) -> ValidationReport:
    """Validate the profile on the live server, streamed as the probes were (exact output lengths); write the report.

    Every input is checked (profile, points, flags, an earlier report) before any request is sent.
    """
    profile = load_profile(request.calibration)
    points = points_named(request.points)
    deployment_from_profile(profile, request.engine_args)  # bad flags fail before any request
    replace_earlier_validation(request.out, request.runs_dir, request.overwrite)
    target = HttpTarget(
        request.base_url,
        model=request.served_model,
        api_key=request.api_key,
        ignore_eos=True,
        extra_body=PROBE_EXTRA_BODY,
        request_timeout=300.0,
    )
    info = target.preflight()
    report = validate_on(
        target,
        profile,
        request.runs_dir,
        server=ServerRef(base_url=target.base_url, model=info["model"]),
        engine_args=request.engine_args,
        points=points,
        repeats=request.repeats,
        progress=progress,
    )
    request.out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(request.out, report_json(report))
    return report


def report_json(report: ValidationReport) -> str:
    """validation.json's text: as validate has always written it (Python's float spelling, two-space indent)."""
    return json.dumps(report.model_dump(mode="json"), indent=2) + "\n"


def replace_earlier_validation(out: Path, runs: Path, overwrite: bool) -> None:
    """An earlier validation's report and measured runs are data: refused unless `overwrite`, which removes them."""
    earlier = [str(p) for p in (out, runs) if p.exists()]
    if earlier and not overwrite:
        raise ValidateError(
            f"--out {out}: {' and '.join(earlier)} already hold an earlier validation; pass --overwrite "
            "to replace them, or choose another --out"
        )
    if overwrite and runs.is_dir():
        shutil.rmtree(runs)


def validate_on(
    target: Target,
    profile: CalibrationProfile,
    out_dir: Path,
    *,
    server: ServerRef | None = None,
    engine_args: str = "",
    points: tuple[Point, ...] = DEFAULT_POINTS,
    repeats: int = 3,
    seed: int = 1,
    progress: Callable[[str], None] = lambda _: None,
) -> ValidationReport:
    """Measure each point on `target` and simulate it with the profile: the report `validate` prints and saves.

    `engine_args` are the flags the server now runs with where they differ from
    the calibrated ones (they override the profile's, flag by flag). Each point
    runs `repeats` times with fresh requests, interleaved with the other points;
    each metric is judged on its best repeat (see the module docstring).
    """
    if not points:
        raise ValidateError("no validation points")
    if repeats < 1:
        raise ValidateError(f"repeats must be at least 1, got {repeats}")
    deployment = deployment_from_profile(profile, engine_args)
    session = _Session(target, deployment, out_dir, progress)
    session.warm_up()
    host = HostWatch().start()
    runs, timings = session.measure(points, repeats, seed)
    speed = speed_checks(profile.reference, timings)
    for repeat in (x for point_runs in runs.values() for x in point_runs):
        repeat["disturbed"] = any(
            c is not None and c.changed for c in (speed[repeat["round"]], speed[repeat["round"] + 1])
        )
    results = [point_result(point, runs[point.name]) for point in points]
    medians = median_abs_errors(results)
    conditions = host.conditions(gpus=True)
    return ValidationReport(
        kind="servelab.validation",
        created_at=time.time(),
        server=server or ServerRef(),
        profile=ProfileRef(created_at=profile.created_at, engine_args=profile.engine_args, gpu=profile.gpu),
        engine_args=deployment.engine_args(),
        engine_config=asdict(deployment.config),
        host=conditions,
        reference=reference_report(profile, timings, speed),
        warnings=speed_warnings(profile.reference, timings, speed)
        + condition_changes(profile.host, conditions, now_label="during validate", then_label="at calibration"),
        points=results,
        median_abs_error_pct=medians,
        bounds_pct=BOUNDS_PCT,
        goals_pct=GOALS_PCT,
        within_bounds=all((m := medians[k]) is not None and m <= b for k, b in BOUNDS_PCT.items()),
    )


class _Session:
    """The runs of one validation: the server's warm-up, its reference timings and every point's repeats."""

    def __init__(self, target: Target, deployment: Deployment, out_dir: Path, progress: Callable[[str], None]) -> None:
        self.target, self.deployment, self.out_dir, self.progress = target, deployment, out_dir, progress
        self.sim = deployment.sim_target()
        self.run_info = RunInfo.begun(verb="validate", engine_args=deployment.engine_args())

    def warm_up(self) -> None:
        d = self.deployment
        max_len = d.config.max_model_len or d.model.max_position_embeddings
        warm = [
            RequestSpec(i, random_prompt(np.random.default_rng(i), min(n, max_len - 9), d.model.vocab_size), 8)
            for i, n in enumerate((16, 256, 1024))
        ]
        run_into(self.target, LoadPlan(warm, max_concurrency=1), self.out_dir / "warmup", self.run_info)

    def reference(self, label: str, warm_up: bool = False) -> ReferenceTiming:
        return time_reference(
            self.target,
            self.deployment.config.max_num_seqs,
            self.deployment.model.vocab_size,
            self.out_dir / "reference" / label,
            self.run_info,
            warm_up=warm_up,
        )

    def measure(
        self, points: tuple[Point, ...], repeats: int, seed: int
    ) -> tuple[dict[str, list[Repeat]], list[tuple[str, ReferenceTiming]]]:
        """Every point `repeats` times, interleaved, with a reference timing before the first round and after each."""
        plans = [
            [point_plan(p, self.deployment, self.sim, seed + 1000 * r + i) for i, p in enumerate(points)]
            for r in range(repeats)
        ]
        timings = [("before repeat 1", self.reference("before-repeat-1", warm_up=True))]
        runs: dict[str, list[Repeat]] = {p.name: [] for p in points}
        for r, row in enumerate(plans):
            for point, plan in zip(points, row):
                runs[point.name].append(self.repeat(point, plan, r))
            timings.append((f"after repeat {r + 1}", self.reference(f"after-repeat-{r + 1}")))
            self.progress(f"repeat {r + 1} of {repeats} done")
        return runs, timings

    def repeat(self, point: Point, plan: LoadPlan, round_: int) -> Repeat:
        directory = self.out_dir / f"repeat-{round_ + 1}" / point.name
        records, _, _ = run_into(self.target, plan, directory, self.run_info)
        summary = summarize(counted(records, plan))
        if summary.failed:
            kinds = ", ".join(sorted(summary.errors_by_kind))
            raise ValidateError(f"point {point.name}: {summary.failed} requests failed ({kinds}); see {directory}")
        return {
            "workload": plan.description,
            "directory": str(directory),
            "bunched": bunched_fraction(counted(records, plan)),
            "measured": figures(summary),
            "simulated": figures(simulate(self.sim, plan)),
            "round": round_,
        }


def point_result(point: Point, repeats: list[Repeat]) -> PointResult:
    """One point's report: each metric's best repeat against its own simulation, and the repeats set aside."""
    measured, simulated = best_of(repeats)
    return PointResult(
        point=point.name,
        shape=asdict(point),
        measured=measured,
        simulated=simulated,
        error_pct=compare(measured, simulated),
        stalled_repeats=sum(client_stalled(r) for r in repeats),
        disturbed_repeats=sum(r["disturbed"] for r in repeats),
        repeats=repeats,
    )


def speed_checks(
    calibrated: ReferenceTiming | None, timings: list[tuple[str, ReferenceTiming]]
) -> list[SpeedChange | None]:
    """Each timing against the profile's (None where there is nothing comparable: no reference, another workload,
    stalls)."""
    if calibrated is None:
        return [None] * len(timings)
    return [calibrated.speed_change(t) if t.workload == calibrated.workload else None for _, t in timings]


def reference_report(
    profile: CalibrationProfile, timings: list[tuple[str, ReferenceTiming]], speed: list[SpeedChange | None]
) -> dict[str, object]:
    def described(t: ReferenceTiming) -> dict[str, object]:
        return {**t.model_dump(), "median_ms": t.median_ms, "spread_pct": t.spread_pct}

    return {
        "calibrated": None if profile.reference is None else described(profile.reference),
        "timings": [
            {
                "when": label,
                **described(t),
                "change_pct": None if c is None else c.change_pct,
                "changed": None if c is None else c.changed,
            }
            for (label, t), c in zip(timings, speed)
        ],
    }


def speed_warnings(
    calibrated: ReferenceTiming | None, timings: list[tuple[str, ReferenceTiming]], speed: list[SpeedChange | None]
) -> list[str]:
    """One line per timing that found the server at another speed, or why no comparison was possible."""
    if calibrated is None:
        return [
            "the profile has no reference step time (written before schema 3, or fitted from runs by calibrate "
            "--from): the server's speed since calibration cannot be checked; re-run calibrate against the server"
        ]
    out = []
    if (too_wide := reference_too_wide(calibrated)) is not None:
        out.append(
            f"the calibration profile is unreliable: {too_wide}. A round counts as disturbed only when the "
            "speed moved beyond the spreads of both timings, so against this one no round can be: the errors "
            "below may be the host's, not the model's; re-run calibrate on a quiet host"
        )
    out += [
        f"{label}: {c.describe()}; the repeats it brackets are reported as disturbed and not judged"
        for (label, _), c in zip(timings, speed)
        if c is not None and c.changed
    ]
    if all(c is None for c in speed):
        workloads = {t.workload for _, t in timings}
        out.append(
            f"the reference step time could not be compared with the profile's ({calibrated.workload} vs "
            f"{', '.join(sorted(workloads))}, or every run stalled): the server's speed is unchecked"
        )
    return out
