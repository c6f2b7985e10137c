"""An unmerged LoRA fine-tune (`vllm serve --enable-lora`), priced on top of the base model's step.

A fine-tune served as an adapter instead of merged weights costs twice:

- **Memory.** vLLM pre-allocates `max_loras` adapter slots on the GPU, each
  holding A and B matrices of `max_lora_rank` for every adapted linear layer
  (q, k, v, o, gate, up, down), before it sizes the KV cache; the slots come
  out of the KV budget whatever the adapters' real rank.
- **Time.** Every step runs the shrink (x·A) and expand (·B) kernels beside
  each adapted GEMM. Their FLOPs are negligible (rank 16 against hidden sizes
  in the thousands) and their weight reads small, but the kernels are far
  less efficient than the base GEMMs: published measurements put the whole
  step 8-60% slower than the base model (vLLM issue #9452: +20% benchmark
  time for Qwen2.5-32B on 2x A100 at 16 req/s on vLLM 0.5.0; issue #2829:
  -40% throughput for long prompts and short answers on an A100; PR #15655:
  8-24% slower Llama-3.1-8B on TPU v6e; punica issue #27: +60% decode on
  Yi-34B at rank 32). The model charges the middle, `STEP_OVERHEAD`, on the
  step's time, plus the adapters' weight read at the chip's bandwidth.

Merging the adapter into the base weights (PEFT's merge_and_unload) removes
both costs when a single fine-tune is served.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from servelab.perf.cost_model import CostModel, StepBatch
from servelab.perf.engine_config import EngineConfig
from servelab.perf.hardware import Hardware
from servelab.perf.memory import MemoryPlan
from servelab.perf.models import ModelSpec

STEP_OVERHEAD = 0.2
"""Share a step takes longer with LoRA kernels beside the base GEMMs (published range 8-60%; see the docstring)."""
DEFAULT_MAX_LORAS = 1
DEFAULT_MAX_LORA_RANK = 16
"""vLLM's LoRAConfig defaults (max_loras 1, max_lora_rank 16)."""


def slot_bytes(model: ModelSpec, rank: int, tp: int) -> int:
    """One adapter slot's A and B matrices on one GPU: rank x (d_in + d_out) for each adapted linear layer."""
    h, q, kv, inter = (
        model.hidden_size,
        model.num_heads * model.head_dim,
        model.num_kv_heads * model.head_dim,
        model.intermediate_size,
    )
    # q, k, v: h -> q, kv, kv; o: q -> h; gate, up: h -> inter; down: inter -> h.
    in_out = (h + q) + 2 * (h + kv) + (q + h) + 2 * (h + inter) + (inter + h)
    return round(model.num_layers * rank * in_out * model.dtype_bytes / tp)


def adapter_bytes(model: ModelSpec, config: EngineConfig) -> int:
    """The GPU memory vLLM pre-allocates for LoRA slots (0 without --enable-lora)."""
    if not config.enable_lora:
        return 0
    return config.max_loras * slot_bytes(model, config.max_lora_rank, config.tensor_parallel_size)


def reserve(plan: MemoryPlan, model: ModelSpec, config: EngineConfig) -> MemoryPlan:
    """`plan` with the adapter slots taken from the KV cache, as vLLM's profiler does."""
    taken = adapter_bytes(model, config)
    if not taken or config.num_gpu_blocks_override is not None:
        return plan
    kv = max(0, plan.kv_cache_bytes - taken)
    per_block = plan.kv_bytes_per_token * plan.block_size
    return replace(plan, kv_cache_bytes=kv, num_blocks=int(kv // per_block) if per_block else plan.num_blocks)


@dataclass(frozen=True)
class LoraStepCost:
    """The base step's cost model, with the LoRA kernels' time on top of every step."""

    base: CostModel
    adapter_read_s: float
    """One active adapter's weights read once per step at the chip's bandwidth."""

    def step_time(self, batch: StepBatch) -> float:
        return self.base.step_time(batch) * (1 + STEP_OVERHEAD) + self.adapter_read_s

    def wake_time(self, idle_s: float) -> float:
        return self.base.wake_time(idle_s)


def with_lora(cost: CostModel, model: ModelSpec, config: EngineConfig, hardware: Hardware) -> CostModel:
    """`cost` priced with the deployment's adapters (unchanged without --enable-lora)."""
    if not config.enable_lora:
        return cost
    one = slot_bytes(model, config.max_lora_rank, config.tensor_parallel_size)
    return LoraStepCost(cost, one / hardware.memory_bandwidth)


def describe(model: ModelSpec, config: EngineConfig) -> str | None:
    """The price in words, for the deployment's warnings; None without --enable-lora."""
    if not config.enable_lora:
        return None
    return (
        f"--enable-lora: {config.max_loras} adapter slot(s) of rank {config.max_lora_rank} take "
        f"{adapter_bytes(model, config) / 2**20:,.0f} MiB from the KV cache, and every step is priced "
        f"~{STEP_OVERHEAD:.0%} slower for the LoRA kernels (published measurements: 8-60%); merging a single "
        "fine-tune into the base weights removes both"
    )
