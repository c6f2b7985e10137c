"""What "GPU utilisation" should mean: FLOP/s and bytes/s against the chip's peaks.

nvidia-smi's utilisation is the share of time any kernel is running, so a
decode-heavy server shows 100% while its tensor cores idle, and a lightly
loaded one shows 30% while each of its steps is bandwidth-bound. The honest
numbers are model FLOPs utilisation (MFU) and memory-bandwidth utilisation
(MBU). They come from the server's own estimates when it exports them
(vllm:estimated_flops_per_gpu_total), otherwise from the model's arithmetic
applied to the measured token rates.
"""

from __future__ import annotations

from servelab.perf.expert_parallel import step_weight_bytes
from servelab.perf.memory import kv_bytes_per_token_per_rank
from servelab.perf.quantization import weight_format
from servelab.schemas.diagnosis import Evidence, Utilization
from servelab.schemas.vocabulary import FlopSource
from servelab.targets.deployment import Deployment


def utilization(e: Evidence, d: Deployment) -> Utilization:
    model, cfg, hw = d.model, d.config, d.hardware
    fmt = weight_format(cfg.quantization, model, hw)
    peak = hw.peak_flops(fmt.compute_dtype) * cfg.tensor_parallel_size
    bandwidth = hw.memory_bandwidth * cfg.tensor_parallel_size

    # Prompt tokens the prefix cache served are not computed; the computed ones still attend to the cached ones.
    computed = e.mean_input_tokens * (1 - (e.prefix_hit_rate or 0.0))
    prompt_tps = e.request_rate * computed
    context = e.mean_input_tokens + e.mean_output_tokens / 2
    prefill = prompt_tps * (
        model.linear_flops_per_token + model.attention_flops_per_pair * (e.mean_input_tokens - computed / 2)
    )
    prefill += e.request_rate * model.lm_head_flops_per_token
    decode = e.output_throughput * (
        model.linear_flops_per_token + model.lm_head_flops_per_token + model.attention_flops_per_pair * context
    )
    flops_replica = (prefill + decode) / cfg.data_parallel_size
    source = FlopSource.MODEL
    if e.achieved_flops:
        flops_replica, source = e.achieved_flops * cfg.tensor_parallel_size, FlopSource.SERVER

    batch = max(1.0, e.mean_running or e.mean_in_flight)
    # Per replica: a rank's share times TP; a MoE step reads only the experts its batch is routed to.
    weights = step_weight_bytes(model, cfg, hw, batch / cfg.data_parallel_size) * cfg.tensor_parallel_size
    kv_token = kv_bytes_per_token_per_rank(model, cfg.kv_cache_dtype, 1)
    steps = e.steps_per_s
    if steps is None:
        steps = e.output_throughput / batch
    steps_replica = steps / cfg.data_parallel_size if e.steps_per_s is None else steps
    bytes_replica = steps_replica * weights + (e.output_throughput / cfg.data_parallel_size) * context * kv_token
    if e.achieved_read_bandwidth:
        bytes_replica = e.achieved_read_bandwidth * cfg.tensor_parallel_size

    c = d.coefficients
    mfu = flops_replica / peak
    mbu = bytes_replica / bandwidth
    total = prefill + decode
    return Utilization(
        flops_per_gpu=flops_replica / cfg.tensor_parallel_size,
        peak_flops=peak / cfg.tensor_parallel_size,
        mfu=mfu,
        prefill_flop_share=prefill / total if total else 0.0,
        bytes_per_gpu=bytes_replica / cfg.tensor_parallel_size,
        peak_bandwidth=hw.memory_bandwidth,
        mbu=mbu,
        compute_headroom=mfu / c.compute_efficiency,
        bandwidth_headroom=mbu / c.memory_efficiency,
        engine_busy=e.engine_busy,
        source=source,
    )
