"""GPU memory plan, computed the way vLLM V1's worker does at start-up.

vLLM asks for `total_memory * gpu_memory_utilization`, loads the weights, runs
one profiling forward pass of `max_num_batched_tokens` tokens plus a sampler
pass over `max_num_seqs` rows, estimates CUDA-graph memory, and gives what is
left to the KV cache, cut into blocks of `block_size` tokens
(vllm/v1/worker/gpu_worker.py: determine_available_memory). servelab cannot
profile, so the activation and graph terms are estimates (see `MemoryReserve`);
the weights and the KV arithmetic are exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from servelab.perf.engine_config import EngineConfig
from servelab.perf.errors import PerfConfigError
from servelab.perf.hardware import Hardware
from servelab.perf.models import ModelSpec
from servelab.perf.quantization import kv_bytes_per_element, weight_format

GiB = 2**30


@dataclass(frozen=True, slots=True)
class MemoryReserve:
    """Estimates of what vLLM's profiling run measures, per GPU.

    activation: the profiling pass holds, per batched token, about four hidden-size
    vectors (residual, normed input, attention output, MLP output), the fused q/k/v
    projection output and the gate_up + activated MLP outputs (3 x intermediate),
    all in the activation dtype; `activation_factor` scales that for allocator slack.
    sampler: the dummy sampler pass keeps fp32 logits for max_num_seqs rows and about
    two more copies of that size (softmax probabilities, sorted values for top-p).
    cuda_graph_bytes: vLLM logs ~0.5 GiB for capturing its default sizes on 7-8B
    models. non_torch_bytes: cuBLAS workspace and allocator overhead, plus NCCL
    buffers when tensor parallelism is used.

    Checked against vLLM's own profile run as its log reports it (vllm-project/vllm
    PR 10511, Llama-3-8B on H100-80GB, 8,192 batched tokens, 256 sequences):
    activation peak 1.26 GiB measured vs 1.37 GiB here (forward 1.00 + sampler 0.37);
    non-torch 1.79 GiB measured (CUDA context included) vs 0.25 + 0.5 for graphs here.
    The reserve in all is smaller than vLLM's, so the plan never refuses a deployment
    that starts (it grants a little more KV than vLLM did there: 54.6 GiB vs 53.3 GiB).
    """

    activation_factor: float = 1.0
    sampler_copies: float = 3.0
    cuda_graph_bytes: int = GiB // 2
    non_torch_bytes: int = GiB // 4
    nccl_bytes: int = GiB // 2


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """Where each byte of one GPU goes, and the KV capacity that results."""

    total_bytes: int
    requested_bytes: int
    weight_bytes: int
    activation_bytes: int
    cuda_graph_bytes: int
    non_torch_bytes: int
    kv_cache_bytes: int
    kv_bytes_per_token: float
    """Per GPU: this rank's share of the KV heads, all layers."""
    block_size: int
    num_blocks: int

    @property
    def kv_token_capacity(self) -> int:
        return self.num_blocks * self.block_size

    def blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    def max_concurrency(self, seq_len: int) -> int:
        """Requests of `seq_len` tokens (prompt + output) whose KV fits at once."""
        return self.num_blocks // max(1, self.blocks_for(seq_len))


def weight_bytes_per_rank(model: ModelSpec, quantization: str | None, hardware: Hardware, tp: int) -> int:
    """Weights one tensor-parallel rank holds: quantized linears, embedding and LM head in the model dtype.

    vLLM shards the vocabulary of both embedding and LM head across ranks, so every
    term divides by TP (norms and biases are too small to matter).
    """
    fmt = weight_format(quantization, model, hardware)
    linear = model.num_layers * model.layer_linear_params * fmt.bytes_per_param
    vocab = (model.embedding_params + model.lm_head_params) * model.dtype_bytes
    return int((linear + vocab) / tp)


def kv_heads_per_rank(model: ModelSpec, tp: int) -> int:
    """KV heads are split across ranks, and replicated once TP exceeds their number."""
    return max(1, model.num_kv_heads // tp)


def kv_bytes_per_token_per_rank(model: ModelSpec, kv_cache_dtype: str, tp: int) -> float:
    element = kv_bytes_per_element(kv_cache_dtype, model)
    return 2 * model.num_layers * kv_heads_per_rank(model, tp) * model.head_dim * element


def activation_bytes(model: ModelSpec, config: EngineConfig, reserve: MemoryReserve) -> int:
    assert config.max_num_batched_tokens is not None and config.max_num_seqs is not None, "resolve() first"
    tp = config.tensor_parallel_size
    qkv = (model.num_heads + 2 * model.num_kv_heads) * model.head_dim / tp
    per_token = (4 * model.hidden_size + qkv + 3 * model.intermediate_size / tp) * model.dtype_bytes
    forward = config.max_num_batched_tokens * per_token * reserve.activation_factor
    sampler = config.max_num_seqs * model.vocab_size * 4 * reserve.sampler_copies
    return int(forward + sampler)


def plan_memory(
    hardware: Hardware,
    model: ModelSpec,
    config: EngineConfig,
    reserve: MemoryReserve = MemoryReserve(),
) -> MemoryPlan:
    """The KV-cache plan of one replica's GPU, or a PerfConfigError saying why the model does not fit.

    `config` must be resolved (see engine_args.resolve). `kv_cache_memory_bytes`
    (also how VLLM_CPU_KVCACHE_SPACE maps) fixes the KV size and ignores
    gpu_memory_utilization, as vLLM does; `num_gpu_blocks_override` fixes the block count.
    """
    assert config.max_model_len is not None, "resolve() first"
    model = model.with_dtype(config.dtype)
    tp = config.tensor_parallel_size
    total = hardware.memory_bytes
    requested = math.ceil(total * config.gpu_memory_utilization)
    weights = weight_bytes_per_rank(model, config.quantization, hardware, tp)
    activations = activation_bytes(model, config, reserve)
    non_torch = reserve.non_torch_bytes + (reserve.nccl_bytes if tp > 1 else 0)
    graphs = reserve.cuda_graph_bytes if hardware.vendor != "cpu" else 0
    non_kv = weights + activations + non_torch + graphs

    if config.kv_cache_memory_bytes is not None:
        kv_cache = config.kv_cache_memory_bytes
        budget, budget_name = total, f"the {hardware.memory_gib:.1f} GiB of {hardware.name}"
    else:
        kv_cache = requested - non_kv
        budget = requested
        budget_name = (
            f"{requested / GiB:.1f} GiB ({config.gpu_memory_utilization:g} x {hardware.memory_gib:.1f} GiB of {hardware.name})"
        )
    if non_kv + max(kv_cache, 0) > budget or kv_cache <= 0:
        raise PerfConfigError(
            f"{model.name} does not fit: weights {weights / GiB:.1f} GiB per GPU (TP={tp}), "
            f"activations ~{activations / GiB:.1f} GiB, CUDA graphs ~{graphs / GiB:.1f} GiB, other ~{non_torch / GiB:.1f} GiB "
            f"leave {(budget - non_kv) / GiB:.1f} GiB for the KV cache out of {budget_name}; "
            "raise --gpu-memory-utilization or --tensor-parallel-size, quantize the weights, "
            "or lower --max-num-batched-tokens / --max-num-seqs"
        )

    per_token = kv_bytes_per_token_per_rank(model, config.kv_cache_dtype, tp)
    block_bytes = per_token * config.block_size
    num_blocks = config.num_gpu_blocks_override or int(kv_cache // block_bytes)
    plan = MemoryPlan(
        total_bytes=total,
        requested_bytes=requested,
        weight_bytes=weights,
        activation_bytes=activations,
        cuda_graph_bytes=graphs,
        non_torch_bytes=non_torch,
        kv_cache_bytes=int(kv_cache),
        kv_bytes_per_token=per_token,
        block_size=config.block_size,
        num_blocks=num_blocks,
    )
    if plan.kv_token_capacity < config.max_model_len:
        raise PerfConfigError(
            f"max_model_len {config.max_model_len} is larger than the {plan.kv_token_capacity} tokens the KV cache holds "
            f"({kv_cache / GiB:.2f} GiB, {num_blocks} blocks of {config.block_size}); vLLM refuses to start: "
            "lower --max-model-len or give the KV cache more memory"
        )
    return plan
