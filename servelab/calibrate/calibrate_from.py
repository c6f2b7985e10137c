"""`calibrate --from`: fit the few parameters an environment changes to benchmark runs the user already has.

Offline: no server is needed. The deployment is given as for `simulate`
(GPU, model, engine flags, vLLM release); the runs say what was sent and
what was measured. A datasheet and a vLLM release fix almost everything
about a step's cost; what a particular machine changes is a handful of
scale factors, so only those are fitted:

  compute_scale      the GPU's compute peaks x this (its kernels run at another share of peak: clocks, power caps)
  memory_scale       its memory bandwidth x this
  engine_cpu_factor  vLLM's measured engine-core CPU costs (per step, per scheduled request, per admitting step;
                     servelab/perf/vllm_cpu_costs.py) and the host's time to launch a layer's kernels in a step
                     without CUDA graphs, x this: the host core's speed for the engine process
  api_cpu_factor     vLLM's measured API-server costs (per request, prompt token, output token, SSE chunk,
                     engine step) x this: the same for the API server's event loop. Two factors, not one: the
                     API server shares its host with the client and other processes and its loop's load
                     decides how tokens are bunched into chunks, so its speed can differ from the engine's
  outside_engine_s   a fixed time added to every time to first token: a gateway or proxy in front of vLLM

The simulator is in the loop: every candidate is judged by simulating the
runs' own requests and comparing its summary with the measured one, in log
ratios (so throughput and latency weigh alike). The fit is a bounded
least-squares search over few evaluations (scipy). A parameter that the runs
cannot move (compute when every run is decode-bound, the outside time when
every TTFT is seconds of queueing) keeps its specs-only value, and the
profile says so: that is decided by the sensitivity of the runs' figures to
a fixed step of each parameter.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np

from servelab.errors import InputError
from servelab.calibrate.request import CalibrateRequest
from servelab.metrics.imports import MeasuredRun, read_measured_runs
from servelab.metrics.records import MemorySink
from servelab.metrics.summary import summarize
from servelab.perf.calibration import model_spec_dict
from servelab.schemas.profile import CalibrationOrigin, CalibrationProfile, EnvironmentFit, MetricFit, RunFit
from servelab.perf.errors import PerfConfigError
from servelab.perf.vllm_cpu_costs import measured as measured_cpu_costs
from servelab.targets.deployment import Deployment, build_deployment
from servelab.targets.profile import with_environment
from servelab.workload.spec import LoadPlan

PARAMETERS = ("compute_scale", "memory_scale", "engine_cpu_factor", "api_cpu_factor", "outside_engine_s")
FITTED_METRICS = ("request_throughput", "mean_ttft_ms", "median_ttft_ms", "mean_tpot_ms", "median_tpot_ms")
"""What the fit reproduces: throughput, and TTFT and TPOT by mean and median (a run's p99 is too noisy to fit)."""
REPORTED_METRICS = (*FITTED_METRICS, "output_throughput", "mean_itl_ms", "mean_e2el_ms", "p99_ttft_ms", "p99_tpot_ms")
MAX_SIMULATED_REQUESTS = 4000
"""Requests simulated per run and evaluation; a longer run is cut to its first ones (said in its notes)."""
MIN_SENSITIVITY = 0.02
"""A parameter whose test step moves no fitted figure by 2% (log ratio) is not constrained by the runs."""
_OUTSIDE_UNIT_S = 0.01
"""The outside time is searched in units of 10 ms, so each coordinate moves on a scale of about one."""
_OUTSIDE_TEST_STEP_S = 0.02
_SCALE_TEST_STEP = math.log(1.5)
_GPU_SCALE_RANGE = (0.05, 2.0)
_PLACEHOLDER_SCALE_RANGE = (1e-3, 1e3)
"""A placeholder device (`cpu`) has order-of-magnitude peaks: its scales may sit far either side."""
_CPU_FACTOR_RANGE = (0.1, 20.0)
_MAX_OUTSIDE_S = 2.0
_MISSING_PENALTY = 5.0
"""The log error charged for a figure the simulation did not produce (nothing completed)."""


class CalibrateFromError(InputError):
    """A run or deployment `calibrate --from` cannot fit; raised before any fitting."""


@dataclass(frozen=True)
class Environment:
    """One candidate: the fitted parameters' values."""

    compute_scale: float
    memory_scale: float
    engine_cpu_factor: float
    api_cpu_factor: float
    outside_engine_s: float

    def vector(self) -> np.ndarray:
        return np.array(
            [
                math.log(self.compute_scale),
                math.log(self.memory_scale),
                math.log(self.engine_cpu_factor),
                math.log(self.api_cpu_factor),
                self.outside_engine_s / _OUTSIDE_UNIT_S,
            ]
        )

    @classmethod
    def from_vector(cls, x: np.ndarray) -> Environment:
        return cls(
            math.exp(x[0]), math.exp(x[1]), math.exp(x[2]), math.exp(x[3]), max(0.0, float(x[4])) * _OUTSIDE_UNIT_S
        )


# -- simulating the runs --------------------------------------------------------------------------------------------


def _capped(run: MeasuredRun) -> LoadPlan:
    plan = run.plan()
    assert isinstance(plan.requests, list)
    if len(plan.requests) > MAX_SIMULATED_REQUESTS:
        plan = replace(plan, requests=plan.requests[:MAX_SIMULATED_REQUESTS])
    return plan


def simulated(deployment: Deployment, run: MeasuredRun) -> dict[str, float | None]:
    """The simulated summary of the run's requests on `deployment` (REPORTED_METRICS; None where nothing completed)."""
    sink = MemorySink()
    deployment.sim_target().run(_capped(run), sink)
    summary = summarize(sink.records)
    values = {k: summary.statistic(k) for k in REPORTED_METRICS}
    return {k: (float(v) if v is not None and math.isfinite(v) else None) for k, v in values.items()}


def _log_errors(run: MeasuredRun, sim: dict[str, float | None]) -> list[float]:
    out = []
    for key in FITTED_METRICS:
        measured = run.measured.get(key)
        if measured is None or measured <= 0:
            continue
        value = sim.get(key)
        out.append(math.log(value / measured) if value is not None and value > 0 else _MISSING_PENALTY)
    return out


class _Objective:
    """The residual vector of a parameter vector (free parameters only), counting evaluations."""

    def __init__(self, runs: Sequence[MeasuredRun], base: Deployment, start: np.ndarray, free: list[int]) -> None:
        self.runs, self.base, self.start, self.free = runs, base, start, free
        self.evaluations = 0

    def full(self, x_free: np.ndarray) -> np.ndarray:
        x = self.start.copy()
        x[self.free] = x_free
        return x

    def residuals_at(self, x: np.ndarray) -> np.ndarray:
        self.evaluations += 1
        deployment = with_environment(self.base, Environment.from_vector(x))
        return np.array([e for run in self.runs for e in _log_errors(run, simulated(deployment, run))])

    def __call__(self, x_free: np.ndarray) -> np.ndarray:
        return self.residuals_at(self.full(x_free))


def _bounds(base: Deployment) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = _PLACEHOLDER_SCALE_RANGE if base.hardware.placeholder else _GPU_SCALE_RANGE
    cpu_lo, cpu_hi = math.log(_CPU_FACTOR_RANGE[0]), math.log(_CPU_FACTOR_RANGE[1])
    lower = np.array([math.log(lo), math.log(lo), cpu_lo, cpu_lo, 0.0])
    upper = np.array([math.log(hi), math.log(hi), cpu_hi, cpu_hi, _MAX_OUTSIDE_S / _OUTSIDE_UNIT_S])
    return lower, upper


def sensitivities(objective: _Objective, x: np.ndarray) -> dict[str, float]:
    """Per parameter, the largest |change| of any fitted figure (log ratio) when it moves by its test step, up and
    down."""
    here = objective.residuals_at(x)
    steps = (*[_SCALE_TEST_STEP] * 4, _OUTSIDE_TEST_STEP_S / _OUTSIDE_UNIT_S)
    out = {}
    for i, name in enumerate(PARAMETERS):
        moved = 0.0
        for sign in (1, -1):
            y = x.copy()
            y[i] = max(0.0, y[i] + sign * steps[i]) if name == "outside_engine_s" else y[i] + sign * steps[i]
            if np.array_equal(y, x):
                continue
            moved = max(moved, float(np.max(np.abs(objective.residuals_at(y) - here), initial=0.0)))
        out[name] = moved
    return out


_COARSE_STEPS = (*[math.log(2.0)] * 4, 5.0)
"""The coarse search's steps: halve and double each scale, and the outside time +-50 ms."""


def coarse_search(
    objective: _Objective, start: np.ndarray, free: list[int], lower: np.ndarray, upper: np.ndarray, passes: int = 2
) -> np.ndarray:
    """A start for the local fit: each free parameter in turn moved by a coarse step while that lowers the loss.

    The simulated figures move in small jumps (a request more or less in a
    step), so a gradient from a specs-only start can stall far from the
    optimum; a few coordinate moves of 2x first put it in the right basin.
    """
    best = start.copy()
    best_loss = float(np.sum(np.square(objective.residuals_at(best))))
    for _ in range(passes):
        for i in free:
            for sign in (1, -1):
                while True:
                    trial = best.copy()
                    trial[i] = float(np.clip(best[i] + sign * _COARSE_STEPS[i], lower[i], upper[i]))
                    if trial[i] == best[i]:
                        break
                    loss = float(np.sum(np.square(objective.residuals_at(trial))))
                    if loss >= best_loss:
                        break
                    best, best_loss = trial, loss
    return best


# -- the fit --------------------------------------------------------------------------------------------------------


def check_runs_fit_deployment(runs: Sequence[MeasuredRun], deployment: Deployment) -> None:
    """CalibrateFromError when the deployment cannot have served a run: a request longer than its context."""
    limit = deployment.config.max_model_len or deployment.model.max_position_embeddings
    for run in runs:
        longest = max(r.prompt_len + r.max_tokens for r in run.requests)
        if longest > limit:
            raise CalibrateFromError(
                f"{run.source}: a request of {longest} tokens (prompt + output) cannot have been served by "
                f"{deployment.model.name} with max_model_len {limit}: give the deployment that produced it "
                "(--engine-args --max-model-len ...)"
            )


def fit_from_runs(
    runs: Sequence[MeasuredRun],
    deployment: Deployment,
    *,
    max_evaluations: int = 40,
    model_source: str | None = None,
    engine_args: str | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> CalibrationProfile:
    """The environment of `deployment` fitted to `runs`, as a calibration profile `--calibration` reads.

    `deployment` is the specs-only one (as `simulate --gpu --model --engine-args
    --vllm-version` builds it). One run is enough; more constrain more.
    `max_evaluations` bounds the least-squares iterations (each simulates every run).
    `model_source` and `engine_args` are what the user gave (the --model, the
    server's flags), kept in the profile; by default the deployment's own.
    """
    if not runs:
        raise CalibrateFromError("no measured runs to calibrate on")
    check_runs_fit_deployment(runs, deployment)
    t0 = time.monotonic()
    environment, fitted = fit_environment(runs, deployment, max_evaluations, progress)
    progress(f"fitted in {environment.evaluations} simulations of every run, {time.monotonic() - t0:.1f} s")
    return CalibrationProfile(
        created_at=time.time(),
        server={"from_runs": [r.source for r in runs]},
        hardware=deployment.hardware,
        gpu=deployment.hardware.name,
        model_source=model_source or deployment.model.name,
        model_spec=model_spec_dict(deployment.model),
        engine_args=deployment.engine_args() if engine_args is None else engine_args,
        engine_config=asdict(deployment.config),
        coefficients=fitted.coefficients,
        network_latency_s=fitted.network_latency,
        frontend_s_per_request=fitted.api.per_request_s,
        elapsed_s=time.monotonic() - t0,
        origin=CalibrationOrigin.RUNS,
        environment=environment,
    )


def fit_environment(
    runs: Sequence[MeasuredRun], deployment: Deployment, max_evaluations: int, progress: Callable[[str], None]
) -> tuple[EnvironmentFit, Deployment]:
    """The five environment parameters fitted to `runs`, starting from the specs (the parameters the runs barely
    move are held there), and `deployment` with them applied."""
    costs = measured_cpu_costs(deployment.vllm_version)
    specs = Environment(1.0, 1.0, costs.default_speed_factor, costs.default_speed_factor, 0.0)
    start = specs.vector()
    lower, upper = _bounds(deployment)
    objective = _Objective(runs, deployment, start, list(range(len(PARAMETERS))))
    sensitivity = sensitivities(objective, start)
    free = [i for i, name in enumerate(PARAMETERS) if sensitivity[name] >= MIN_SENSITIVITY]
    progress(
        "sensitivity to each parameter's test step: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in sensitivity.items())
    )
    best = search(objective, start, free, (lower, upper), max_evaluations) if free else start
    fitted_env = Environment.from_vector(best)
    fitted = with_environment(deployment, fitted_env)
    fits = [_run_fit(run, simulated(fitted, run), simulated(deployment, run)) for run in runs]
    errors = objective.residuals_at(best)
    environment = EnvironmentFit(
        **asdict(fitted_env),
        vllm_version=".".join(map(str, deployment.vllm_version)) if deployment.vllm_version else None,
        specs_only=asdict(specs),
        unconstrained=[PARAMETERS[i] for i in range(len(PARAMETERS)) if i not in free],
        sensitivity=sensitivity,
        objective=float(np.mean(np.square(errors))) if errors.size else 0.0,
        evaluations=objective.evaluations,
        runs=fits,
    )
    return environment, fitted


def search(
    objective: _Objective,
    start: np.ndarray,
    free: list[int],
    bounds: tuple[np.ndarray, np.ndarray],
    max_evaluations: int,
) -> np.ndarray:
    """The best vector: a coarse search for the basin, then bounded least squares over the `free` parameters."""
    from scipy.optimize import least_squares  # ~0.3 s to import: only when a fit runs, not for --help

    lower, upper = bounds
    objective.free = free
    coarse = coarse_search(objective, start, free, lower, upper)
    span = upper[free] - lower[free]
    inside = np.clip(
        coarse[free], lower[free] + 1e-6 * span, upper[free] - 1e-6 * span
    )  # least_squares refuses a bound
    result = least_squares(
        objective, inside, bounds=(lower[free], upper[free]), diff_step=0.03, x_scale=1.0, max_nfev=max_evaluations
    )
    return objective.full(result.x)


def _run_fit(run: MeasuredRun, fitted: dict[str, float | None], specs: dict[str, float | None]) -> RunFit:
    metrics = {
        k: MetricFit(measured=m, fitted=fitted.get(k), specs_only=specs.get(k))
        for k in REPORTED_METRICS
        if (m := run.measured.get(k)) is not None and m > 0
    }
    notes = list(run.notes)
    if len(run.requests) > MAX_SIMULATED_REQUESTS:
        notes.append(f"simulated on its first {MAX_SIMULATED_REQUESTS} of {len(run.requests)} requests")
    return RunFit(
        source=run.source,
        format=str(run.format),
        requests=len(run.requests),
        lengths_from=run.lengths_from,
        metrics=metrics,
        notes=notes,
    )


# -- the verb -------------------------------------------------------------------------------------------------------


def calibrate_from(request: CalibrateRequest, progress: Callable[[str], None] = lambda _: None) -> CalibrationProfile:
    """Read every result, check it against the deployment, fit, write the profile; every refusal before any fitting."""
    runs = [run for source in request.sources for run in read_measured_runs(source, request.workload)]
    try:
        deployment = build_deployment(
            request.gpu, request.model, request.engine_args, vllm_version=request.vllm_version
        )
    except PerfConfigError as exc:
        raise CalibrateFromError(
            f"the deployment --gpu {request.gpu} --model {request.model} cannot have produced "
            f"{', '.join(map(str, request.sources))}: {exc}"
        ) from exc
    profile = fit_from_runs(
        runs,
        deployment,
        max_evaluations=request.max_evaluations,
        model_source=request.model,
        engine_args=request.engine_args,
        progress=progress,
    )
    profile.save(request.out)
    return profile
