"""Fitting the roofline's coefficients to step times measured on a real server, and reading the profile that keeps
them (its types: servelab/schemas/profile.py).

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
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from servelab.perf.cost_model import CostCoefficients, RooflineCostModel, StepBatch
from servelab.perf.engine_config import EngineConfig
from servelab.perf.errors import PerfConfigError
from servelab.perf.hardware import Hardware
from servelab.perf.models import ModelSpec
from servelab.renames import upgraded
from servelab.schemas.profile import PROFILE_KIND, PROFILE_SCHEMA_VERSION, CalibrationProfile
from servelab.schemas.results import Json

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
            update: dict[str, float | bool | dict[str, str]] = {
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


# -- reading a profile ---------------------------------------------------------


class ProfileError(PerfConfigError):
    """A calibration profile that cannot be read or is of another schema."""


SLIDING_FIELDS = ("sliding_window", "sliding_layers")
"""ModelSpec's sliding-window fields: saved only for a model that has such layers, so a profile of any other model
reads as it did before they existed (ModelSpec's defaults rebuild them)."""


def model_spec_dict(model: ModelSpec) -> Json:
    """The architecture as a profile saves it (`model_spec`: ModelSpec's fields, rebuilt by `ModelSpec(**...)`)."""
    fields = asdict(model)
    if not model.sliding_layers:
        for name in SLIDING_FIELDS:
            fields.pop(name)
    return fields


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
