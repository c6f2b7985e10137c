"""Time of one engine step from its batch: the interface the simulator calls.

The concrete roofline model lives in this module too (see `RooflineCostModel`);
the protocol is what the simulator depends on, so calibration can swap
coefficients without the engine knowing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from servelab.perf.engine_config import EngineConfig
from servelab.perf.errors import PerfConfigError
from servelab.perf.expert_parallel import ExpertLayout, all_to_all_time, expert_layer_scale
from servelab.perf.hardware import ComputeDtype, Hardware
from servelab.perf.kernel_fit import (
    GemmFit,
    GpuKernelFit,
    elementwise_bytes_per_token,
    load_kernel_fit,
    vllm_prefill_attention,
)
from servelab.perf.memory import (
    kv_bytes_per_token_per_rank,
    kv_heads_per_rank,
    routed_expert_bytes,
    weight_bytes_per_rank,
)
from servelab.perf.models import ModelSpec
from servelab.perf.moe_kernels import (
    expert_kernel,
    expert_width_per_rank,
    marlin_linear_flops,
    mla_decode_cost,
    mla_prefill_cost,
    moe_fixed_cost,
    moe_kernel_bandwidth,
    moe_kernel_flops,
    mxfp4_alignment,
    mxfp4_padding,
    round_up,
    triton_moe_rate,
)
from servelab.perf.quantization import WeightFormat, non_expert_weight_format, weight_format
from servelab.schemas.profile import CostCoefficients as CostCoefficients  # re-exported: a profile saves it


@dataclass(slots=True)
class StepBatch:
    """What one engine step computes.

    prefill_chunks: (new tokens computed this step, tokens already in KV before them)
    decode_contexts: context length (tokens in KV) of each decoding request
    """

    prefill_chunks: list[tuple[int, int]] = field(default_factory=list)
    decode_contexts: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(n for n, _ in self.prefill_chunks) + len(self.decode_contexts)


class CostModel(Protocol):
    def step_time(self, batch: StepBatch) -> float:
        """Seconds of wall time for one engine step (GPU work + fixed CPU overhead)."""
        ...

    def wake_time(self, idle_s: float) -> float:
        """Extra seconds the first step after `idle_s` seconds without any step takes (math.inf: idle since start)."""
        ...


def prefill_attention_work(new_tokens: int, cached_tokens: int) -> int:
    """Query-key pairs a causal prefill chunk computes: each new token sees the cache and the chunk up to itself.

    The simulator can keep a running sum of this per step and pass it to
    `RooflineCostModel.step_time_aggregate` instead of building a StepBatch.
    """
    return new_tokens * cached_tokens + new_tokens * (new_tokens + 1) // 2


_GPU_FIELDS = frozenset(
    {
        "compute_efficiency",
        "memory_efficiency",
        "attention_compute_efficiency",
        "attention_memory_efficiency",
        "interconnect_efficiency",
        "allreduce_latency_s",
    }
)
"""The CostCoefficients the kernel fit replaces; a caller who sets any of them (a calibration) keeps the datasheet
form."""

DATASHEET = "datasheet-roofline"

MOE_LAYER_FIXED_S = 2.0e-5
"""Fixed time of one MoE layer's fused-MoE kernel chain (top-k routing, token sorting, the two grouped GEMMs'
launches, activation, weighted sum), beyond the experts' weight traffic: the median of latency minus
weights / (0.87 x HBM bandwidth) over the one-token bf16 rows of aiconfigurator-core 0.12.0's vLLM 0.24.0 fused-MoE
tables on H100-SXM and H200 (h100_sxm|h200_sxm/moe/vllm/0.24.0/moe_perf.parquet, 31 shapes: 18-24 us; B200: 10-40 us).
benchmarks/moe_kernel_check.py compares the whole MoE layer with those tables."""


def kernel_fit_for(
    hardware: Hardware,
    model: ModelSpec,
    engine_config: EngineConfig,
    weights: WeightFormat,
    coefficients: CostCoefficients,
) -> tuple[GpuKernelFit | None, str]:
    """The measured kernel fit this deployment can use, or None and why the datasheet roofline stands.

    `weights` is the format of the weights outside the routed experts: a checkpoint that quantizes only its experts
    (gpt-oss's MXFP4) computes everything else in bf16 on the fit, its experts on their own tensor cores."""
    fit = load_kernel_fit(hardware)
    tp = engine_config.tensor_parallel_size
    if fit is None:
        return None, f"no measured kernel tables for {hardware.name}: datasheet peaks x assumed efficiencies"
    if coefficients.model_fields_set & _GPU_FIELDS:
        return None, "GPU efficiencies given (calibrated or set by hand): they replace the kernel fit"
    if weights.compute_dtype != "bf16" or model.dtype_bytes != 2:
        return None, f"the kernel fit covers bf16/fp16 tensor-core compute, not {weights.name} in {model.dtype}"
    if model.mla:
        return (
            None,
            "the kernel tables hold no multi-head latent attention kernels: datasheet peaks x assumed efficiencies",
        )
    if tp > 1 and tp not in fit.allreduce:
        return None, f"no all-reduce table for TP={tp} on {hardware.name}"
    return fit, f"fitted to {fit.tables['gemm'].split('/')[0]} kernel tables of {fit.device} (docs/kernels.md)"


Shape = tuple[int, int]


def _gemm_groups(
    model: ModelSpec,
    tp: int,
    attention: tuple[Shape, ...],
    mlp: tuple[Shape, ...],
) -> list[tuple[int, tuple[Shape, ...]]]:
    """(layer count, GEMM shapes (n, k) per rank) of the layers' non-routed GEMMs: one group for a dense model;
    attention, dense-MLP layers, and MoE layers' router plus shared experts for a mixture of experts."""
    if not model.moe:
        return [(model.num_layers, attention + mlp)]
    h, moe = model.hidden_size, model.moe
    if model.mla:
        m, heads = model.mla, model.num_heads // tp
        q = (
            ((heads * (m.qk_nope_head_dim + m.qk_rope_head_dim), h),)
            if not m.q_lora_rank
            else ((m.q_lora_rank, h), (heads * (m.qk_nope_head_dim + m.qk_rope_head_dim), m.q_lora_rank))
        )
        attention = (
            *q,
            (m.cached_width, h),
            (heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank),
            (h, heads * m.v_head_dim),
        )
    shared = moe.shared_intermediate_size // tp
    routing = ((moe.num_experts, h),) + (((2 * shared, h), (h, shared)) if shared else ())
    groups = [(model.num_layers, attention), (moe.num_dense_layers, mlp), (model.num_moe_layers, routing)]
    return [(n, shapes) for n, shapes in groups if n]


class RooflineCostModel:
    """Step time of one tensor-parallel rank: GPU kernels, communication and CPU overhead.

    Where measured kernel tables exist for the GPU (servelab/perf/data/kernel_coefficients.yaml,
    `cost_source` "kernel-fit:<gpu>"), each part has the fitted form of docs/kernels.md:

    step = per layer, for each of qkv, o, gate_up, down (and the LM head over sampled tokens):
             smooth(FLOPs (tile costs included) / (peak e), (weights + activations) / (bw e_mem))
             + a launch floor, e saturating in tokens and falling for very large GEMMs
         + decode attention: launch + L2-miss step + (KV tokens + requests x c) x bytes / bw  per layer
         + prefill attention: launch + causal FLOPs (1 + s_half / chunk length) / peak         per layer
           (a model with attention sinks on an Ampere GPU: vLLM's Triton backend, kernel_fit.vllm_prefill_attention)
         + per-layer elementwise kernels (norms, RoPE, activation) and GEMM launch floors
         + 2 all-reduces per layer when TP > 1 (measured latency + bytes / bandwidth)
         + CPU overheads as below
    with smooth(c, m) = (c^p + m^p)^(1/p), the knee p fitted per GPU.

    Otherwise (`cost_source` "datasheet-roofline", the reason in `cost_source_note`):

    step = max(linear FLOPs / peak, weight bytes / bandwidth)            linear layers + LM head
         + max(attention FLOPs / peak, KV bytes read / bandwidth)        attention
         + 2 all-reduces per layer when TP > 1                            interconnect
    with the efficiencies of CostCoefficients. Both add
         + step overhead + per-request overhead x scheduled requests      CPU
         + prefill-step overhead when the step admits prefill chunks       CPU
    and, outside the step's own batch, `wake_time` for a step that follows
    an idle engine (the simulator adds it to the first step after idling).
    The LM head runs only for sampled tokens (one per decode and one per prefill
    chunk, an approximation: vLLM samples only a prefill's last chunk). All
    per-token constants are precomputed (and the fitted GEMM part memoized per
    token count) so a step costs a few float operations.
    `kernels=False` forces the datasheet form (the "before" of benchmarks/kernel_accuracy.py).

    A mixture-of-experts model adds, per MoE layer, its routed experts as one grouped GEMM over the step's
    B tokens: B k token-expert rows spread over the E (1 - (1 - k/E)^B) distinct experts they touch, each
    touched expert's weights read once (docs/moe.md). Fitted form: every touched expert is a GEMM of
    B k / touched rows in the fitted GEMM form; datasheet form: max(routed FLOPs / peak, touched experts'
    bytes / bandwidth). Routers, shared experts and dense-MLP layers are GEMMs like any other; a checkpoint
    that quantizes only its experts (gpt-oss MXFP4) prices attention in the model dtype and the experts in
    their format (FP4 tensor cores on Blackwell, weight-only bf16 compute elsewhere, the experts then no faster than
    the measured rate of the fused-MoE kernel the release runs them in, perf/moe_kernels.py). MLA (DeepSeek) caches
    one latent per token and layer; its decode attention costs max(latent bytes, absorbed-attention FLOPs).
    """

    def __init__(
        self,
        hardware: Hardware,
        model: ModelSpec,
        engine_config: EngineConfig,
        coefficients: CostCoefficients | None = None,
        *,
        kernels: bool = True,
    ) -> None:
        """`engine_config` resolved for the release served (vllm_versions.version_defaults): it decides the fused-MoE
        kernel that weight-only experts run in (perf/moe_kernels.py)."""
        c = coefficients or CostCoefficients()
        self.hardware, self.coefficients = hardware, c
        model = model.with_dtype(engine_config.dtype)
        self.model = model
        tp = engine_config.tensor_parallel_size
        self.weight_format = weight_format(engine_config.quantization, model, hardware)
        self.dense_format = non_expert_weight_format(engine_config.quantization, model, hardware)
        """The format of the weights outside the routed experts (bf16 attention beside gpt-oss's MXFP4 experts)."""
        self._init_weights(engine_config, tp)
        self._decode_attn_s_per_pair: float | None = None
        """Set for MLA, whose absorbed decode attention has its own FLOPs per pair."""
        self._init_mla_block(tp)
        kv_per_token = kv_bytes_per_token_per_rank(model, engine_config.kv_cache_dtype, tp)
        if tp > 1 and hardware.interconnect_bandwidth <= 0:
            raise PerfConfigError(f"{hardware.name} has no GPU interconnect; tensor parallelism is not possible")
        self._init_host_costs(engine_config)

        fit, self.cost_source_note = (
            kernel_fit_for(hardware, model, engine_config, self.dense_format, c)
            if kernels
            else (None, "datasheet form requested")
        )
        self.kernel_fit = fit
        self.cost_source = f"kernel-fit:{hardware.name}" if fit else DATASHEET
        if fit:
            self._init_fitted(fit, model, tp, kv_per_token)
        else:
            self._init_datasheet(engine_config, tp, kv_per_token)

    def _init_weights(self, engine_config: EngineConfig, tp: int) -> None:
        """The weight bytes every step streams, and the routed experts' bytes a step reads only when routed to.

        Embedding rows are gathered, not streamed; a tied embedding is streamed as the LM head. Routed experts are
        read only when some token of the step is routed to them (_expert_time).
        """
        model, hardware = self.model, self.hardware
        streamed = weight_bytes_per_rank(model, engine_config.quantization, hardware, tp)
        if not model.tie_word_embeddings:
            streamed -= model.embedding_params * model.dtype_bytes // tp
        if model.moe:
            streamed -= int(routed_expert_bytes(model, engine_config.quantization, hardware) / tp)
        self._streamed_bytes = streamed
        self._expert_alignment = mxfp4_alignment(model, hardware, engine_config)
        self._expert_padding = padding = mxfp4_padding(model, hardware, engine_config)
        """vLLM pads MXFP4 experts for their kernel: the GPU holds, reads and multiplies the padded shape."""
        self._expert_bytes_per_rank = model.expert_params * padding * self.weight_format.bytes_per_param / tp
        self._moe, self._expert_cache = model.moe, dict[int, float]()
        weight_only = model.moe is not None and self.weight_format.weight_only
        kernel = expert_kernel(self.weight_format, hardware, engine_config) if weight_only else None
        self._expert_width = width = expert_width_per_rank(model, engine_config) if model.moe else 0
        self._expert_gemm_share = 1 / tp if engine_config.enable_expert_parallel else 1.0
        """The fitted form multiplies each touched expert at its width on a rank (whole under expert parallelism) and
        prices the layer as one TP rank's slice of every touched expert, which expert_layer_scale turns into an
        expert-parallel rank's share: a whole expert's GEMMs count 1/TP of their time."""
        rate = moe_kernel_flops(kernel, hardware, self.weight_format, width) if kernel else None
        triton = triton_moe_rate(hardware, self.weight_format) if model.moe is not None and rate is None else None
        rate = triton.flops(width) if triton else rate
        self._expert_kernel_half_rows = (triton.half_rows or 0.0) if triton else 0.0
        """Rows per expert at which vLLM's Triton kernel multiplies at half its rate for the width (0: its rate is a
        large-batch ceiling)."""
        self._expert_kernel_s_per_token = (
            model.routed_expert_flops_per_token * padding / model.num_moe_layers / tp / rate if rate else 0.0
        )
        """Weight-only experts run in a fused-MoE kernel (Marlin, or OpenAI's Triton kernel for MXFP4), and FP8
        experts on FP8 tensor cores and bf16 experts in vLLM's Triton kernel, no faster than its measured rate for the
        experts' format (perf/moe_kernels.py; all but Marlin's fall with each rank's expert width, and the Triton
        kernel's with fewer rows per expert): seconds per routed token and MoE layer at that rate with rows without
        bound, over the padded experts the kernel multiplies; 0 where it is not measured."""
        read_rate = moe_kernel_bandwidth(kernel, hardware, self.weight_format) if kernel else None
        self._expert_kernel_read_s = self._expert_bytes_per_rank / read_rate if read_rate else 0.0
        """Weight-only experts' fused-MoE kernel reads each touched expert's weights no faster than its measured
        small-batch share of the HBM bandwidth (perf/moe_kernels.py, moe_kernel_bandwidth): seconds per touched
        expert and MoE layer; 0 where it is not measured."""
        self._moe_fixed_s = moe_fixed_cost(hardware, self.weight_format) or MOE_LAYER_FIXED_S
        """The fused-MoE chain's fixed cost per layer: measured for FP8 block-scaled experts where tabled, else bf16's
        (perf/moe_kernels.py, moe_fixed_cost)."""
        self.expert_layout = ExpertLayout(tp, engine_config.data_parallel_size, engine_config.enable_expert_parallel)
        self._a2a_link = hardware.interconnect_bandwidth * self.coefficients.interconnect_efficiency

    def _init_mla_block(self, tp: int) -> None:
        """MLA's measured blocks per layer (perf/moe_kernels.py, mla_fp8_moe_kernels), where the tables measure this
        GPU, projection format and head count: the decode block's fixed cost beyond its bytes (fused down
        projection, q up projection, absorbed BMMs, MLA kernel, output projection) and a per-request part; the whole
        prefill block (fixed, per token, per query-key pair), which then replaces the datasheet price of the
        attention projections and the prefill attention FLOPs; and the GPU's fitted launch floors of the layers'
        other kernels (norms and activation, router, shared-expert and dense-MLP GEMMs), which the datasheet form
        that MLA models run in leaves out."""
        model = self.model
        heads = model.num_heads // tp
        decode = mla_decode_cost(self.hardware, self.dense_format, heads) if model.mla else None
        prefill = mla_prefill_cost(self.hardware, self.dense_format, heads) if decode else None
        fit = load_kernel_fit(self.hardware) if prefill else None
        layers = model.num_layers
        self.mla_measured = decode is not None and prefill is not None and fit is not None
        """Whether MLA's blocks are priced from the measured tables (else from bytes and FLOPs alone)."""
        self._mla_decode = (layers * decode.fixed_s, layers * decode.per_request_s) if decode else (0.0, 0.0)
        self._mla_prefill = (
            (layers * prefill.fixed_s, layers * prefill.per_token_s, layers * prefill.per_pair_s)
            if prefill
            else (0.0, 0.0, 0.0)
        )
        self._mla_other_launches = 0.0
        if fit and self.mla_measured:
            moe = model.moe
            shared_gemms = 2 if moe and moe.shared_intermediate_size else 0
            gemms = (moe.num_dense_layers * 2 + model.num_moe_layers * (1 + shared_gemms)) if moe else 2 * layers
            self._mla_other_launches = layers * fit.elementwise.launch_s + gemms * fit.gemm.launch_s

    def mla_block_time(self, num_decodes: int, num_prefill_tokens: int, prefill_attn_work: int) -> float:
        """The measured MLA blocks of a step (see _init_mla_block): the decode path when it decodes, the prefill path
        for its chunks' tokens and query-key pairs, and the other kernels' launch floors once; 0 where not measured."""
        if not self.mla_measured:
            return 0.0
        time = self._mla_other_launches
        if num_decodes:
            fixed, per_request = self._mla_decode
            time += fixed + num_decodes * per_request
        if num_prefill_tokens:
            fixed, per_token, per_pair = self._mla_prefill
            time += fixed + num_prefill_tokens * per_token + prefill_attn_work * per_pair
        return time

    def _init_host_costs(self, engine_config: EngineConfig) -> None:
        """The CPU side of a step (overheads, idle wake-up) and when a step runs without CUDA graphs."""
        c = self.coefficients
        self._step_overhead = c.step_overhead_s
        self._request_overhead = c.per_request_overhead_s
        self._prefill_step_overhead = c.prefill_step_overhead_s
        self._wake, self._wake_tau = c.idle_wake_s, c.idle_wake_time_constant_s
        self.eager_launch_s = self.model.num_layers * c.eager_launch_s_per_layer
        """The host's time to launch one step's layers op by op: the least a step without CUDA graphs takes."""
        self._all_eager, self._eager_prefill = engine_config.enforce_eager, engine_config.eager_prefill
        self._graph_max_batch = engine_config.cuda_graph_max_batch
        self._any_eager = self._all_eager or self._eager_prefill or self._graph_max_batch is not None
        """Whether any step can run without graphs: the per-step check is skipped for vLLM's default deployments."""

    def _init_datasheet(self, engine_config: EngineConfig, tp: int, kv_per_token: float) -> None:
        """Per-token and per-step constants of the datasheet form: peaks x efficiencies, no measured kernels."""
        model, hardware, c = self.model, self.hardware, self.coefficients
        compute_peak = hardware.peak_flops(self.dense_format.compute_dtype)
        attention_peak = hardware.peak_flops("bf16")
        memory_bw = hardware.memory_bandwidth
        self._weight_time = self._streamed_bytes / (memory_bw * c.memory_efficiency)
        if self.mla_measured:  # the measured MLA blocks price every attention projection (and prefill attention)
            attention_flops = 2 * model.num_layers * model.attention_linear_params
            linear_flops = (model.non_expert_linear_flops_per_token - attention_flops) / tp
        else:
            replicated_flops = 2 * model.num_layers * model.replicated_attention_params  # every rank: them whole
            linear_flops = (model.non_expert_linear_flops_per_token - replicated_flops) / tp + replicated_flops
        self._linear_s_per_token = linear_flops / (compute_peak * c.compute_efficiency)
        self._lm_head_s_per_sample = model.lm_head_flops_per_token / tp / (compute_peak * c.compute_efficiency)
        self._attn_s_per_pair = (
            0.0
            if self.mla_measured
            else model.attention_flops_per_pair / tp / (attention_peak * c.attention_compute_efficiency)
        )
        if model.mla:
            self._decode_attn_s_per_pair = (
                model.decode_attention_flops_per_pair / tp / (attention_peak * c.attention_compute_efficiency)
            )
        self._kv_s_per_token = kv_per_token / (memory_bw * c.attention_memory_efficiency)
        if model.moe:
            expert_peak = hardware.peak_flops(self.weight_format.compute_dtype) * c.compute_efficiency
            self._routed_s_per_token = model.routed_expert_flops_per_token * self._expert_padding / tp / expert_peak
            self._expert_read_s = model.num_moe_layers * self._expert_bytes_per_rank / (memory_bw * c.memory_efficiency)
        self._init_allreduce(tp)

    def _init_allreduce(self, tp: int) -> None:
        """Tensor parallelism's two all-reduces per layer: a fixed launch cost and a ring's bytes per token."""
        self._comm_large_from, self._comm_large_fixed, self._comm_large_s_per_token = math.inf, 0.0, 0.0
        if tp <= 1:
            self._comm_fixed = self._comm_s_per_token = 0.0
            return
        model, c = self.model, self.coefficients
        ring = 2 * (tp - 1) / tp
        per_token_bytes = model.hidden_size * model.dtype_bytes
        allreduces = 2 * model.num_layers
        self._comm_fixed = allreduces * c.allreduce_latency_s
        self._comm_s_per_token = (
            allreduces * ring * per_token_bytes / (self.hardware.interconnect_bandwidth * c.interconnect_efficiency)
        )

    def _init_fitted(self, fit: GpuKernelFit, model: ModelSpec, tp: int, kv_per_token: float) -> None:
        """Per-token and per-step constants of the fitted form (formulas: servelab.perf.kernel_fit)."""
        peak, bw, layers = self.hardware.peak_flops("bf16"), self.hardware.memory_bandwidth, model.num_layers
        g, dec, el = fit.gemm, fit.decode_attention, fit.elementwise
        pre, backend_note = vllm_prefill_attention(fit, model.attention_sinks)
        self.cost_source_note += backend_note
        h, d = model.hidden_size, model.head_dim
        heads, kv_heads = model.num_heads // tp, kv_heads_per_rank(model, tp)
        inter = model.intermediate_size // tp
        # qkv, o, gate_up, down of one layer, then the LM head: (n, k) per rank.
        attention, mlp = (((heads + 2 * kv_heads) * d, h), (h, heads * d)), ((2 * inter, h), (h, inter))
        self._p, self._inv_p, self._half_tokens = g.knee_p, 1.0 / g.knee_p, g.half_tokens
        self._throttle, self._throttle_flops = g.throttle, g.throttle_flops
        groups = _gemm_groups(model, tp, attention, mlp)
        dense_bytes, expert_bytes = self.dense_format.bytes_per_param, self.weight_format.bytes_per_param
        self._gemm_groups = tuple(
            (n, tuple(self._gemm_constants(g, *shape, dense_bytes) for shape in shapes)) for n, shapes in groups
        )
        self._lm_head = self._gemm_constants(g, model.vocab_size // tp, h, model.dtype_bytes)
        marlin_rate = marlin_linear_flops(self.hardware, self.dense_format)
        self._dense_kernel_s_per_flop = 1.0 / marlin_rate if marlin_rate else 0.0
        """Linear layers vLLM runs in Marlin's GEMM (FP8 weights without FP8 tensor cores) run no faster than Marlin's
        measured large-batch rate (perf/moe_kernels.py, marlin_linear_flops); 0 where they run on the bf16 fit."""
        launches = sum(n * len(shapes) for n, shapes in groups)
        self._gemm_fixed = (launches + 1) * g.launch_s
        if model.moe:
            hidden_multiple, width_multiple = self._expert_alignment
            width = round_up(self._expert_width, width_multiple)
            padded_hidden = round_up(h, hidden_multiple)
            compute = self.weight_format.compute_dtype
            self._expert_gemms = (
                self._gemm_constants(g, 2 * width, padded_hidden, expert_bytes, compute),
                self._gemm_constants(g, padded_hidden, width, expert_bytes, compute),
            )
        if model.moe:
            inter = model.mlp_activation_width // tp  # the elementwise kernels see the routed rows' activations
        # Step times repeat their token counts (decode batches, the token budget): the GEMM and
        # elementwise part depends on nothing else, so it is computed once per count.
        self._layer_cache: dict[int, float] = {}
        self._lm_head_cache: dict[int, float] = {}
        # Attention, per layer in the tables; summed over layers here.
        kv_layer = kv_per_token / layers
        self._decode_fixed, self._decode_cold = layers * dec.launch_s, layers * dec.cold_s
        self._decode_cache_tokens4 = (dec.cache_bytes / kv_layer) ** 4
        self._decode_half_context = dec.half_context
        self._kv_s_per_token = kv_per_token / (bw * dec.memory_efficiency)
        self._prefill_fixed, self._prefill_half_length = layers * pre.launch_s, pre.half_length
        self._attn_s_per_pair = model.attention_flops_per_pair / tp / (peak * pre.compute_efficiency)
        if model.mla:
            self._decode_attn_s_per_pair = model.decode_attention_flops_per_pair / tp / (peak * pre.compute_efficiency)
        self._elementwise_fixed = layers * el.launch_s
        self._elementwise_s_per_token = (
            layers * elementwise_bytes_per_token(h, heads, kv_heads, inter) / (bw * el.memory_efficiency)
        )
        self._init_fitted_allreduce(fit, model, tp)

    def _init_fitted_allreduce(self, fit: GpuKernelFit, model: ModelSpec, tp: int) -> None:
        """Two all-reduces per layer of `tokens x hidden` values: the fit's line, and where the fit has a switch
        (vLLM's custom all-reduce to NCCL), its second piece from the first token count whose message reaches it."""
        self._init_allreduce(1)
        if tp <= 1:
            return
        ar, token_bytes, calls = fit.allreduce[tp], model.hidden_size * model.dtype_bytes, 2 * model.num_layers
        self._comm_fixed, self._comm_s_per_token = calls * ar.latency_s, calls * token_bytes * ar.seconds_per_byte
        if ar.switch_bytes is None:
            return
        at_switch = ar.latency_s + ar.switch_bytes * ar.seconds_per_byte + ar.switch_jump_s
        self._comm_large_from = math.ceil(ar.switch_bytes / token_bytes)
        self._comm_large_s_per_token = calls * token_bytes * ar.large_seconds_per_byte
        self._comm_large_fixed = calls * (at_switch - ar.switch_bytes * ar.large_seconds_per_byte)

    def _communication(self, num_tokens: int) -> float:
        """Tensor parallelism's all-reduces in a step of `num_tokens` tokens."""
        if num_tokens >= self._comm_large_from:
            return self._comm_large_fixed + num_tokens * self._comm_large_s_per_token
        return self._comm_fixed + num_tokens * self._comm_s_per_token

    def _gemm_constants(
        self, g: GemmFit, n: int, k: int, weight_bytes_per_param: float, compute_dtype: ComputeDtype = "bf16"
    ) -> tuple[float, float, float, float]:
        """(s per token at peak efficiency incl. tile overhead, FLOPs per token, weight s, activation s per token).

        A weight-only format (FP8 or 4-bit weights on a GPU without their tensor cores) is the bf16 GEMM with its
        weights read at their stored size: the kernel dequantizes them into the same bf16 tensor-core work. Experts
        that compute on FP8 or FP4 tensor cores beside bf16 layers (gpt-oss's MXFP4 on Blackwell) take the bf16 fit's
        shape at their own peak: the tables time bf16 GEMMs only, so the same efficiency of that peak is assumed."""
        peak, bw = self.hardware.peak_flops(compute_dtype), self.hardware.memory_bandwidth * g.memory_efficiency
        size = self.model.dtype_bytes
        return (
            2 * n * (k + g.half_depth) / (peak * g.peak_efficiency),
            2.0 * n * k,
            n * k * weight_bytes_per_param / bw,
            (n + k) * size / bw,
        )

    def _gemm_time(self, m: float, constants: tuple[float, float, float, float]) -> float:
        """One GEMM of m tokens in the fitted form (kernel_fit.gemm_time without its launch floor)."""
        per_token, flops_per_token, weights, activations = constants
        flops = m * flops_per_token
        compute = (m + self._half_tokens) * per_token / (1 - self._throttle * flops / (flops + self._throttle_flops))
        return (compute**self._p + (weights + m * activations) ** self._p) ** self._inv_p

    def _dense_gemm_time(self, m: float, constants: tuple[float, float, float, float]) -> float:
        """One of the layers' non-routed GEMMs of m tokens: the fitted form, held to Marlin's rate where vLLM runs the
        layer in Marlin (FP8 weights on Ampere)."""
        return max(self._gemm_time(m, constants), m * constants[1] * self._dense_kernel_s_per_flop)

    def step_time_aggregate(
        self,
        num_prefill_tokens: int,
        prefill_attn_work: int,
        num_decodes: int,
        sum_decode_context: int,
        num_sampled: int,
        prefill_context_tokens: int = 0,
    ) -> float:
        """Step time from batch totals, for a simulator that keeps running sums.

        prefill_attn_work: sum of `prefill_attention_work(n, c)` over the step's chunks;
        sum_decode_context: tokens in KV over decoding requests; num_sampled: prefill
        chunks + decodes (also the count of scheduled requests); prefill_context_tokens:
        sum of the chunks' cached tokens (their KV is read once per chunk).
        """
        num_tokens = num_prefill_tokens + num_decodes
        if num_tokens == 0:
            return 0.0
        if self.model.sliding_layers:  # sliding-window layers attend to, and read, at most a window per query
            prefill_attn_work = int(self.model.windowed(prefill_attn_work, num_prefill_tokens))
            sum_decode_context = int(self.model.windowed(sum_decode_context, num_decodes))
            prefill_context_tokens = int(self.model.windowed(prefill_context_tokens, num_sampled - num_decodes))
        if self.kernel_fit:
            return self._fitted_step(
                num_prefill_tokens,
                prefill_attn_work,
                num_decodes,
                sum_decode_context,
                num_sampled,
                prefill_context_tokens,
            )
        linear = max(
            num_tokens * self._linear_s_per_token + num_sampled * self._lm_head_s_per_sample,
            self._weight_time,
        )
        if self._moe:
            linear += self._expert_time(num_tokens)
        if self._decode_attn_s_per_pair is None:
            attention_flops_time = (prefill_attn_work + sum_decode_context + num_decodes) * self._attn_s_per_pair
        else:
            attention_flops_time = (
                prefill_attn_work * self._attn_s_per_pair
                + (sum_decode_context + num_decodes) * self._decode_attn_s_per_pair
            )
        attention = max(
            attention_flops_time,
            (sum_decode_context + prefill_context_tokens + num_prefill_tokens) * self._kv_s_per_token,
        ) + self.mla_block_time(num_decodes, num_prefill_tokens, prefill_attn_work)
        communication = self._communication(num_tokens)
        cpu = self._step_overhead + num_sampled * self._request_overhead
        if num_sampled > num_decodes:  # at least one prefill chunk
            cpu += self._prefill_step_overhead
        return self._launched(linear + attention, num_decodes, num_sampled > num_decodes) + communication + cpu

    def runs_eagerly(self, num_decodes: int, has_prefill: bool) -> bool:
        """Whether a step of this shape runs without a CUDA graph: always under enforce_eager; a step with prefill
        when prefills are not captured (SGLang's extend batches); a decode batch above the largest captured one."""
        if self._all_eager:
            return True
        if has_prefill:
            return self._eager_prefill
        return self._graph_max_batch is not None and num_decodes > self._graph_max_batch

    def _launched(self, gpu: float, num_decodes: int, has_prefill: bool) -> float:
        """A step's kernel time, or the host's time to launch them one by one when the step runs without CUDA graphs
        and the launches are the slower (see CostCoefficients.eager_launch_s_per_layer)."""
        if self._any_eager and self.runs_eagerly(num_decodes, has_prefill):
            return max(gpu, self.eager_launch_s)
        return gpu

    def _fitted_step(
        self,
        num_prefill_tokens: int,
        prefill_attn_work: int,
        num_decodes: int,
        sum_decode_context: int,
        num_sampled: int,
        prefill_context_tokens: int,
    ) -> float:
        """`step_time_aggregate` in the fitted form (see the class docstring)."""
        num_tokens = num_prefill_tokens + num_decodes
        layers = self._layer_cache.get(num_tokens)
        if layers is None:
            layers = self._layer_cache[num_tokens] = (
                sum(n * sum(self._dense_gemm_time(num_tokens, c) for c in gemms) for n, gemms in self._gemm_groups)
                + self._elementwise_fixed
                + num_tokens * self._elementwise_s_per_token
            )
            if self._moe:
                layers += self._expert_time(num_tokens)
                self._layer_cache[num_tokens] = layers
        lm_head = self._lm_head_cache.get(num_sampled)
        if lm_head is None:
            lm_head = self._lm_head_cache[num_sampled] = self._gemm_time(num_sampled, self._lm_head) + self._gemm_fixed
        gpu = layers + lm_head
        if num_decodes:
            kv2 = sum_decode_context * sum_decode_context
            kv4 = kv2 * kv2
            gpu += (
                self._decode_fixed
                + self._decode_cold * kv4 / (kv4 + self._decode_cache_tokens4)
                + (sum_decode_context + num_decodes * self._decode_half_context) * self._kv_s_per_token
            )
        chunks = num_sampled - num_decodes
        if chunks:
            # Kernel efficiency grows with the keys a chunk attends to (its new tokens plus its cache).
            keys = (num_prefill_tokens + prefill_context_tokens) / chunks
            gpu += self._prefill_fixed + max(
                prefill_attn_work * self._attn_s_per_pair * (1 + self._prefill_half_length / keys),
                prefill_context_tokens * self._kv_s_per_token,
            )
        cpu = self._step_overhead + num_sampled * self._request_overhead
        if chunks:
            cpu += self._prefill_step_overhead
        return self._launched(gpu, num_decodes, chunks > 0) + self._communication(num_tokens) + cpu

    def weight_bytes_read(self, num_tokens: int) -> float:
        """Weight bytes one rank reads from memory in a step of `num_tokens` tokens: every weight outside the routed
        experts (the LM head too; embedding rows are gathered, not streamed) and, in each MoE layer, every expert
        some token is routed to, once (uniform routing, MoESpec.experts_touched)."""
        if not self._moe:
            return float(self._streamed_bytes)
        routed = num_tokens * (self.expert_layout.data_parallel_size if self.expert_layout.dispatches else 1)
        share = self.expert_layout.tensor_parallel_size / self.expert_layout.expert_shards
        touched = self._moe.experts_touched(routed)
        return self._streamed_bytes + self.model.num_moe_layers * touched * self._expert_bytes_per_rank * share

    def _expert_time(self, num_tokens: int) -> float:
        """The routed experts of all MoE layers for a step of `num_tokens` tokens, routed uniformly (see the class)."""
        cached = self._expert_cache.get(num_tokens)
        if cached is None:
            assert self._moe is not None
            layout = self.expert_layout
            routed = num_tokens * (layout.data_parallel_size if layout.dispatches else 1)  # DP ranks step together
            touched = self._moe.experts_touched(routed)
            fixed = self.model.num_moe_layers * self._moe_fixed_s  # launches and routing: every rank, unscaled
            grouped = self.model.num_moe_layers * self.moe_layer_time(routed, touched) - fixed
            cached = self._expert_cache[num_tokens] = (
                fixed
                + grouped * expert_layer_scale(layout, self._moe, routed)
                + all_to_all_time(self.model, layout, num_tokens, self._a2a_link, self.coefficients.allreduce_latency_s)
            )
        return cached

    def moe_layer_time(self, num_tokens: float, touched_experts: float) -> float:
        """One MoE layer's routed-expert kernels when `num_tokens` tokens are routed to `touched_experts` distinct
        experts: the fused-MoE kernel chain's fixed cost plus one grouped GEMM (gate_up, then down) over them."""
        assert self._moe is not None
        rows = num_tokens * self._moe.experts_per_token / touched_experts if touched_experts else 0.0
        if self.kernel_fit:
            gemms = sum(self._gemm_time(rows, c) for c in self._expert_gemms)
            grouped = touched_experts * gemms * self._expert_gemm_share
        else:
            per_layer = self.model.num_moe_layers
            grouped = max(num_tokens * self._routed_s_per_token, touched_experts * self._expert_read_s) / per_layer
        fill = 1 + self._expert_kernel_half_rows / rows if rows else 1.0
        compute = num_tokens * self._expert_kernel_s_per_token * fill
        kernel_floor = max(compute, touched_experts * self._expert_kernel_read_s)
        return self._moe_fixed_s + max(grouped, kernel_floor)

    def wake_time(self, idle_s: float) -> float:
        """`idle_wake_s` scaled by how long the engine idled (see CostCoefficients.idle_wake_s); 0 when it never did."""
        if idle_s <= 0 or not self._wake:
            return 0.0
        return self._wake * -math.expm1(-idle_s / self._wake_tau)

    def step_time(self, batch: StepBatch) -> float:
        prefill_tokens = attn_work = context = 0
        for new, cached in batch.prefill_chunks:
            prefill_tokens += new
            context += cached
            attn_work += new * cached + new * (new + 1) // 2
        decodes = len(batch.decode_contexts)
        return self.step_time_aggregate(
            prefill_tokens,
            attn_work,
            decodes,
            sum(batch.decode_contexts),
            len(batch.prefill_chunks) + decodes,
            context,
        )
