"""Fitting the roofline's coefficients to step times measured on a real server, and the profile that keeps them.

The fit never evaluates a formula of its own: every prediction comes from
`RooflineCostModel.step_time` built from the candidate coefficients, so what
is fitted is exactly what the simulator will run.

What can be fitted depends on the hardware. On a catalogue GPU the peaks are
datasheet facts and the fit moves only efficiencies (fractions of peak) and
CPU overheads. The generic `cpu` device has placeholder peaks, so there every
rate is free; the fitted device keeps the largest fitted rate of each kind as
its peak and the efficiencies say how far below it the other paths run.

The parameters, all positive: the effective FLOP/s of linear layers and of
attention, the effective bytes/s of weight streaming and of KV reads, the
fixed step overhead, the per-scheduled-request overhead, the overhead of a
step that admits prefills, the wake-up cost of a step after an idle spell
and its time constant (all `CostCoefficients`), and the one-way
client<->server latency (the simulator's `network_latency`, which also
absorbs per-request frontend work that is not engine time).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from servelab.atomic import write_text_atomic
from servelab.perf.cost_model import CostCoefficients, RooflineCostModel, StepBatch
from servelab.perf.engine_config import EngineConfig
from servelab.perf.errors import PerfConfigError
from servelab.perf.hardware import Hardware
from servelab.perf.models import ModelSpec
from servelab.renames import upgraded

PROFILE_KIND = "servelab.calibration"
PROFILE_SCHEMA_VERSION = 5
"""5: a profile may be fitted from measured runs (`origin` "runs", `environment`); older ones are all "probes".
4: probe figures named as `vllm bench serve` names them (median_ttft_ms; 3 and 2 said ttft_p50_ms, renamed on reading).
3: the host's conditions and a reference step time, so later runs can tell a changed host (2 is read without them).
2: the prefill and idle-wake costs are CostCoefficients terms (1 had a per-prefill-chunk cost beside them)."""
READABLE_SCHEMA_VERSIONS = (2, 3, 4, PROFILE_SCHEMA_VERSION)
STATISTICS_RENAMED_IN = 4
"""The schema that took vLLM's statistic names: older profiles are renamed on reading (servelab/renames.py)."""

_RATES = ("linear_flops", "attention_flops", "weight_bandwidth", "kv_bandwidth")
_COEFFICIENT_OVERHEADS = (
    "step_overhead_s",
    "per_request_overhead_s",
    "prefill_step_overhead_s",
    "idle_wake_s",
    "idle_wake_time_constant_s",
)
_OVERHEADS = _COEFFICIENT_OVERHEADS + ("network_latency_s",)
PARAMETERS = _RATES + _OVERHEADS
"""Fitted quantities, in the order of the least-squares vector."""

_GPU_EFFICIENCY_RANGE = (0.02, 1.0)
"""On a datasheet chip, a path reaching under 2% of peak means the model, not the chip, is wrong."""
_CPU_RATE_RANGE = (1e-3, 1e3)
"""Placeholder peaks are order-of-magnitude guesses: the fitted rate may sit far either side."""
_MAX_OVERHEAD_S = 1.0
_MIN_TIME_CONSTANT_S = 1e-4
"""The wake-up time constant divides; its lower bound keeps it off zero."""


@dataclass(frozen=True, slots=True)
class StepObservation:
    """One measured time the step model must reproduce: some engine steps plus some one-way latency legs.

    A time-to-first-token at concurrency 1 is its prefill step(s) plus two legs
    (request in, token out); a decode time per output token is one step, no legs.
    `idle_before_s`: how long the engine sat idle before the first step (its
    wake-up cost is part of the time). `weight` scales its residual (repeated,
    stabler measurements weigh more).
    """

    label: str
    steps: tuple[StepBatch, ...]
    seconds: float
    latency_legs: int = 0
    weight: float = 1.0
    idle_before_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.steps and not self.latency_legs:
            raise PerfConfigError(f"observation {self.label!r} has neither steps nor latency legs")
        if not (self.seconds > 0 and math.isfinite(self.seconds)):
            raise PerfConfigError(f"observation {self.label!r} has a non-positive or non-finite time {self.seconds!r}")


@dataclass(frozen=True, slots=True)
class Residual:
    label: str
    measured_s: float
    predicted_s: float

    @property
    def rel_error(self) -> float:
        return (self.predicted_s - self.measured_s) / self.measured_s


@dataclass(frozen=True)
class CostFit:
    """The fitted device and coefficients, and how well they reproduce each observation."""

    hardware: Hardware
    coefficients: CostCoefficients
    network_latency_s: float
    rates: dict[str, float]
    """Fitted effective rates (FLOP/s, bytes/s) and overheads (s), by PARAMETERS name."""
    residuals: tuple[Residual, ...]
    converged: bool
    message: str

    @property
    def rms_rel_error(self) -> float:
        errors = [r.rel_error for r in self.residuals]
        return float(np.sqrt(np.mean(np.square(errors)))) if errors else 0.0

    @property
    def max_abs_rel_error(self) -> float:
        return max((abs(r.rel_error) for r in self.residuals), default=0.0)


class _Space:
    """Maps the least-squares vector to a (Hardware, CostCoefficients, latency) the cost model accepts.

    Rates live in log space (they span decades); overheads in milliseconds,
    so every coordinate moves on a scale of about one.
    """

    def __init__(self, hardware: Hardware, model: ModelSpec, config: EngineConfig) -> None:
        self.hardware, self.model, self.config = hardware, model, config
        self.compute_dtype = RooflineCostModel(hardware, model, config).weight_format.compute_dtype
        self.free_peaks = hardware.vendor == "cpu"
        self.peaks = np.array(
            [
                hardware.peak_flops(self.compute_dtype),
                hardware.peak_flops("bf16"),
                hardware.memory_bandwidth,
                hardware.memory_bandwidth,
            ]
        )
        if np.any(self.peaks <= 0):
            raise PerfConfigError(f"{hardware.name} has no {self.compute_dtype} rate to calibrate")
        lo, hi = _CPU_RATE_RANGE if self.free_peaks else _GPU_EFFICIENCY_RANGE
        n = len(_OVERHEADS)
        lower_overheads = np.array(
            [_MIN_TIME_CONSTANT_S if k == "idle_wake_time_constant_s" else 0.0 for k in _OVERHEADS]
        )
        self.lower = np.concatenate([np.log(self.peaks * lo), lower_overheads * 1e3])
        self.upper = np.concatenate([np.log(self.peaks * hi), np.full(n, _MAX_OVERHEAD_S * 1e3)])

    def start(self, coefficients: CostCoefficients, latency_s: float) -> np.ndarray:
        c = coefficients
        effs = np.array(
            [c.compute_efficiency, c.attention_compute_efficiency, c.memory_efficiency, c.attention_memory_efficiency]
        )
        # Overheads the start point knows nothing of begin at a fraction of the step overhead, inside the box.
        guesses = {"prefill_step_overhead_s": 0.25 * c.step_overhead_s, "idle_wake_s": c.step_overhead_s}
        overheads = np.array([getattr(c, k) or guesses.get(k, 0.0) for k in _COEFFICIENT_OVERHEADS] + [latency_s]) * 1e3
        x = np.concatenate([np.log(self.peaks * effs), overheads])
        # Strictly inside the box: least_squares refuses a start on a bound.
        span = self.upper - self.lower
        return np.clip(x, self.lower + 1e-6 * span, self.upper - 1e-6 * span)

    def rates(self, x: np.ndarray) -> dict[str, float]:
        values = np.concatenate([np.exp(x[:4]), x[4:] / 1e3])
        return dict(zip(PARAMETERS, (float(v) for v in values)))

    def materialize(
        self, x: np.ndarray, base: CostCoefficients, source: str
    ) -> tuple[Hardware, CostCoefficients, float]:
        """(device, coefficients, one-way latency) for the vector `x`."""
        r = self.rates(x)
        hw = self.hardware
        if self.free_peaks:
            update: dict[str, Any] = {
                "memory_bandwidth_gbs": max(r["weight_bandwidth"], r["kv_bandwidth"]) / 1e9,
                "placeholder": False,
                "sources": {"datasheet": source},
            }
            if self.compute_dtype == "bf16":
                update["bf16_tflops"] = max(r["linear_flops"], r["attention_flops"]) / 1e12
            else:
                update[f"{self.compute_dtype}_tflops"] = r["linear_flops"] / 1e12
                update["bf16_tflops"] = r["attention_flops"] / 1e12
            hw = hw.model_copy(update=update)
        bw = hw.memory_bandwidth

        def eff(rate: float, peak: float) -> float:
            return min(1.0, rate / peak)

        coefficients = base.model_copy(
            update={
                "compute_efficiency": eff(r["linear_flops"], hw.peak_flops(self.compute_dtype)),
                "attention_compute_efficiency": eff(r["attention_flops"], hw.peak_flops("bf16")),
                "memory_efficiency": eff(r["weight_bandwidth"], bw),
                "attention_memory_efficiency": eff(r["kv_bandwidth"], bw),
                **{k: r[k] for k in _COEFFICIENT_OVERHEADS},
            }
        )
        return hw, CostCoefficients.model_validate(coefficients.model_dump()), r["network_latency_s"]

    def predict(self, x: np.ndarray, base: CostCoefficients, observations: Sequence[StepObservation]) -> np.ndarray:
        hw, coefficients, latency = self.materialize(x, base, "fit in progress")
        cost = RooflineCostModel(hw, self.model, self.config, coefficients)
        return np.array(
            [
                sum(cost.step_time(b) for b in o.steps) + cost.wake_time(o.idle_before_s) + o.latency_legs * latency
                for o in observations
            ]
        )


def fit_cost_model(
    hardware: Hardware,
    model: ModelSpec,
    config: EngineConfig,
    observations: Sequence[StepObservation],
    *,
    start: CostCoefficients | None = None,
    start_latency_s: float = 1e-3,
    source: str = "fitted by servelab calibrate",
) -> CostFit:
    """Least-squares fit of the roofline to `observations`, in relative errors so short and long times weigh alike.

    `config` must be resolved (the cost model reads its dtype, quantization and
    TP). Noise is handled before this point (each observation is a quartile
    over repeated passes), so the loss is plain squares: a robust loss here
    biased even noiseless fits.
    """
    if len(observations) < len(PARAMETERS):
        raise PerfConfigError(
            f"{len(observations)} observations cannot determine {len(PARAMETERS)} parameters; probe more"
        )
    base = start or CostCoefficients()
    space = _Space(hardware, model, config)
    measured = np.array([o.seconds for o in observations])
    weights = np.sqrt(np.array([o.weight for o in observations]))

    def residuals(x: np.ndarray) -> np.ndarray:
        return weights * (space.predict(x, base, observations) - measured) / measured

    from scipy.optimize import least_squares  # scipy only where a fit runs: the CLI's start-up stays light

    result = least_squares(
        residuals,
        space.start(base, start_latency_s),
        bounds=(space.lower, space.upper),
        x_scale=1.0,
        max_nfev=2000,
    )
    hw, coefficients, latency = space.materialize(result.x, base, source)
    predicted = space.predict(result.x, base, observations)
    return CostFit(
        hardware=hw,
        coefficients=coefficients,
        network_latency_s=latency,
        rates=space.rates(result.x),
        residuals=tuple(Residual(o.label, o.seconds, float(p)) for o, p in zip(observations, predicted)),
        converged=bool(result.success),
        message=str(result.message),
    )


# -- the profile ---------------------------------------------------------------


MIN_SPEED_CHANGE = 0.03
"""A reference step time that moved by less than this share is the same speed, however tight its spread."""


class ReferenceTiming(BaseModel):
    """One fixed workload's decode step time, measured in several runs: the server's speed, and how steady it is.

    `calibrate` measures it before and after its probes; `validate` again
    before, between and after its rounds. The same server on the same host
    reproduces it within its spread; a host with other jobs, throttled clocks
    or another build of the server does not. `spread_pct` is half the range
    of the runs over their median: the run-to-run noise of this host.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    workload: str
    """What was timed (probe name: batch, prompt and output tokens)."""
    runs_ms: list[float]
    """The median time per output token of each run in which the client saw token timing."""
    stalled_runs: int = 0
    """Runs left out because the client read tokens in bunches (it did not observe the step time)."""

    @property
    def median_ms(self) -> float | None:
        return float(np.median(self.runs_ms)) if self.runs_ms else None

    @property
    def spread_pct(self) -> float | None:
        median = self.median_ms
        return 50.0 * (max(self.runs_ms) - min(self.runs_ms)) / median if median else None

    def speed_change(self, now: ReferenceTiming) -> SpeedChange | None:
        """How `now` compares with this (earlier) timing; None when either has no runs to compare."""
        then_ms, now_ms = self.median_ms, now.median_ms
        if then_ms is None or now_ms is None or self.spread_pct is None or now.spread_pct is None:
            return None
        change = (now_ms - then_ms) / then_ms
        noise = (self.spread_pct + now.spread_pct) / 100.0
        return SpeedChange(then_ms, now_ms, 100.0 * change, 100.0 * noise, abs(change) > max(noise, MIN_SPEED_CHANGE))


@dataclass(frozen=True, slots=True)
class SpeedChange:
    """A reference step time then and now: changed when the two differ by more than both runs' spreads together."""

    then_ms: float
    now_ms: float
    change_pct: float
    noise_pct: float
    changed: bool

    def describe(self) -> str:
        speed = "slower" if self.change_pct > 0 else "faster"
        verdict = (
            f"the server runs {abs(self.change_pct):.0f}% {speed} than when calibrated"
            if self.changed
            else "the server runs at its calibrated speed"
        )
        return (
            f"{verdict}: reference step {self.now_ms:.2f} ms vs {self.then_ms:.2f} ms "
            f"(run-to-run spread of both: {self.noise_pct:.1f}%)"
        )


MAX_REFERENCE_SPREAD_PCT = 15.0
"""A reference step time whose runs spread wider than this (half range over median) cannot judge a speed change:
validate's disturbed-round check compares timings within their spreads, and at 15% a server 30% slower passes as
steady. The vLLM CPU server on a quiet two-core host spreads 1-5%; a host with other jobs spread 87% (5.7-30 ms)."""


def reference_too_wide(reference: ReferenceTiming | None) -> str | None:
    """One sentence when `reference` is too noisy to judge a server's speed by (None when it is fine or absent)."""
    if reference is None or reference.spread_pct is None or reference.spread_pct <= MAX_REFERENCE_SPREAD_PCT:
        return None
    lo, hi = min(reference.runs_ms), max(reference.runs_ms)
    return (
        f"the reference step time ({reference.workload}) ranged {lo:.1f}-{hi:.1f} ms over {len(reference.runs_ms)} "
        f"runs, a spread of {reference.spread_pct:.0f}% (at most {MAX_REFERENCE_SPREAD_PCT:g}% can judge a speed "
        "change): the host was busy while it was measured"
    )


class CalibrationOrigin(StrEnum):
    PROBES = "probes"
    """`calibrate --base-url`: probes of a live server, the roofline's coefficients fitted to them."""
    RUNS = "runs"
    """`calibrate --from`: the environment's few parameters fitted to benchmark runs the user already had."""


class MetricFit(BaseModel):
    """One figure of one run: measured, simulated with the fitted environment, and simulated from specs alone."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    measured: float
    fitted: float | None
    specs_only: float | None

    @property
    def fitted_error_pct(self) -> float | None:
        return None if self.fitted is None else 100.0 * (self.fitted - self.measured) / self.measured

    @property
    def specs_only_error_pct(self) -> float | None:
        return None if self.specs_only is None else 100.0 * (self.specs_only - self.measured) / self.measured


class RunFit(BaseModel):
    """One measured run the environment was fitted to, and how well the fit reproduces it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str
    format: str
    requests: int
    lengths_from: str
    metrics: dict[str, MetricFit]
    notes: list[str] = Field(default_factory=list)


class EnvironmentFit(BaseModel):
    """What `calibrate --from` fitted: the few parameters an environment changes, as scale factors on the specs.

    The same GPU from the catalogue, the same vLLM CPU-side costs, the same
    step model, with: its compute and memory peaks x `compute_scale` and
    `memory_scale`; vLLM's measured engine-core CPU costs (and the host's
    eager kernel launches) x `engine_cpu_factor`, its API server's x
    `api_cpu_factor` (servelab/perf/vllm_cpu_costs.py); and a fixed
    `outside_engine_s` added to every time to first token (a gateway or proxy
    in front). A parameter the runs could not move is kept at its specs-only
    value and named in `unconstrained`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    compute_scale: float = Field(1.0, gt=0)
    memory_scale: float = Field(1.0, gt=0)
    engine_cpu_factor: float = Field(gt=0)
    api_cpu_factor: float = Field(gt=0)
    outside_engine_s: float = Field(0.0, ge=0)
    vllm_version: str | None = None
    """The --vllm-version the runs were served by (None: the modelled release)."""
    specs_only: dict[str, float]
    """Each parameter's specs-only value, where the fit started."""
    unconstrained: list[str] = Field(default_factory=list)
    """Parameters the runs could not constrain (kept at their specs-only value)."""
    sensitivity: dict[str, float] = Field(default_factory=dict)
    """Per parameter, the largest change of any run's figure (log ratio) when it moves by its test step."""
    objective: float
    """Mean squared log error of the fitted figures (0: every figure reproduced exactly)."""
    evaluations: int
    runs: list[RunFit]


class ProfileError(PerfConfigError):
    """A calibration profile that cannot be read or is of another schema."""


class CalibrationProfile(BaseModel):
    """What `calibrate` learned about one hardware + model pair, and the evidence for it.

    The profile describes the machine and the model, not one configuration:
    `engine_args` is what the probes ran with, and any later use may override it.
    """

    model_config = ConfigDict(extra="forbid")

    kind: str = PROFILE_KIND
    schema_version: int = PROFILE_SCHEMA_VERSION
    created_at: float
    server: dict[str, Any] = Field(default_factory=dict)
    """Where it was measured: base URL, served model, what the server reported of its cache."""
    hardware: Hardware
    """The device as fitted (for `cpu`, its rates are the fitted ones)."""
    gpu: str
    """The catalogue name the fit started from."""
    model_source: str
    """The --model given (path or catalogue name)."""
    model_spec: dict[str, Any]
    """The architecture as read then, so the profile stands alone if the model directory moves."""
    engine_args: str
    """The vLLM flags the probed server ran with (as mirrored for the simulator)."""
    engine_config: dict[str, Any]
    coefficients: CostCoefficients
    network_latency_s: float = Field(ge=0)
    """One-way client<->server latency, without the API server's per-request cost when that was fitted."""
    frontend_s_per_request: float = Field(0.0, ge=0)
    """The API server's serial admission cost per request (SimTarget's frontend), fitted from burst arrivals."""
    rates: dict[str, float] = Field(default_factory=dict)
    fit: dict[str, Any] = Field(default_factory=dict)
    """Residuals of the step-model fit: per observation, rms, max, convergence (probes only)."""
    simulated_probes: list[dict[str, Any]] = Field(default_factory=list)
    """Each probe re-run through the simulator with the fitted profile: predicted vs measured."""
    probes: list[dict[str, Any]] = Field(default_factory=list)
    """What it was fitted on: every probe's shape, repeats, measured medians and results directories."""
    budget_s: float = 0.0
    elapsed_s: float = 0.0
    host: dict[str, Any] = Field(default_factory=dict)
    """The host's conditions over the calibration (servelab.metrics.host): load, CPU steal, GPU clocks; {} in schema 2."""
    reference: ReferenceTiming | None = None
    """The reference step time before and after the probes, for later speed checks; None in schema 2."""
    origin: CalibrationOrigin = CalibrationOrigin.PROBES
    environment: EnvironmentFit | None = None
    """What `calibrate --from` fitted (origin "runs"); None for probes."""

    @property
    def unreliable(self) -> str | None:
        """Why this profile's speed gauge cannot be trusted (its reference spread too wide), or None."""
        return reference_too_wide(self.reference)

    def model(self) -> ModelSpec:
        return ModelSpec(**self.model_spec)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, self.model_dump_json(indent=2) + "\n")


def model_spec_dict(model: ModelSpec) -> dict[str, Any]:
    return asdict(model)


def load_profile(path: str | Path) -> CalibrationProfile:
    """Read a profile written by `calibrate`; ProfileError naming the file on anything else."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ProfileError(f"cannot read calibration profile {path}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise ProfileError(f"calibration profile {path} is not JSON: {exc}") from exc
    if not isinstance(raw, dict) or raw.get("kind") != PROFILE_KIND:
        raise ProfileError(f"{path} is not a servelab calibration profile (no kind {PROFILE_KIND!r})")
    if raw.get("schema_version") == 1:
        raise ProfileError(
            f"calibration profile {path} has schema version 1, whose per-prefill-chunk cost was fitted outside the "
            f"roofline and mostly measured the engine waking from idle; version {PROFILE_SCHEMA_VERSION} fits "
            "prefill_step_overhead_s and idle_wake_s instead and the old number cannot be split into them: re-run "
            "calibrate"
        )
    if raw.get("schema_version") not in READABLE_SCHEMA_VERSIONS:
        raise ProfileError(
            f"calibration profile {path} has schema version {raw.get('schema_version')!r}; "
            f"this servelab reads versions {', '.join(map(str, READABLE_SCHEMA_VERSIONS))}: re-run calibrate"
        )
    try:
        return CalibrationProfile.model_validate(upgraded(raw, STATISTICS_RENAMED_IN))
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise ProfileError(f"calibration profile {path} is invalid: {problems}") from exc
