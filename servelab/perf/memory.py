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
from servelab.perf.moe_kernels import mxfp4_held_padding
from servelab.perf.quantization import kv_bytes_per_element, non_expert_weight_format, weight_format

GiB = 2**30


@dataclass(frozen=True, slots=True)
class MemoryReserve:
    """Estimates of what vLLM's profiling run measures, per GPU.

    The profile run is a forward pass of max_num_batched_tokens tokens, then a
    dummy sampler pass over min(max_num_seqs, max_num_batched_tokens) rows
    (vllm/v1/worker/gpu_model_runner.py: profile_run, _dummy_sampler_run). The
    forward's intermediates are freed before the sampler runs, so the activation
    peak is the larger of the two, not their sum:

    forward: per batched token about four hidden-size vectors (residual, normed
    input, attention output, MLP output), the fused q/k/v projection output and
    the gate_up + activated MLP outputs (3 x intermediate), in the activation
    dtype; `activation_factor` scales that for allocator slack.
    sampler: the forward's hidden states (tokens x hidden) stay alive, and the
    logits of every row over the full vocabulary (gathered on every TP rank) are
    held as `sampler_bytes_per_logit` bytes per element at the sampler's peak.
    The dummy pass asks for top-k and top-p, so vLLM's PyTorch top-k/top-p path
    sorts the whole vocabulary (sampler.py, ops/topk_topp_sampler.py
    apply_top_k_top_p): the model-dtype logits (2 bytes), their fp32 copy (4),
    the sorted values (4) and int64 indices (8) the sort returns, and the sort's
    own scratch, an int64 index input and the radix sort's alternate key and
    value buffers (8 + 4 + 8): 38 bytes in all. That count is read from the
    code, not fitted; vLLM's logs of releases before 0.17 put the whole peak at
    38.0-38.4 bytes per logit for five models (data/measured_startups.yaml,
    benchmarks/memory_plan_check.py). vLLM 0.17-0.19 log a peak of about 15
    bytes per logit (their dummy pass does not sort the vocabulary:
    EngineConfig.profile_sampler_sorts_vocabulary); `unsorted_sampler_bytes_per_logit`
    is read off those logs (Llama-3.1-8B, Qwen2.5-7B, Qwen3-8B on vLLM 0.19),
    so the check does not score them.
    cuda_graph_bytes: vLLM logs ~0.5 GiB for capturing its default sizes on 7-8B
    models; it comes out of the KV budget only where vLLM profiles it (from 0.21,
    EngineConfig.cuda_graph_memory_in_kv_budget). Before, the graphs are captured
    after the KV cache is allocated, in the memory gpu_memory_utilization leaves.
    non_torch_bytes: cuBLAS workspace and allocator overhead that the profile run
    adds outside PyTorch (the CUDA context is not counted: vLLM's baseline
    snapshot is taken after it), plus NCCL and custom all-reduce buffers when
    tensor parallelism is used. vLLM 0.8.5's V1 worker takes no such snapshot
    (vllm/v1/worker/gpu_worker.py, Worker.determine_available_memory, v0.8.5: all
    device memory in use outside PyTorch after the profile run), so it counts the
    CUDA context too, and its KV cache is smaller than planned here: for Qwen3-8B on
    one L4 at 0.9, ree2raz/inference-bench (context.md at 6219100) reports 3.83 GiB
    available where this plan gives 4.51 GiB.
    """

    activation_factor: float = 1.0
    sampler_bytes_per_logit: float = 38.0
    unsorted_sampler_bytes_per_logit: float = 15.0
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
    """Per GPU: this rank's share of the KV heads, over the layers that keep every token (all but sliding-window
    layers, see kv_block_bytes_per_token_per_rank)."""
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
    term divides by TP (norms and biases are too small to matter) but MLA's down projections, which every rank
    holds whole (`ModelSpec.replicated_attention_params`). Every expert of a
    mixture-of-experts model is resident, each sharded across the TP ranks.
    """
    dense = non_expert_weight_format(quantization, model, hardware).bytes_per_param
    linear = model.non_expert_linear_params * dense
    if model.moe:
        linear += routed_expert_bytes(model, quantization, hardware)
    vocab = (model.embedding_params + model.lm_head_params) * model.dtype_bytes
    replicated = model.num_layers * model.replicated_attention_params * dense
    return int((linear + vocab - replicated) / tp + replicated)


def routed_expert_bytes(model: ModelSpec, quantization: str | None, hardware: Hardware) -> float:
    """Bytes of all routed experts of all MoE layers, over all ranks (0 for a dense model)."""
    return model.routed_expert_params * weight_format(quantization, model, hardware).bytes_per_param


def kv_heads_per_rank(model: ModelSpec, tp: int) -> int:
    """KV heads are split across ranks, and replicated once TP exceeds their number (MLA's one latent: every rank)."""
    if model.mla:
        return 1
    return max(1, model.num_kv_heads // tp)


def kv_bytes_per_token_per_rank(model: ModelSpec, kv_cache_dtype: str, tp: int) -> float:
    """KV bytes one token of context occupies on one rank, over every attention layer."""
    element = kv_bytes_per_element(kv_cache_dtype, model)
    if model.mla:
        return model.kv_bytes_per_token(element)
    return 2 * model.num_layers * kv_heads_per_rank(model, tp) * model.head_dim * element


def kv_block_bytes_per_token_per_rank(model: ModelSpec, kv_cache_dtype: str, tp: int) -> float:
    """KV-cache bytes the block pool spends per token of a long sequence on one rank.

    A model whose config.json gives some layers a sliding window (gpt-oss: every other layer, 128 tokens) runs on
    vLLM's hybrid KV-cache manager: the full-attention and the sliding-window layers form groups of equal size that
    share one pool of same-sized pages (vllm/v1/core/kv_cache_utils.py, _get_kv_cache_groups_uniform_page_size), and
    a sliding group frees the blocks that fall out of its window (single_type_kv_cache_manager.py,
    SlidingWindowManager). A long sequence holds blocks for its every token in the full-attention layers only, plus
    about window / block_size blocks per sliding group: the pool's capacity in tokens is its bytes over the
    full-attention layers' share.
    """
    every_layer = kv_bytes_per_token_per_rank(model, kv_cache_dtype, tp)
    return every_layer * model.full_attention_layers / model.num_layers


def forward_activation_bytes(model: ModelSpec, config: EngineConfig, reserve: MemoryReserve) -> int:
    """Peak of the profile run's forward pass over max_num_batched_tokens tokens (see MemoryReserve)."""
    assert config.max_num_batched_tokens is not None, "resolve() first"
    tp = config.tensor_parallel_size
    qkv = (model.num_heads + 2 * model.num_kv_heads) * model.head_dim / tp
    per_token = (4 * model.hidden_size + qkv + 3 * model.mlp_activation_width / tp) * model.dtype_bytes
    return int(config.max_num_batched_tokens * per_token * reserve.activation_factor)


def sampler_activation_bytes(model: ModelSpec, config: EngineConfig, reserve: MemoryReserve) -> int:
    """Peak of the dummy sampler pass: the forward's hidden states plus the sorted full-vocabulary logits."""
    assert config.max_num_batched_tokens is not None and config.max_num_seqs is not None, "resolve() first"
    rows = min(config.max_num_seqs, config.max_num_batched_tokens)
    hidden = config.max_num_batched_tokens * model.hidden_size * model.dtype_bytes
    per_logit = (
        reserve.sampler_bytes_per_logit
        if config.profile_sampler_sorts_vocabulary
        else reserve.unsorted_sampler_bytes_per_logit
    )
    return int(hidden + rows * model.vocab_size * per_logit)


def activation_bytes(model: ModelSpec, config: EngineConfig, reserve: MemoryReserve) -> int:
    """PyTorch's activation peak in the profile run: the forward's or the sampler's, whichever is larger."""
    return max(forward_activation_bytes(model, config, reserve), sampler_activation_bytes(model, config, reserve))


def cuda_graph_reserve(hardware: Hardware, config: EngineConfig, reserve: MemoryReserve) -> int:
    """CUDA-graph memory taken from the KV budget: none on CPU, under --enforce-eager, or in releases before 0.21."""
    if hardware.vendor == "cpu" or config.enforce_eager or not config.cuda_graph_memory_in_kv_budget:
        return 0
    return reserve.cuda_graph_bytes


def rank_weight_bytes(model: ModelSpec, config: EngineConfig, hardware: Hardware) -> int:
    """Weights one GPU holds: its routed experts as vLLM lays them out for their kernel
    (moe_kernels.mxfp4_held_padding)."""
    return int(weight_bytes_with_experts(model, config, hardware, mxfp4_held_padding(model, hardware, config)))


def weight_bytes_with_experts(
    model: ModelSpec, config: EngineConfig, hardware: Hardware, padding: float, touched: float = 1.0
) -> float:
    """One GPU's weights with its share of the routed experts (its TP slice of every expert, or with expert parallelism
    over data-parallel ranks 1/(TP x DP) of them) at `padding` over their published bytes, and only the fraction
    `touched` of them: all of them to hold (rank_weight_bytes), the ones a step's tokens are routed to to read
    (expert_parallel.step_weight_bytes)."""
    tp = config.tensor_parallel_size
    weights = weight_bytes_per_rank(model, config.quantization, hardware, tp)
    if not model.moe:
        return float(weights)
    experts = routed_expert_bytes(model, config.quantization, hardware) / tp
    share = 1 / config.data_parallel_size if config.enable_expert_parallel else 1.0
    return weights - experts + experts * padding * share * touched


def _kv_budget(hardware: Hardware, config: EngineConfig, non_kv: int) -> tuple[int, int, str]:
    """(KV-cache bytes, the budget they come out of, that budget in words) as vLLM sizes them.

    `kv_cache_memory_bytes` fixes the KV size and ignores gpu_memory_utilization, as vLLM does.
    """
    total = hardware.memory_bytes
    if config.kv_cache_memory_bytes is not None:
        return config.kv_cache_memory_bytes, total, f"the {hardware.memory_gib:.1f} GiB of {hardware.name}"
    requested = math.ceil(total * config.gpu_memory_utilization)
    words = (
        f"{requested / GiB:.1f} GiB ({config.gpu_memory_utilization:g} x {hardware.memory_gib:.1f} GiB "
        f"of {hardware.name})"
    )
    return requested - non_kv, requested, words


def _does_not_fit(model: ModelSpec, tp: int, terms: dict[str, int], budget: int, budget_name: str) -> PerfConfigError:
    non_kv = sum(terms.values())
    return PerfConfigError(
        f"{model.name} does not fit: weights {terms['weights'] / GiB:.1f} GiB per GPU (TP={tp}), "
        f"activations ~{terms['activations'] / GiB:.1f} GiB, CUDA graphs ~{terms['graphs'] / GiB:.1f} GiB, "
        f"other ~{terms['non_torch'] / GiB:.1f} GiB "
        f"leave {(budget - non_kv) / GiB:.1f} GiB for the KV cache out of {budget_name}; "
        "raise --gpu-memory-utilization or --tensor-parallel-size, quantize the weights, "
        "or lower --max-num-batched-tokens / --max-num-seqs"
    )


def _check_max_model_len(plan: MemoryPlan, max_model_len: int) -> None:
    """vLLM refuses to start when one request of max_model_len tokens cannot fit in the KV cache."""
    if plan.kv_token_capacity < max_model_len:
        raise PerfConfigError(
            f"max_model_len {max_model_len} is larger than the {plan.kv_token_capacity} tokens the KV cache "
            f"holds ({plan.kv_cache_bytes / GiB:.2f} GiB, {plan.num_blocks} blocks of {plan.block_size}); "
            "vLLM refuses to start: lower --max-model-len or give the KV cache more memory"
        )


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
    terms = {
        "weights": rank_weight_bytes(model, config, hardware),
        "activations": activation_bytes(model, config, reserve),
        "non_torch": reserve.non_torch_bytes + (reserve.nccl_bytes if tp > 1 else 0),
        "graphs": cuda_graph_reserve(hardware, config, reserve),
    }
    non_kv = sum(terms.values())
    kv_cache, budget, budget_name = _kv_budget(hardware, config, non_kv)
    if non_kv + max(kv_cache, 0) > budget or kv_cache <= 0:
        raise _does_not_fit(model, tp, terms, budget, budget_name)
    per_token = kv_block_bytes_per_token_per_rank(model, config.kv_cache_dtype, tp)
    plan = MemoryPlan(
        total_bytes=hardware.memory_bytes,
        requested_bytes=math.ceil(hardware.memory_bytes * config.gpu_memory_utilization),
        weight_bytes=terms["weights"],
        activation_bytes=terms["activations"],
        cuda_graph_bytes=terms["graphs"],
        non_torch_bytes=terms["non_torch"],
        kv_cache_bytes=int(kv_cache),
        kv_bytes_per_token=per_token,
        block_size=config.block_size,
        num_blocks=config.num_gpu_blocks_override or int(kv_cache // (per_token * config.block_size)),
    )
    _check_max_model_len(plan, config.max_model_len)
    return plan
