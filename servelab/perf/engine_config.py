"""The engine knobs a deployment sets, with vLLM's own defaults.

`EngineConfig` is what the simulator runs and what `tune` searches over.
Values of None mean "as vLLM would choose for this hardware" and are
resolved by `resolve()` (see perf/engine_args.py for the CLI flag parser).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class EngineConfig:
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    long_prefill_token_threshold: int = 0
    max_num_partial_prefills: int = 1
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    block_size: int = 16
    kv_cache_dtype: str = "auto"
    """auto (= model dtype) or fp8."""
    quantization: str | None = None
    """None (bf16/fp16), fp8, int8 (W8A8), awq / gptq (W4A16)."""
    dtype: str = "auto"
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    """Replicas behind a router."""
    scheduling_policy: str = "fcfs"
    """fcfs or priority."""
    num_gpu_blocks_override: int | None = None
    kv_cache_memory_bytes: int | None = None
    """Fixed KV size (like VLLM_CPU_KVCACHE_SPACE on CPU), overriding gpu_memory_utilization."""

    def with_(self, **changes: object) -> EngineConfig:
        return replace(self, **changes)
