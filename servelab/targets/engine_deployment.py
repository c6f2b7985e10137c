"""A simulated deployment on any modelled engine: vLLM, SGLang or TensorRT-LLM, from that engine's own flags.

The hardware, model, cost model and CPU-side costs are shared (the kernel
tables and vLLM's measured CPU costs stand for every engine, see
docs/engines.md); what differs is the flag parser, the defaults, the memory
plan and the scheduler, which the engine's resolve function and scheduler
factory supply.

A what-if on another engine (`rebuilt`, as diagnose prices its changes) is
named in the simulator's common knobs (EngineConfig's fields, the names
vLLM's what-ifs use); KNOBS says how each engine spells and stores each one,
so the changed deployment is the engine's own settings re-resolved, and its
launch line is the user's with that engine's flag set.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from servelab.perf import sglang_args, trtllm_args
from servelab.perf.cost_model import CostCoefficients, CostModel
from servelab.perf.engine_flags import set_flag
from servelab.perf.engine_kernels import KernelRatio, ScaledCostModel, kernel_ratio
from servelab.perf.errors import PerfConfigError
from servelab.perf.hardware import Hardware
from servelab.perf.models import ModelSpec
from servelab.perf.sglang_args import SGLangSettings, parse_sglang_args, resolve_sglang
from servelab.perf.trtllm_args import TRTLLMSettings, parse_trtllm_args, resolve_trtllm
from servelab.perf.vllm_cpu_costs import measured as measured_cpu_costs
from servelab.sim.engines import ENGINES, SGLANG, TRTLLM, VLLM, sglang_factory, trtllm_factory
from servelab.sim.router import ROUND_ROBIN
from servelab.targets.deployment import Deployment, build_deployment, resolve_parts


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Knob:
    """How one engine spells and stores one of the simulator's common knobs (an EngineConfig field)."""

    setting: str
    """The field of the engine's settings (SGLangSettings, TRTLLMSettings) it sets."""
    flag: str | None
    """The launch-line flag, in the engine's spelling; None where only a config file sets it."""
    config_key: str | None = None
    """TensorRT-LLM: the dotted key of its --extra_llm_api_options YAML, where no flag sets it."""
    convert: Callable[[Any], Any] = _same
    """The common value -> the engine's (SGLang's `--disable-radix-cache` is prefix caching negated)."""


KNOBS: dict[str, dict[str, Knob]] = {
    SGLANG: {
        "max_num_seqs": Knob("max_running_requests", "--max-running-requests"),
        "max_num_batched_tokens": Knob("chunked_prefill_size", "--chunked-prefill-size"),
        "gpu_memory_utilization": Knob("mem_fraction_static", "--mem-fraction-static"),
        "kv_cache_dtype": Knob("kv_cache_dtype", "--kv-cache-dtype", convert=lambda v: "fp8_e4m3" if v == "fp8" else v),
        "quantization": Knob("quantization", "--quantization"),
        "tensor_parallel_size": Knob("tp_size", "--tp-size"),
        "data_parallel_size": Knob("dp_size", "--dp-size"),
        "enable_prefix_caching": Knob("disable_radix_cache", "--disable-radix-cache", convert=lambda v: not v),
        "schedule_policy": Knob("schedule_policy", "--schedule-policy"),
        "enforce_eager": Knob("disable_cuda_graph", "--disable-cuda-graph"),
        "cuda_graph_max_batch": Knob("cuda_graph_max_bs", "--cuda-graph-max-bs"),
    },
    TRTLLM: {
        "max_num_seqs": Knob("max_batch_size", "--max_batch_size"),
        "max_num_batched_tokens": Knob("max_num_tokens", "--max_num_tokens"),
        "gpu_memory_utilization": Knob("free_gpu_memory_fraction", "--kv_cache_free_gpu_memory_fraction"),
        "tensor_parallel_size": Knob("tp_size", "--tp_size"),
        "enable_chunked_prefill": Knob("enable_chunked_prefill", "--enable_chunked_prefill"),
        "kv_cache_dtype": Knob("kv_cache_dtype", None, "kv_cache_config.dtype"),
        "quantization": Knob("quantization", None, "quant_config.quant_algo"),
        "enable_prefix_caching": Knob("enable_block_reuse", None, "kv_cache_config.enable_block_reuse"),
        "capacity_scheduler_policy": Knob(
            "capacity_scheduler_policy", None, "scheduler_config.capacity_scheduler_policy"
        ),
    },
}
"""Per engine: common knob -> how that engine takes it. SGLang's schedule_policy and TensorRT-LLM's
capacity_scheduler_policy have no common counterpart and are named by their own field."""


def config_line(knob: Knob, value: Any) -> str:
    """`key: value` as the --extra_llm_api_options YAML spells it (booleans lower-case)."""
    return f"{knob.config_key}: {str(value).lower() if isinstance(value, bool) else value}"


_TABLES = {SGLANG: sglang_args.FLAGS, TRTLLM: trtllm_args.FLAGS}


@dataclass(frozen=True)
class EngineDeployment(Deployment):
    """A deployment on SGLang or TensorRT-LLM: vLLM's step model scaled by the engine's measured kernels."""

    kernels: KernelRatio = KernelRatio()
    requested_settings: SGLangSettings | TRTLLMSettings | None = None
    """What the user set (None = the engine's default): a what-if changes it and re-resolves the defaults."""
    config_file: tuple[str, ...] = field(default=())
    """TensorRT-LLM options a what-if set that only its --extra_llm_api_options YAML takes, as `key: value`."""

    def step_cost(self) -> CostModel:
        return ScaledCostModel(self.cost_model(), self.kernels)

    def engine_args(self) -> str:
        if not self.config_file:
            return self.engine_flags
        return f"{self.engine_flags} (in the --extra_llm_api_options YAML: {', '.join(self.config_file)})".strip()

    def rebuilt(
        self, *, hardware: Hardware | None = None, model: ModelSpec | None = None, **changes: object
    ) -> Deployment:
        """The same engine with common knobs (or its own schedule policy) changed, defaults re-resolved for the chip;
        PerfConfigError for a knob the engine has no counterpart of."""
        knobs = KNOBS[self.engine]
        settings, flags, config_file = self.requested_settings, self.engine_flags, list(self.config_file)
        assert settings is not None  # set by _assemble, the only way an EngineDeployment is made
        replicas = self.config.data_parallel_size if self.engine == TRTLLM else None
        for name, value in changes.items():
            if self.engine == TRTLLM and name == "data_parallel_size":
                replicas = int(value)  # type: ignore[call-overload]  # replicas behind a router: no flag of the engine's
                continue
            knob = knobs.get(name)
            if knob is None:
                raise PerfConfigError(f"{name} has no {self.engine} counterpart servelab models")
            own = knob.convert(value)
            settings = replace(settings, **{knob.setting: own})
            if knob.flag is not None:
                flags = set_flag(flags, _TABLES[self.engine], knob.flag, own)
            else:
                config_file = [item for item in config_file if not item.startswith(f"{knob.config_key}:")]
                config_file.append(config_line(knob, own))
        rebuilt = _assemble(
            self.engine,
            hardware or self.hardware,
            model or self.model,
            settings,
            flags,
            tuple(self.warnings),
            self.router,
            replicas,
        )
        return replace(rebuilt, config_file=tuple(config_file), router_weights=self.router_weights)

    def relaunched(self, flags: str, hardware: Hardware | None = None) -> EngineDeployment:
        """The same engine, model and router started with another launch line (on other hardware): what `tune`
        simulates for a candidate. Every setting comes from `flags`, as a server started with them would have it."""
        settings, warnings = _parse(self.engine, flags)
        hardware, spec = resolve_parts(hardware or self.hardware, self.model, settings.model)
        relaunched = _assemble(
            self.engine, hardware, spec, settings, flags, warnings, self.router, None, kernels_of=self
        )
        return replace(relaunched, router_weights=self.router_weights)


def _parse(engine: str, flags: str) -> tuple[SGLangSettings | TRTLLMSettings, tuple[str, ...]]:
    """The engine's own reading of its launch line: the settings given, and what it warned about."""
    if engine == SGLANG:
        parsed = parse_sglang_args(flags)
        return parsed.settings, tuple(parsed.warnings)
    assert engine == TRTLLM
    parsed_trt = parse_trtllm_args(flags)
    return parsed_trt.settings, tuple(parsed_trt.warnings)


def _assemble(
    engine: str,
    hardware: Hardware,
    spec: ModelSpec,
    settings: SGLangSettings | TRTLLMSettings,
    flags: str,
    warnings: tuple[str, ...],
    router: str,
    replicas: int | None,
    kernels_of: EngineDeployment | None = None,
) -> EngineDeployment:
    """The deployment of `settings` on `hardware`: the engine's defaults and memory plan, the shared CPU costs.

    `kernels_of`: a deployment whose kernel ratio stands when GPU, model, weight format and TP are its own (reading
    the kernel tables again costs most of a second, a tune candidate's simulation a fraction of one)."""
    costs = measured_cpu_costs()
    on_gpu = hardware.vendor != "cpu"
    coefficients = costs.coefficients(CostCoefficients(), None) if on_gpu else CostCoefficients()
    if isinstance(settings, SGLangSettings):
        plan = resolve_sglang(settings, hardware, spec)
        config, memory, factory, own = (
            plan.config,
            plan.memory,
            sglang_factory(plan.config, plan.settings),
            asdict(plan.settings),
        )
    else:
        trt = resolve_trtllm(settings, hardware, spec)
        config, memory = trt.config, trt.memory
        if replicas is not None:
            config = config.with_(data_parallel_size=replicas)
        factory, own = trtllm_factory(config, trt.settings), asdict(trt.settings)
    shape = (hardware, spec, config.quantization, config.tensor_parallel_size)
    same = kernels_of is not None and shape == (
        kernels_of.hardware,
        kernels_of.model,
        kernels_of.config.quantization,
        kernels_of.config.tensor_parallel_size,
    )
    deployment = EngineDeployment(
        hardware,
        spec,
        config,
        config,
        memory,
        coefficients,
        warnings,
        router,
        cpu_costs_source="measured" if on_gpu else "none",
        engine=engine,
        scheduler_factory=factory,
        engine_flags=flags,
        engine_settings=own,
        kernels=kernels_of.kernels if same and kernels_of is not None else kernel_ratio(engine, *shape),
        requested_settings=settings,
    )
    return replace(deployment, api=costs.api_server(None)) if on_gpu else deployment


def build_engine_deployment(
    engine: str,
    gpu: str | Hardware,
    model: str | Path | ModelSpec,
    flags: str = "",
    *,
    tensor_parallel_size: int | None = None,
    replicas: int | None = None,
    gpu_file: str | Path | None = None,
    router: str | None = None,
) -> Deployment:
    """`flags` in the engine's own spelling (`vllm serve`, `sglang.launch_server`, `trtllm-serve`); PerfConfigError
    if unusable."""
    if engine not in ENGINES:
        raise PerfConfigError(f"--engine {engine!r}: choose one of {', '.join(ENGINES)}")
    if engine == VLLM:
        return build_deployment(
            gpu,
            model,
            flags,
            tensor_parallel_size=tensor_parallel_size,
            replicas=replicas,
            gpu_file=gpu_file,
            router=router,
        )
    settings, warnings = _parse(engine, flags)
    if isinstance(settings, SGLangSettings) and replicas is not None:
        settings = replace(settings, dp_size=replicas)  # SGLang's own data parallelism, not a router's replicas
        replicas = None
    if tensor_parallel_size is not None:
        flag_tp = settings.tp_size
        if flag_tp != _parse(engine, "")[0].tp_size and flag_tp != tensor_parallel_size:  # the line set it, otherwise
            raise PerfConfigError(
                f"--tp {tensor_parallel_size} and {KNOBS[engine]['tensor_parallel_size'].flag} {flag_tp} in "
                "--engine-args set the same thing to different values; give one of them"
            )
        settings = replace(settings, tp_size=tensor_parallel_size)
    hardware, spec = resolve_parts(gpu, model, settings.model, gpu_file)
    return _assemble(engine, hardware, spec, settings, flags, warnings, router or ROUND_ROBIN, replicas)
