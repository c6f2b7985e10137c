"""The engine knobs a deployment sets, with vLLM's own defaults.

`EngineConfig` is what the simulator runs and what `tune` searches over.
Values of None mean "as vLLM would choose for this hardware" and are
resolved by `resolve()` (see perf/engine_args.py for the CLI flag parser).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from servelab.schemas.vocabulary import LEAST_LOADED


@dataclass(frozen=True, slots=True)
class EngineConfig:
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    long_prefill_token_threshold: int = 0
    max_num_partial_prefills: int = 1
    gpu_memory_utilization: float = 0.92
    """vLLM 0.32's CacheConfig default (0.9 before it); `--device-memory-utilization` is the same setting."""
    max_model_len: int | None = None
    block_size: int = 16
    kv_cache_dtype: str = "auto"
    """auto (= model dtype) or fp8."""
    quantization: str | None = None
    """None (bf16/fp16), fp8, int8 (W8A8), awq / gptq (W4A16)."""
    dtype: str = "auto"
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    """Replicas behind a router; for a mixture-of-experts model with `enable_expert_parallel`, data-parallel
    attention ranks sharing one expert-parallel MoE (perf/expert_parallel.py)."""
    enable_expert_parallel: bool = False
    """Whole experts per GPU across all TP x DP ranks instead of every expert sliced over TP (vLLM's
    `--enable-expert-parallel`, SGLang's `--ep-size`); no effect on a dense model."""
    scheduling_policy: str = "fcfs"
    """fcfs or priority."""
    num_gpu_blocks_override: int | None = None
    kv_cache_memory_bytes: int | None = None
    """Fixed KV size (like VLLM_CPU_KVCACHE_SPACE on CPU), overriding gpu_memory_utilization."""
    async_scheduling: bool | None = None
    """Schedule step N+1 while step N runs (None: vLLM's default, on for GPUs, forced off on the CPU backend)."""
    scheduler_reserve_full_isl: bool = True
    """Admit a waiting request only if the KV blocks of its whole prompt are free, not just of its first chunk."""
    watermark: float = 0.0
    """Fraction of all KV blocks kept free when admitting waiting or preempted requests (while others run)."""
    api_server_count: int | None = None
    """API-server processes, each serving its share of the connections on its own core (None: vLLM's default,
    one per data-parallel engine)."""
    stream_interval: int = 1
    """Tokens the API server buffers per streamed chunk (the first token is always sent at once)."""
    enforce_eager: bool = False
    """No CUDA graphs at all (vLLM's `--enforce-eager`, SGLang's `--disable-cuda-graph`): every step's kernels are
    launched one by one from Python, so a step takes at least the host's launch time (CostCoefficients)."""
    cuda_graph_max_batch: int | None = None
    """The largest decode batch a captured CUDA graph replays; larger decode batches run eagerly (SGLang's
    `cuda_graph_max_bs`). None: every decode batch replays one (vLLM V1's capture sizes, padded, cover the batches
    the model prices; beyond them vLLM runs its compiled graph pieces, not op-by-op Python)."""
    cuda_graph_memory_in_kv_budget: bool = True
    """vLLM profiles the CUDA graphs' memory and takes it from the KV budget (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS,
    the default from 0.21); before, the graphs were captured after the KV cache, in the memory left outside
    gpu_memory_utilization, and the KV cache got that much more."""
    profile_sampler_sorts_vocabulary: bool = True
    """vLLM's start-up profile runs a sampler pass whose top-k/top-p sorts the whole vocabulary for max_num_seqs
    rows, and that pass sets the activation peak the KV cache gives way to (perf.memory.MemoryReserve). True in
    releases before 0.17 (their logs and source) and in the modelled one (0.32's dummy pass warms the PyTorch path);
    vLLM 0.17-0.19 log a peak without the sort."""
    enable_lora: bool = False
    """Serve LoRA adapters unmerged (`--enable-lora`): adapter slots take KV memory and every step runs the LoRA
    kernels too (perf/lora.py)."""
    max_loras: int = 1
    """Adapter slots on the GPU (`--max-loras`, vLLM's default 1)."""
    max_lora_rank: int = 16
    """The rank each slot is allocated for (`--max-lora-rank`, vLLM's default 16), whatever the adapters' own."""
    mxfp4_use_marlin: bool = False
    """MXFP4 experts (gpt-oss) run in Marlin even where OpenAI's Triton kernel is installed: vLLM's environment variable
    VLLM_MXFP4_USE_MARLIN=1, read before the launch flags (perf/engine_args.py); no effect on Blackwell, whose FP4
    tensor cores run them (perf/moe_kernels.py)."""
    mxfp4_triton_kernels: bool = True
    """OpenAI's `triton_kernels` is installed with vLLM (in its wheel from 0.12.0, PR #28788): on the GPUs it supports,
    MXFP4 experts run in it rather than in Marlin (perf/moe_kernels.py, expert_kernel). A pip-installed 0.11 or
    earlier lacks it."""
    mxfp4_triton_keeps_checkpoint_scales: bool = False
    """MXFP4 experts in OpenAI's Triton kernel: vLLM keeps the checkpoint's block scales in memory beside the swizzled
    copy the kernel reads, 1/32 byte per expert weight (releases 0.12-0.24; 0.25 frees them, vLLM PR #46549).
    Memory only: perf/moe_kernels.py, mxfp4_held_padding."""
    mxfp4_triton_pads_values_to_64_bytes: bool = False
    """MXFP4 experts in OpenAI's Triton kernel: the triton_kernels vLLM ships pads both dimensions of each expert's
    packed weights to 64 bytes before swizzling them for Hopper (the Triton 3.6 generation shipped in releases
    0.17-0.21); the Triton 3.5 one of the other releases pads only to its 16 x 32-byte tile. Memory only:
    perf/moe_kernels.py, mxfp4_held_padding."""
    eager_prefill: bool = False
    """Steps with prefill run eagerly: SGLang's extend batches (no piecewise graphs by default); vLLM V1 runs them
    through piecewise CUDA graphs, so False."""

    def with_(self, **changes: Any) -> EngineConfig:
        return replace(self, **changes)

    @property
    def api_servers(self) -> int:
        """API-server processes serving: `api_server_count`, else one per data-parallel engine (vLLM's default; the
        other engines' configs leave the count unset)."""
        return self.api_server_count or self.data_parallel_size

    def replica_api_servers(self, router: str) -> int | None:
        """The API servers each replica runs when its replicas are separate servers with `router` in front of them
        (every router but `least-loaded`, vLLM's own data-parallel balancer, which runs inside the API servers its
        engines share): `api_server_count`, 1 by default, as each replica's own launch line sets it. None: the
        engines share `api_servers`."""
        if self.data_parallel_size > 1 and router != LEAST_LOADED:
            return self.api_server_count or 1
        return None

    def api_servers_behind(self, router: str) -> int:
        """API-server processes in all, one core each, with `router` picking the replica."""
        per_replica = self.replica_api_servers(router)
        return self.api_servers if per_replica is None else per_replica * self.data_parallel_size
