"""The deployment a calibration profile describes: what `--calibration` simulates, whichever way the profile was fitted.

A profile from probes (`calibrate --base-url`) carries the roofline's fitted
coefficients, latency and API-server cost; one from runs (`calibrate --from`)
carries a few scale factors on the specs-only deployment (its environment).
Both become a Deployment here, below the verbs that read profiles (simulate,
tune, validate, diagnose).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from servelab.schemas.profile import CalibrationOrigin, CalibrationProfile
from servelab.perf.cost_model import CostCoefficients
from servelab.perf.engine_args import parse_engine_args
from servelab.perf.models import ModelSpec
from servelab.perf.vllm_cpu_costs import ApiServerCosts
from servelab.perf.vllm_cpu_costs import measured as measured_cpu_costs
from servelab.perf.vllm_versions import parse_version, version_defaults
from servelab.targets.deployment import Deployment, own_router
from servelab.targets.sim import SimTarget


class EnvironmentScales(Protocol):
    """The five parameters `calibrate --from` fits (a candidate during the fit, or the profile's EnvironmentFit)."""

    @property
    def compute_scale(self) -> float: ...
    @property
    def memory_scale(self) -> float: ...
    @property
    def engine_cpu_factor(self) -> float: ...
    @property
    def api_cpu_factor(self) -> float: ...
    @property
    def outside_engine_s(self) -> float: ...


def deployment_from_profile(
    profile: CalibrationProfile, engine_args: str = "", model: ModelSpec | None = None
) -> Deployment:
    """The calibrated hardware + model as a simulated deployment; `engine_args` override the probed flags one by one.

    The Deployment carries everything the profile fitted: the roofline's
    coefficients (prefill-step and idle-wake costs included), the latency and
    the API server's per-request cost. `model` puts another model on the same
    calibrated hardware (the profile's own by default).
    """
    if profile.origin == CalibrationOrigin.RUNS:
        return profile_deployment(profile, engine_args, model)
    probed = parse_engine_args(profile.engine_args)
    parsed = parse_engine_args(engine_args, base=probed.config) if engine_args.strip() else probed
    return Deployment.build(
        profile.hardware,
        model or ModelSpec(**profile.model_spec),
        parsed.config,
        coefficients=profile.coefficients,
        warnings=tuple(parsed.warnings),
        router=own_router(parsed.config, probed.given | parsed.given),
        network_latency=profile.network_latency_s,
        performance_mode=parsed.performance_mode,
        api=ApiServerCosts(per_request_s=profile.frontend_s_per_request),
    )


def with_environment(deployment: Deployment, env: EnvironmentScales) -> Deployment:
    """`deployment` in the environment `env`: scaled peaks, vLLM's CPU costs x the host factor, the outside time.

    The CPU costs are vLLM's measured ones whatever the device (the fitted host
    factor is what makes them this host's), and so is the host's time to
    launch a layer's kernels one by one in a step without CUDA graphs (the
    default read off a published eager run, also a host property); only these
    CPU terms of the coefficients are set, so a GPU with measured kernel
    tables keeps them.
    """
    hw = deployment.hardware
    scaled = hw.model_copy(
        update={
            "bf16_tflops": hw.bf16_tflops * env.compute_scale,
            "fp8_tflops": hw.fp8_tflops * env.compute_scale,
            "int8_tflops": hw.int8_tflops * env.compute_scale,
            "memory_bandwidth_gbs": hw.memory_bandwidth_gbs * env.memory_scale,
        }
    )
    costs = measured_cpu_costs(deployment.vllm_version)
    default = CostCoefficients()
    host = default.model_copy(
        update={"eager_launch_s_per_layer": default.eager_launch_s_per_layer * env.engine_cpu_factor}
    )
    built = Deployment.build(
        scaled,
        deployment.model,
        deployment.requested,
        coefficients=costs.coefficients(host, env.engine_cpu_factor),
        api=costs.api_server(env.api_cpu_factor),
        warnings=deployment.warnings,
        network_latency=deployment.network_latency + env.outside_engine_s / 2,
        performance_mode=deployment.performance_mode,
        vllm_version=deployment.vllm_version,
    )
    return replace(built, router=deployment.router, cpu_costs_source="fitted_from_runs")


def profile_deployment(
    profile: CalibrationProfile, engine_args: str = "", model: ModelSpec | None = None
) -> Deployment:
    """The deployment a `calibrate --from` profile describes; `engine_args` override its flags, `model` its model.

    The environment belongs to the hardware and host, not to the model, so
    another model on the same machine is this deployment with that model.
    """
    env = profile.environment
    assert env is not None, "a profile fitted from runs"
    version = parse_version(env.vllm_version)
    served = parse_engine_args(profile.engine_args, base=version_defaults(version))
    parsed = parse_engine_args(engine_args, base=served.config) if engine_args.strip() else served
    base = Deployment.build(
        profile.hardware,
        model or ModelSpec(**profile.model_spec),
        parsed.config,
        warnings=tuple(parsed.warnings),
        router=own_router(parsed.config, served.given | parsed.given),
        performance_mode=parsed.performance_mode,
        vllm_version=version,
    )
    return with_environment(base, env)


def profile_sim_target(profile: CalibrationProfile, engine_args: str = "") -> SimTarget:
    """The simulator of the calibrated hardware + model, with every fitted cost; `engine_args` as for
    deployment_from_profile."""
    return deployment_from_profile(profile, engine_args).sim_target()
