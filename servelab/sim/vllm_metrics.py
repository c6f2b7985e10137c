"""vLLM's Prometheus metric names: what a real server exports and what the simulated engine reproduces.

They live at the bottom of the package so that the simulator can emit them
without importing the metrics layer above it; `servelab.metrics.timeline`
re-exports them for everything that reads a timeline.
"""

from __future__ import annotations

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
PREEMPTIONS = "vllm:num_preemptions_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
ITERATION_TOKENS_SUM = "vllm:iteration_tokens_total_sum"
ITERATION_TOKENS_COUNT = "vllm:iteration_tokens_total_count"
TTFT_SUM = "vllm:time_to_first_token_seconds_sum"
TTFT_COUNT = "vllm:time_to_first_token_seconds_count"
PREFILL_TIME_SUM = "vllm:request_prefill_time_seconds_sum"
PREFILL_TIME_COUNT = "vllm:request_prefill_time_seconds_count"
"""The engine's own time from first scheduling a request to its first token (engine time, no client or frontend)."""
QUEUE_TIME_SUM = "vllm:request_queue_time_seconds_sum"
QUEUE_TIME_COUNT = "vllm:request_queue_time_seconds_count"
"""Engine-core queueing to first scheduling, observed when a request finishes (vLLM; the simulator does not export
it)."""
DECODE_TIME_SUM = "vllm:request_decode_time_seconds_sum"
DECODE_TIME_COUNT = "vllm:request_decode_time_seconds_count"
E2E_SUM = "vllm:e2e_request_latency_seconds_sum"
E2E_COUNT = "vllm:e2e_request_latency_seconds_count"
FLOPS = "vllm:estimated_flops_per_gpu_total"
READ_BYTES = "vllm:estimated_read_bytes_per_gpu_total"

GAUGES = (RUNNING, WAITING, KV_USAGE)
COUNTERS = (
    PREEMPTIONS,
    PREFIX_QUERIES,
    PREFIX_HITS,
    PROMPT_TOKENS,
    GENERATION_TOKENS,
    ITERATION_TOKENS_SUM,
    ITERATION_TOKENS_COUNT,
    TTFT_SUM,
    TTFT_COUNT,
    PREFILL_TIME_SUM,
    PREFILL_TIME_COUNT,
    FLOPS,
    READ_BYTES,
)
TRACKED = GAUGES + COUNTERS
