"""A simulated deployment on any modelled engine: vLLM, SGLang or TensorRT-LLM, from that engine's own flags.

The hardware, model, cost model and CPU-side costs are shared (the kernel
tables and vLLM's measured CPU costs stand for every engine, see
docs/engines.md); what differs is the flag parser, the defaults, the memory
plan and the scheduler, which the engine's resolve function and scheduler
factory supply.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path

from servelab.perf.cost_model import CostCoefficients
from servelab.perf.engine_kernels import KernelRatio, ScaledCostModel, kernel_ratio
from servelab.perf.errors import PerfConfigError
from servelab.perf.hardware import Hardware, get_gpu
from servelab.perf.models import ModelSpec, get_model
from servelab.perf.sglang_args import parse_sglang_args, resolve_sglang
from servelab.perf.trtllm_args import parse_trtllm_args, resolve_trtllm
from servelab.perf.vllm_cpu_costs import measured as measured_cpu_costs
from servelab.sim.engines import ENGINES, SGLANG, TRTLLM, VLLM, sglang_factory, trtllm_factory
from servelab.sim.router import ROUND_ROBIN
from servelab.targets.deployment import Deployment, build_deployment
from servelab.targets.sim import SimTarget


@dataclass(frozen=True)
class EngineDeployment(Deployment):
    """A deployment on SGLang or TensorRT-LLM: vLLM's step model scaled by the engine's measured kernels."""

    kernels: KernelRatio = KernelRatio()

    def sim_target(self, scrape_interval: float = 1.0) -> SimTarget:
        target = super().sim_target(scrape_interval)
        target.cost_model = ScaledCostModel(target.cost_model, self.kernels)
        return target

    def relaunched(self, flags: str, hardware: Hardware | None = None) -> EngineDeployment:
        """The same engine, model and router started with another launch line (on other hardware): what `tune`
        simulates for a candidate. Every setting comes from `flags`, as a server started with them would have it."""
        return _engine_deployment(self.engine, hardware or self.hardware, self.model, flags, router=self.router,
                                  kernels_of=self)


def build_engine_deployment(
    engine: str,
    gpu: str,
    model: str | Path,
    flags: str = "",
    *,
    tensor_parallel_size: int | None = None,
    replicas: int | None = None,
    gpu_file: str | Path | None = None,
    router: str = ROUND_ROBIN,
) -> Deployment:
    """`flags` in the engine's own spelling (`vllm serve`, `sglang.launch_server`, `trtllm-serve`); PerfConfigError if unusable."""
    if engine not in ENGINES:
        raise PerfConfigError(f"--engine {engine!r}: choose one of {', '.join(ENGINES)}")
    if engine == VLLM:
        return build_deployment(gpu, model, flags, tensor_parallel_size=tensor_parallel_size, replicas=replicas,
                                gpu_file=gpu_file, router=router)
    return _engine_deployment(engine, get_gpu(gpu, gpu_file), model, flags, tensor_parallel_size=tensor_parallel_size,
                              replicas=replicas, router=router)


def _engine_deployment(
    engine: str,
    hardware: Hardware,
    model: str | Path | ModelSpec,
    flags: str,
    *,
    tensor_parallel_size: int | None = None,
    replicas: int | None = None,
    router: str = ROUND_ROBIN,
    kernels_of: EngineDeployment | None = None,
) -> EngineDeployment:
    """An SGLang or TensorRT-LLM deployment; a model the flags name (`--model-path`, trtllm-serve's MODEL) wins.

    `kernels_of`: a deployment whose kernel ratio stands when GPU, model, weight format and TP are its own (reading
    the kernel tables again costs most of a second, a tune candidate's simulation a fraction of one)."""
    costs = measured_cpu_costs()
    coefficients = costs.coefficients(CostCoefficients(), None) if hardware.vendor != "cpu" else CostCoefficients()
    api = costs.api_server(None) if hardware.vendor != "cpu" else None

    def spec_of(named: str | None) -> ModelSpec:
        if named:
            return get_model(named)
        return model if isinstance(model, ModelSpec) else get_model(model)

    if engine == SGLANG:
        parsed = parse_sglang_args(flags)
        warnings = parsed.warnings
        settings = parsed.settings
        if tensor_parallel_size is not None:
            settings = replace(settings, tp_size=tensor_parallel_size)
        if replicas is not None:
            settings = replace(settings, dp_size=replicas)
        spec = spec_of(settings.model)
        plan = resolve_sglang(settings, hardware, spec)
        config, memory, factory = plan.config, plan.memory, sglang_factory(plan.config, plan.settings)
        own = asdict(plan.settings)
    else:
        assert engine == TRTLLM
        parsed_trt = parse_trtllm_args(flags)
        trt = parsed_trt.settings
        if tensor_parallel_size is not None:
            trt = replace(trt, tp_size=tensor_parallel_size)
        spec = spec_of(trt.model)
        trt_plan = resolve_trtllm(trt, hardware, spec)
        config, memory = trt_plan.config, trt_plan.memory
        if replicas is not None:
            config = config.with_(data_parallel_size=replicas)
        factory = trtllm_factory(config, trt_plan.settings)
        own = asdict(trt_plan.settings)
        warnings = parsed_trt.warnings
    shape = (hardware, spec, config.quantization, config.tensor_parallel_size)
    same = kernels_of is not None and shape == (kernels_of.hardware, kernels_of.model, kernels_of.config.quantization,
                                                kernels_of.config.tensor_parallel_size)
    deployment = EngineDeployment(
        hardware, spec, config, config, memory, coefficients, tuple(warnings), router,
        cpu_costs_source="measured" if hardware.vendor != "cpu" else "none", engine=engine, scheduler_factory=factory,
        engine_flags=flags, engine_settings=own,
        kernels=kernels_of.kernels if same and kernels_of is not None else kernel_ratio(engine, *shape),
    )
    return deployment if api is None else replace(deployment, api=api)
