"""A calibration profile: what `calibrate` learned about one hardware + model pair, and the evidence for it.

The profile file's types, in the bottom package so `servelab schema profile` and every reader of a profile get them
without the fit (numpy, scipy) or the simulator; servelab/perf/calibration.py fits and reads profiles.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from servelab.atomic import write_text_atomic
from servelab.schemas.hardware import Hardware

PROFILE_KIND = "servelab.calibration"
PROFILE_SCHEMA_VERSION = 5
"""5: a profile may be fitted from measured runs (`origin` "runs", `environment`); older ones are all "probes".
4: probe figures named as `vllm bench serve` names them (median_ttft_ms; 3 and 2 said ttft_p50_ms, renamed on reading).
3: the host's conditions and a reference step time, so later runs can tell a changed host (2 is read without them).
2: the prefill and idle-wake costs are CostCoefficients terms (1 had a per-prefill-chunk cost beside them)."""


class CostCoefficients(BaseModel):
    """Every tunable number of the roofline in one place, so `calibrate` can fit and save them.

    Efficiencies are fractions of the datasheet peak actually reached; defaults are
    typical of vLLM on A100/H100 for 7-8B models (large bf16 GEMMs reach ~70% of
    peak, decode weight streaming ~80% of HBM bandwidth, FlashAttention prefill ~50%
    of peak, paged decode attention ~70% of bandwidth) and a V1 step with CUDA graphs
    costs ~0.8 ms of scheduling, input preparation and sampling outside the GPU
    kernels (TPOT at batch 1 is ~1 ms above weights/bandwidth on both chips).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    compute_efficiency: float = Field(0.7, gt=0, le=1)
    memory_efficiency: float = Field(0.8, gt=0, le=1)
    attention_compute_efficiency: float = Field(0.5, gt=0, le=1)
    attention_memory_efficiency: float = Field(0.7, gt=0, le=1)
    interconnect_efficiency: float = Field(0.7, gt=0, le=1)
    allreduce_latency_s: float = Field(8e-6, ge=0)
    """Fixed cost of one all-reduce launch (vLLM's custom all-reduce, small messages)."""
    step_overhead_s: float = Field(8e-4, ge=0)
    per_request_overhead_s: float = Field(8e-6, ge=0)
    """CPU cost per scheduled request per step (input preparation, sampling bookkeeping)."""
    prefill_step_overhead_s: float = Field(0.0, ge=0)
    """CPU cost of a step that admits prefill chunks, once per step whatever their number.

    The model runner changes its persistent batch: new request states, block
    table rows, and the sampling metadata rebuilt for the new composition
    (vLLM 0.32 `GPUModelRunner._update_states` + `InputBatch.refresh_metadata`,
    the same code on the CPU backend). A request leaving costs about as much on
    a later step; in a closed loop every request joins and leaves once, so the
    fitted value stands for both. Measured on the vLLM CPU server with the tiny
    model: ~0.2 ms per such step plus ~0.1 ms per admitted request (the latter is
    `per_request_overhead_s`). 0 (unknown) for catalogue GPUs.
    """
    idle_wake_s: float = Field(0.0, ge=0)
    """Extra time of the first step after the engine sat idle long (no request to run).

    While idle the engine loop blocks on its input queue and the host lets the
    cores idle: caches go cold and clocks drop, so the next step runs slower.
    On the vLLM CPU server (2 shared cores) the engine's own prefill time grew
    ~1.9 ms after 50-100 ms of idleness over back-to-back requests. Charged as
    `idle_wake_s * (1 - exp(-idle / idle_wake_time_constant_s))`, which fits the
    engine's prefill times after 2-200 ms idle within 7% (docs/validation.md).
    0 (unknown) for catalogue GPUs.
    """
    idle_wake_time_constant_s: float = Field(0.02, gt=0)
    """How fast the wake-up cost approaches `idle_wake_s` with idle time (about 20 ms on the CPU server)."""
    eager_launch_s_per_layer: float = Field(6.4e-4, ge=0)
    """Host time to launch one decoder layer's kernels op by op from Python, for a step run without CUDA graphs.

    Such a step cannot end before the host has launched every kernel, so its GPU part is at least
    layers x this (the GPU waits on the launches when they are slower than its kernels). A host property,
    so the default is read off a published eager run: vLLM `--enforce-eager` on an A100-80GB host, Llama-3.1-8B
    at 20 concurrent requests, median TPOT 20.8 ms (staru09/llm_infra_bench, published.yaml), which the
    replay meets at 0.64 ms. Measured on three H200 hosts for an engine-like decoder (benchmarks/gpu_step_probe.py,
    2026-12-04): medians 0.63, 0.34 and 0.48 ms, so hosts differ ~2x; a calibration profile's coefficients carry
    another host's value.
    """

    def cpu_step_time(self, num_scheduled: int, admits_prefill: bool) -> float:
        """The engine core's CPU share of a step's time: the part async scheduling overlaps with the GPU.

        The same three terms the roofline adds to every step (schedule, input
        preparation, output bookkeeping), so step time minus this is the GPU's.
        """
        cpu = self.step_overhead_s + num_scheduled * self.per_request_overhead_s
        return cpu + self.prefill_step_overhead_s if admits_prefill else cpu

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    @classmethod
    def from_json(cls, text: str) -> CostCoefficients:
        return cls.model_validate_json(text)

    @classmethod
    def ideal(cls) -> CostCoefficients:
        """Datasheet peaks and no overhead: a strict lower bound on step time (upper bound on throughput)."""
        return cls(
            compute_efficiency=1,
            memory_efficiency=1,
            attention_compute_efficiency=1,
            attention_memory_efficiency=1,
            interconnect_efficiency=1,
            allreduce_latency_s=0,
            step_overhead_s=0,
            per_request_overhead_s=0,
            prefill_step_overhead_s=0,
            idle_wake_s=0,
        )


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
        return float(statistics.median(self.runs_ms)) if self.runs_ms else None

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
    """The host's conditions over the calibration (servelab.metrics.host): load, CPU steal, GPU clocks.

    {} in schema 2."""
    reference: ReferenceTiming | None = None
    """The reference step time before and after the probes, for later speed checks; None in schema 2."""
    origin: CalibrationOrigin = CalibrationOrigin.PROBES
    environment: EnvironmentFit | None = None
    """What `calibrate --from` fitted (origin "runs"); None for probes."""

    @property
    def unreliable(self) -> str | None:
        """Why this profile's speed gauge cannot be trusted (its reference spread too wide), or None."""
        return reference_too_wide(self.reference)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, self.model_dump_json(indent=2) + "\n")
