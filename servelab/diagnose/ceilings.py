"""Physical ceilings for one workload on one deployment, from the cost model alone.

Each ceiling answers "how far could this go if only this limited it": pure
prefill compute, decode at the batch actually achieved, KV memory, the
max_num_seqs cap. The simulator adds the one that combines them all (the
saturation rate) and the SLO-constrained rate; see diagnose/capacity.py.
"""

from __future__ import annotations

import math

from servelab.perf.cost_model import CostModel, StepBatch
from servelab.perf.engine_config import EngineConfig
from servelab.perf.memory import MemoryPlan
from servelab.perf.models import ModelSpec
from servelab.schemas.diagnosis import Ceilings


def prefill_request_time(cost: CostModel, input_len: int, budget: int) -> float:
    """Engine seconds one prompt costs when prefills fill every step's token budget."""
    if input_len <= budget:
        per_step = max(1, budget // input_len)
        return cost.step_time(StepBatch(prefill_chunks=[(input_len, 0)] * per_step)) / per_step
    total, done = 0.0, 0
    while done < input_len:
        chunk = min(budget, input_len - done)
        total += cost.step_time(StepBatch(prefill_chunks=[(chunk, done)]))
        done += chunk
    return total


def decode_tps(cost: CostModel, batch: int, context: int) -> float:
    batch = max(1, batch)
    return batch / cost.step_time(StepBatch(decode_contexts=[context] * batch))


def compute_ceilings(
    cost: CostModel,
    model: ModelSpec,
    config: EngineConfig,
    memory: MemoryPlan,
    *,
    input_len: float,
    output_len: float,
    achieved_batch: float,
    cached_len: float = 0.0,
) -> Ceilings:
    """`config` must be resolved; lengths are the workload's means (tokens).

    `cached_len` prompt tokens per request come from the prefix cache (a
    shared system prompt, resent history): prefill computes only the rest,
    which still attends to them.
    """
    assert config.max_num_seqs is not None and config.max_num_batched_tokens is not None
    replicas = config.data_parallel_size
    input_len_i, output_len_i = max(1, round(input_len)), max(1, round(output_len))
    kv_seqs = memory.max_concurrency(input_len_i + output_len_i)
    max_batch = max(1, min(config.max_num_seqs, kv_seqs))
    mid_context = input_len_i + output_len_i // 2
    computed = max(1, round(input_len - cached_len))
    prefill_s = prefill_request_time(cost, computed, config.max_num_batched_tokens)
    return Ceilings(
        prefill_compute_rps=replicas / prefill_s,
        prefill_flops_per_request=float(
            computed * model.linear_flops_per_token
            + model.attention_flops_per_pair * computed * (input_len_i - computed / 2)
        ),
        decode_bandwidth_tps=replicas * decode_tps(cost, math.ceil(achieved_batch), mid_context),
        decode_batch=achieved_batch,
        decode_bandwidth_tps_at_max_batch=replicas * decode_tps(cost, max_batch, mid_context),
        max_decode_batch=max_batch,
        kv_capacity_seqs=kv_seqs,
        max_num_seqs=config.max_num_seqs,
        replicas=replicas,
        slo_max_rps=None,
        saturation_rps=None,
    )
