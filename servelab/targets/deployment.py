"""A simulated deployment: hardware + model + a vLLM launch line, resolved once.

Every verb that predicts (simulate, diagnose, tune, validate) needs the same
chain: parse the user's `vllm serve` flags, fill vLLM's defaults for this
chip, plan GPU memory into KV blocks, build the cost model, build the engine.
It lives here so that chain exists once, and a what-if is one `with_flags`.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field, fields, replace
from collections.abc import Set as AbstractSet
from typing import Any
from pathlib import Path

from servelab.metrics.intervals import Tier
from servelab.perf import lora
from servelab.perf.cost_model import CostCoefficients, CostModel, RooflineCostModel
from servelab.perf.engine_args import VLLM_ENVIRONMENT, VLLM_QUANTIZATION_SPELLING, parse_engine_args, resolve
from servelab.perf.engine_config import EngineConfig
from servelab.perf.errors import PerfConfigError
from servelab.perf.hardware import Hardware, get_gpu
from servelab.perf.memory import MemoryPlan, plan_memory
from servelab.perf.models import ModelSpec, get_model
from servelab.perf.vllm_cpu_costs import ApiServerCosts
from servelab.perf.vllm_cpu_costs import measured as measured_cpu_costs
from servelab.perf.vllm_versions import parse_version, v0_note, version_defaults, with_v0_step_gap
from servelab.sim.engines import VLLM, SchedulerFactory
from servelab.sim.router import LEAST_LOADED, ROUND_ROBIN, ScorerWeights
from servelab.targets.sim import SimTarget

# EngineConfig field -> the vLLM flag that sets it, for printing a launch line (and naming it in advice).
VLLM_FLAGS = {
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "long_prefill_token_threshold": "--long-prefill-token-threshold",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "max_model_len": "--max-model-len",
    "block_size": "--block-size",
    "kv_cache_dtype": "--kv-cache-dtype",
    "quantization": "--quantization",
    "tensor_parallel_size": "--tensor-parallel-size",
    "data_parallel_size": "--data-parallel-size",
    "scheduling_policy": "--scheduling-policy",
    "num_gpu_blocks_override": "--num-gpu-blocks-override",
    "watermark": "--watermark",
    "api_server_count": "--api-server-count",
    "stream_interval": "--stream-interval",
    "max_loras": "--max-loras",
    "max_lora_rank": "--max-lora-rank",
}
VLLM_SWITCHES = {
    "enable_chunked_prefill": "enable-chunked-prefill",
    "enable_prefix_caching": "enable-prefix-caching",
    "async_scheduling": "async-scheduling",
    "scheduler_reserve_full_isl": "scheduler-reserve-full-isl",
    "enforce_eager": "enforce-eager",
    "enable_lora": "enable-lora",
    "enable_expert_parallel": "enable-expert-parallel",
}


@dataclass(frozen=True)
class Deployment:
    hardware: Hardware
    model: ModelSpec
    requested: EngineConfig
    """What the user set (None = vLLM's default); kept so a what-if re-resolves defaults."""
    config: EngineConfig
    """`requested` with vLLM's defaults filled for this hardware."""
    memory: MemoryPlan
    coefficients: CostCoefficients = field(default_factory=CostCoefficients)
    warnings: tuple[str, ...] = ()
    router: str = ROUND_ROBIN
    network_latency: float = 0.0
    performance_mode: str = "balanced"
    api: ApiServerCosts = field(default_factory=ApiServerCosts)
    """The API server's costs (see SimTarget); all 0 = an infinitely fast frontend."""
    cpu_costs_source: str = "none"
    """Where the CPU-side costs come from: "measured" (vLLM CPU build, scaled), "given" (a live calibration, the
    caller), "fitted_from_runs" (vLLM's measured costs x a host factor `calibrate --from` fitted) or "none"."""
    vllm_version: tuple[int, int] | None = None
    """The vLLM release served (its defaults, its measured CPU costs); None: the modelled one
    (perf/vllm_versions.py)."""
    engine: str = VLLM
    """Which engine's scheduler and memory plan (servelab.sim.engines); other engines: targets/engine_deployment.py."""
    scheduler_factory: SchedulerFactory | None = None
    engine_flags: str = ""
    """Another engine's launch flags as the user gave them (vLLM's are re-derived by engine_args())."""
    engine_settings: dict[str, Any] = field(default_factory=dict)
    """Another engine's own resolved settings (SGLangSettings, TRTLLMSettings as a dict); empty for vLLM."""
    router_weights: ScorerWeights | None = None
    """llm-d's scorer weights for the router, where it weighs them (prefix-aware, prefix-estimate); None: its own."""

    @classmethod
    def build(
        cls,
        hardware: Hardware,
        model: ModelSpec,
        requested: EngineConfig,
        *,
        coefficients: CostCoefficients | None = None,
        warnings: tuple[str, ...] = (),
        router: str = ROUND_ROBIN,
        network_latency: float = 0.0,
        performance_mode: str = "balanced",
        api: ApiServerCosts | None = None,
        cpu_speed_factor: float | None = None,
        vllm_version: tuple[int, int] | None = None,
    ) -> Deployment:
        """Resolve and plan; CPU-side costs not given are vLLM's measured ones on a catalogue GPU.

        For a GPU from the catalogue (or a GPU file) without fitted coefficients,
        the engine core's per-step CPU terms and the API server's costs (`api`,
        unless given) default to data/vllm_cpu_costs.yaml x `cpu_speed_factor`
        (None: the file's default). With `coefficients` (a calibration profile)
        or on `--gpu cpu` (whose costs `calibrate` fits) nothing is filled in:
        what is not given is 0.
        """
        config = resolve(requested, hardware, model, performance_mode=performance_mode, vllm_version=vllm_version)
        fill = coefficients is None and hardware.vendor != "cpu"
        source = "given" if coefficients is not None else "none"
        if fill:
            costs = measured_cpu_costs(vllm_version)
            coefficients = with_v0_step_gap(costs.coefficients(CostCoefficients(), cpu_speed_factor), vllm_version)
            api = costs.api_server(cpu_speed_factor) if api is None else api
            source = "measured"
        return cls(
            hardware,
            model,
            requested,
            config,
            lora.reserve(plan_memory(hardware, model, config), model, config),
            coefficients or CostCoefficients(),
            warnings,
            router,
            network_latency,
            performance_mode,
            api or ApiServerCosts(),
            source,
            vllm_version,
        )

    def cost_model(self) -> RooflineCostModel:
        return RooflineCostModel(self.hardware, self.model, self.config, self.coefficients)

    def step_cost(self) -> CostModel:
        """The step model the simulator runs: vLLM's roofline (with LoRA kernels when served unmerged); another
        engine scales it by its own kernels."""
        return lora.with_lora(self.cost_model(), self.model, self.config, self.hardware)

    @property
    def prediction_tier(self) -> Tier:
        """Which held-out residuals this deployment's intervals come from: the tier its costs were calibrated in."""
        return {"given": Tier.CALIBRATED_LIVE, "fitted_from_runs": Tier.CALIBRATED_FROM_RUNS}.get(
            self.cpu_costs_source, Tier.SPECS_ONLY
        )

    def sim_target(self, scrape_interval: float = 1.0) -> SimTarget:
        return SimTarget(
            self.config,
            self.memory.num_blocks,
            self.step_cost(),
            router=self.router,
            router_weights=self.router_weights,
            scrape_interval=scrape_interval,
            network_latency=self.network_latency,
            api=self.api,
            cpu_costs=self.coefficients,
            scheduler_factory=self.scheduler_factory,
            tier=self.prediction_tier,
        )

    def rebuilt(
        self, *, hardware: Hardware | None = None, model: ModelSpec | None = None, **changes: object
    ) -> Deployment:
        """The same deployment on other hardware, another model or with some knobs changed; defaults re-resolved."""
        if self.engine != VLLM:
            raise PerfConfigError(
                f"changing a simulated {self.engine} deployment's knobs is not modelled yet (vLLM only)"
            )
        rebuilt = Deployment.build(
            hardware or self.hardware,
            model or self.model,
            self.requested.with_(**changes),
            coefficients=self.coefficients,
            router=self.router,
            network_latency=self.network_latency,
            performance_mode=self.performance_mode,
            api=self.api,
            vllm_version=self.vllm_version,
        )
        return replace(rebuilt, cpu_costs_source=self.cpu_costs_source, router_weights=self.router_weights)

    def with_changes(self, **changes: Any) -> Deployment:
        return self.rebuilt(**changes)

    def engine_args(self) -> str:
        """The flags that differ from the served vLLM's defaults, as a user would paste them after `vllm serve`;
        a modelled environment variable that differs leads the line (`VLLM_MXFP4_USE_MARLIN=1 --max-num-seqs 64`),
        as parse_engine_args reads it back."""
        if self.engine != VLLM:
            return self.engine_flags
        default = version_defaults(self.vllm_version)
        environment: list[str] = []
        parts: list[str] = []
        for f in fields(EngineConfig):
            value = getattr(self.requested, f.name)
            if value == getattr(default, f.name):
                continue
            if f.name in VLLM_ENVIRONMENT:
                environment.append(f"{VLLM_ENVIRONMENT[f.name]}={int(value)}")
            elif f.name in VLLM_SWITCHES:
                parts.append(("--" if value else "--no-") + VLLM_SWITCHES[f.name])
            elif f.name in VLLM_FLAGS:
                spelt = VLLM_QUANTIZATION_SPELLING.get(str(value), value) if f.name == "quantization" else value
                parts.append(f"{VLLM_FLAGS[f.name]} {shlex.quote(str(spelt))}")
        return " ".join(environment + parts)

    def describe(self) -> dict[str, object]:
        return {
            "engine": self.engine,
            "gpu": self.hardware.name,
            "model": self.model.name,
            "engine_args": self.engine_args(),
            "engine_config": {f.name: getattr(self.config, f.name) for f in fields(EngineConfig)},
            "num_gpu_blocks": self.memory.num_blocks,
            "kv_cache_gib": self.memory.kv_cache_bytes / 2**30,
            "coefficients": self.coefficients.model_dump(),
            "cpu_costs_source": self.cpu_costs_source,
            "vllm_version": ".".join(map(str, self.vllm_version)) if self.vllm_version else "latest",
            "frontend": {**asdict(self.api), "api_server_count": self.config.api_server_count},
            "warnings": list(self.warnings),
        }


def resolve_parts(
    gpu: str | Hardware, model: str | Path | ModelSpec, named_model: str | None, gpu_file: str | Path | None = None
) -> tuple[Hardware, ModelSpec]:
    """The chip and the model a deployment runs: catalogue names are looked up, resolved ones kept (a chip from a GPU
    file stays itself when another engine is built on it); a model named in the engine's own flags wins."""
    hardware = gpu if isinstance(gpu, Hardware) else get_gpu(gpu, gpu_file)
    if named_model is not None:
        return hardware, get_model(named_model)
    return hardware, model if isinstance(model, ModelSpec) else get_model(model)


def build_deployment(
    gpu: str | Hardware,
    model: str | Path | ModelSpec,
    engine_args: str = "",
    *,
    tensor_parallel_size: int | None = None,
    replicas: int | None = None,
    gpu_file: str | Path | None = None,
    coefficients: CostCoefficients | None = None,
    router: str | None = None,
    vllm_version: str | None = None,
) -> Deployment:
    """From CLI words to a resolved deployment; PerfConfigError on anything inconsistent.

    `vllm_version` ("0.11.0"; None: the modelled release) sets the defaults the flags are read against. `router`
    None: the server's own (own_router).
    """
    version = parse_version(vllm_version)
    parsed = parse_engine_args(engine_args, base=version_defaults(version))
    requested = parsed.config
    for flag, name, value in (
        ("--tp", "tensor_parallel_size", tensor_parallel_size),
        ("--replicas", "data_parallel_size", replicas),
    ):
        if value is None:
            continue
        if value < 1:
            raise PerfConfigError(f"{flag} must be >= 1, got {value}")
        if name in parsed.given and getattr(requested, name) != value:
            raise PerfConfigError(
                f"{flag} {value} and {VLLM_FLAGS[name]} {getattr(requested, name)} in --engine-args "
                "set the same thing to different values; give one of them"
            )
        requested = requested.with_(**{name: value})
    hardware, spec = resolve_parts(gpu, model, parsed.model, gpu_file)
    notes = (v0_note(version), lora.describe(spec, requested), idle_expert_parallel(spec, requested))
    said = [note for note in notes if note]
    return Deployment.build(
        hardware,
        spec,
        requested,
        coefficients=coefficients,
        warnings=(*parsed.warnings, *said),
        router=router or own_router(parsed.config, parsed.given),
        performance_mode=parsed.performance_mode,
        vllm_version=version,
    )


def idle_expert_parallel(model: ModelSpec, config: EngineConfig) -> str | None:
    """--enable-expert-parallel on a dense model: vLLM accepts it and it does nothing (there are no experts to
    spread), which a user comparing EP against TP should hear rather than see two identical predictions."""
    if not config.enable_expert_parallel or model.moe is not None:
        return None
    return f"--enable-expert-parallel has no effect: {model.name} is dense (no experts to spread over the GPUs)"


def own_router(config: EngineConfig, given: AbstractSet[str]) -> str:
    """The router a vLLM launch line implies (`given`: the flags it set): `--data-parallel-size N` in it is one
    server whose own balancer spreads the requests (least-loaded); replicas counted by --replicas sit behind a
    plain proxy (round-robin)."""
    dp_in_line = "data_parallel_size" in given and config.data_parallel_size > 1
    return LEAST_LOADED if dp_in_line else ROUND_ROBIN
