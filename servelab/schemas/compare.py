"""compare.json: one deployment and one workload on each modelled engine (`servelab compare --out`), and the
engines section of diagnosis.json."""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1
KIND: Final = "servelab.compare"
"""The `kind` of the JSON `servelab compare --out` writes: how `servelab report` tells it from the other files it
reads."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EngineMemory(_Model):
    kv_cache_gib: float
    kv_token_capacity: int
    block_size: int = Field(description="Tokens per KV block (SGLang's page size, 1 by default).")
    max_running: int = Field(description="max_num_seqs / max_running_requests / max_batch_size.")
    token_budget: int = Field(
        description="Tokens one step may carry: max_num_batched_tokens / chunked_prefill_size / max_num_tokens."
    )
    sequences_fit: int = Field(
        description="Requests of this workload's mean prompt + output length whose KV fits at once."
    )


class EnginePoint(_Model):
    label: str
    request_throughput: float
    output_throughput: float
    mean_ttft_ms: float | None
    p99_ttft_ms: float | None
    mean_tpot_ms: float | None
    p99_tpot_ms: float | None
    mean_e2el_ms: float | None = Field(
        None, description="Whole-answer latency; null in comparisons written before it was."
    )
    p99_e2el_ms: float | None = None
    request_goodput: float | None = Field(
        description="Requests per second meeting every SLO bound; None without --goodput."
    )
    preemptions: int = Field(description="vLLM/TensorRT-LLM preemptions (pauses), SGLang retractions.")
    completed: int
    intervals: dict[str, tuple[float, float]] | None = Field(
        None, description="80% intervals of the statistics above (servelab.metrics.intervals); null: none published."
    )


class EngineResult(_Model):
    engine: str
    label: str
    launch_flags: str
    warnings: list[str]
    settings: dict[str, Any] = Field(description="The engine's resolved knobs in its own terms (vLLM: EngineConfig).")
    memory: EngineMemory
    points: list[EnginePoint]


class EngineComparison(_Model):
    schema_version: int = SCHEMA_VERSION
    kind: Literal["servelab.compare"] = Field(KIND, description="Always 'servelab.compare'.")
    gpu: str
    model: str
    mean_prompt_tokens: float
    mean_output_tokens: float
    slo: dict[str, float] | None
    engines: list[EngineResult]
    ranking: list[str] = Field(description="Engines by peak output throughput over the points, best first.")
    explanations: list[str] = Field(
        description="The scheduler and memory differences behind the gap, with their numbers."
    )
