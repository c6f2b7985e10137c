"""Each serving engine's Prometheus names, mapped onto the timeline's common ones.

A timeline is keyed by the names in `servelab.metrics.timeline` (vLLM's own:
the simulator reproduces them and every reader of a timeline names metrics
through them). Another engine exports the same quantities under its own
names; its adapter says which of its names is which common quantity, so a
scrape of SGLang, TensorRT-LLM or llama.cpp fills the same columns that
`diagnose`, `report` and the server timings read. The engine's own names are
kept beside the common ones: nothing it exports is lost in the mapping.

Where an engine has no counterpart of a common quantity (llama.cpp has no
KV-usage gauge, TensorRT-LLM no preemption counter) the column is simply
absent, never a guess. The names come from each engine's metric source:
SGLang 0.5.23 `python/sglang/srt/observability/metrics_collector.py`,
TensorRT-LLM `tensorrt_llm/metrics/collector.py` (trtllm-serve's /metrics),
llama.cpp `tools/server/server-task.cpp` (llama-server --metrics).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from servelab.metrics import timeline as tl


@dataclass(frozen=True)
class EngineMetrics:
    """One engine's metric names: the prefix its lines start with and its names of common quantities."""

    name: str
    prefix: str
    """What every one of the engine's exposition lines starts with (histogram buckets excepted, they are dropped)."""
    common: Mapping[str, str | tuple[str, ...]]
    """The engine's own sample name -> the timeline's common name(s) of the same quantity, in the same unit."""
    fractions: frozenset[str] = frozenset()
    """Sample names whose values are fractions: averaged over label sets (engines, DP ranks); the rest are summed."""


def _histogram(own: str, common_sum: str, common_count: str) -> dict[str, str]:
    return {own + "_sum": common_sum, own + "_count": common_count}


VLLM = EngineMetrics(
    name="vllm",
    prefix="vllm:",
    common={  # names older vLLM releases used for the same quantities
        "vllm:gpu_cache_usage_perc": tl.KV_USAGE,
        "vllm:gpu_prefix_cache_queries_total": tl.PREFIX_QUERIES,
        "vllm:gpu_prefix_cache_hits_total": tl.PREFIX_HITS,
    },
    fractions=frozenset({tl.KV_USAGE, "vllm:gpu_cache_usage_perc"}),
)

SGLANG = EngineMetrics(
    name="sglang",
    prefix="sglang:",
    common={
        "sglang:num_running_reqs": tl.RUNNING,
        "sglang:num_queue_reqs": tl.WAITING,
        # max over the KV pools (full attention, SWA, mamba) of used / total: the pool that fills first
        "sglang:token_usage": tl.KV_USAGE,
        # retraction is SGLang's preemption: the request goes back to the queue and is recomputed
        "sglang:num_retracted_requests_total": tl.PREEMPTIONS,
        # prefix-cache hits in tokens over prompt tokens, as vLLM counts its queries and hits
        "sglang:prompt_tokens_total": (tl.PROMPT_TOKENS, tl.PREFIX_QUERIES),
        "sglang:cached_tokens_total": tl.PREFIX_HITS,
        "sglang:generation_tokens_total": tl.GENERATION_TOKENS,
        "sglang:estimated_flops_per_gpu_total": tl.FLOPS,
        "sglang:estimated_read_bytes_per_gpu_total": tl.READ_BYTES,
        **_histogram("sglang:queue_time_seconds", tl.QUEUE_TIME_SUM, tl.QUEUE_TIME_COUNT),
        **_histogram("sglang:time_to_first_token_seconds", tl.TTFT_SUM, tl.TTFT_COUNT),
        **_histogram("sglang:e2e_request_latency_seconds", tl.E2E_SUM, tl.E2E_COUNT),
    },
    fractions=frozenset({"sglang:token_usage", "sglang:cache_hit_rate", "sglang:new_token_ratio", tl.KV_USAGE}),
)

TRTLLM = EngineMetrics(
    name="trtllm",
    prefix="trtllm_",
    common={
        "trtllm_num_requests_running": tl.RUNNING,
        "trtllm_num_requests_waiting": tl.WAITING,
        "trtllm_kv_cache_utilization": tl.KV_USAGE,
        "trtllm_prompt_tokens_total": (tl.PROMPT_TOKENS, tl.PREFIX_QUERIES),
        "trtllm_prompt_cache_hit_tokens_total": tl.PREFIX_HITS,
        "trtllm_generation_tokens_total": tl.GENERATION_TOKENS,
        **_histogram("trtllm_request_queue_time_seconds", tl.QUEUE_TIME_SUM, tl.QUEUE_TIME_COUNT),
        **_histogram("trtllm_time_to_first_token_seconds", tl.TTFT_SUM, tl.TTFT_COUNT),
        **_histogram("trtllm_request_prefill_time_seconds", tl.PREFILL_TIME_SUM, tl.PREFILL_TIME_COUNT),
        **_histogram("trtllm_request_decode_time_seconds", tl.DECODE_TIME_SUM, tl.DECODE_TIME_COUNT),
        **_histogram("trtllm_e2e_request_latency_seconds", tl.E2E_SUM, tl.E2E_COUNT),
    },
    fractions=frozenset({"trtllm_kv_cache_utilization", "trtllm_kv_cache_hit_rate", tl.KV_USAGE}),
)

LLAMACPP = EngineMetrics(
    name="llamacpp",
    prefix="llamacpp:",
    common={
        "llamacpp:requests_processing": tl.RUNNING,
        "llamacpp:requests_deferred": tl.WAITING,
        "llamacpp:prompt_tokens_total": tl.PROMPT_TOKENS,
        "llamacpp:tokens_predicted_total": tl.GENERATION_TOKENS,
    },
)

ENGINES: dict[str, EngineMetrics] = {e.name: e for e in (VLLM, SGLANG, TRTLLM, LLAMACPP)}
AUTO = "auto"
ENGINE_CHOICES = (*ENGINES, AUTO)
"""What `--engine` takes: one engine's names, or `auto` (whichever engine the server's /metrics show)."""


def common_names(engine: EngineMetrics, name: str) -> tuple[str, ...]:
    """The timeline's common names an engine sample also stands for (none for a name with no common counterpart)."""
    common = engine.common.get(name, ())
    return (common,) if isinstance(common, str) else common


def detect(text: str) -> EngineMetrics | None:
    """The engine whose names an exposition text carries (the one with most lines); None when none is known."""
    counts = dict.fromkeys(ENGINES, 0)
    for line in text.splitlines():
        for engine in ENGINES.values():
            if line.startswith(engine.prefix):
                counts[engine.name] += 1
                break
    best = max(counts, key=lambda name: counts[name])
    return ENGINES[best] if counts[best] else None
