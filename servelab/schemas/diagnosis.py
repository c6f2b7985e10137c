"""diagnosis.json (`servelab diagnose`, also `--json`) as a typed model; its JSON Schema is
docs/schemas/diagnosis.json."""

from __future__ import annotations

from typing import Annotated

from pydantic.json_schema import SkipJsonSchema
from pydantic import ConfigDict, Field, WithJsonSchema, computed_field, field_serializer

from servelab import SCHEMA_VERSION
from servelab.schemas.compare import EngineComparison
from servelab.schemas.results import DeploymentInfo, Json, SLOTerms
from servelab.schemas.base import ClosedModel, OpenModel
from servelab.schemas.vocabulary import FlopSource


OPEN_OBJECT = {"additionalProperties": True, "type": "object"}
"""How the published schema describes utilization and evidence: open objects, free to gain figures without a
schema_version bump. servelab writes them as the Utilization and Evidence models below; a file whose part is not
one (a trimmed or hand-made diagnosis) still reads, that part as a plain object."""


class WorkloadShape(OpenModel):
    requests: int
    mean_input_tokens: float
    mean_output_tokens: float
    offered_rate: float | None
    max_concurrency: int | None


class Ceilings(OpenModel):
    """The physical limits of this workload on this deployment."""

    prefill_compute_rps: float | None
    """Prompts per second if every step were a full prefill budget (compute bound)."""
    decode_bandwidth_tps: float | None
    """Output tokens per second at the achieved batch, steps that only decode."""
    kv_capacity_seqs: int | None
    """Sequences of (input + output) tokens whose KV fits at once (per replica)."""
    max_num_seqs: int | None
    slo_max_rps: float | None
    """Highest simulated request rate at which the SLO holds."""
    saturation_rps: float | None
    """Simulated throughput under unlimited load: all limits at once."""
    saturation_rps_interval: tuple[float, float] | None = Field(
        None, description="The simulated saturation's 80% interval (held-out residuals of saturated published runs)."
    )
    decode_bandwidth_tps_at_max_batch: float | None
    # What the ceilings were computed from, known while diagnosing and not written to diagnosis.json (a diagnosis
    # read back from its file has the defaults).
    prefill_flops_per_request: SkipJsonSchema[float] = Field(0.0, exclude=True)
    decode_batch: SkipJsonSchema[float] = Field(0.0, exclude=True)
    """The batch the run achieved per replica (mean running sequences)."""
    max_decode_batch: SkipJsonSchema[int] = Field(0, exclude=True)
    """The largest batch the deployment can hold: min(max_num_seqs, KV capacity)."""
    replicas: SkipJsonSchema[int] = Field(1, exclude=True)


class Recommendation(OpenModel):
    change: str
    engine_args: str | None = Field(
        description="The full launch flags after the change; null for workload/hardware changes."
    )
    metric: str
    before: float
    after: float
    effects: dict[str, tuple[float, float]] = Field(description="Other metrics, before and after.")
    confirm: str = Field(description="The `servelab bench` line that would confirm the prediction.")
    gain: float
    tried: str | None = Field(None, description="What the user saw this very change do (--tried), when they tried it.")


class Finding(OpenModel):
    kind: str = Field(description="prefill_compute_bound, max_num_seqs_bound, kv_capacity_bound, ...")
    title: str
    score: float
    evidence: list[str]
    recommendations: list[Recommendation]

    @field_serializer("score")
    def _rounded(self, score: float) -> float:
        """Ranked on the exact score; written to three places (more would be noise of the thresholds)."""
        return round(score, 3)


class AdviceRow(OpenModel):
    """One common tuning tip (`--check-advice`), judged on this workload."""

    id: int
    advice: str
    flag_status: str
    d_throughput: float | None
    d_p99_ttft: float | None
    d_p99_tpot: float | None
    verdict: str
    why: str


class Observed(ClosedModel):
    qps: float | None
    ttft_ms: float | None
    gpu_util: float | None
    e2e_ms: float | None = None
    tpot_ms: float | None = None


class Utilization(OpenModel):
    """What "GPU utilisation" should mean: FLOP/s and bytes/s against the chip's peaks (diagnose/utilization.py)."""

    model_config = ConfigDict(frozen=True)

    flops_per_gpu: float
    peak_flops: float
    mfu: float
    prefill_flop_share: float
    """Share of the FLOPs spent on prompts (the rest is decode)."""
    bytes_per_gpu: float
    peak_bandwidth: float
    mbu: float
    compute_headroom: float
    """mfu / the efficiency a well-fed GEMM reaches: ~1 means compute-saturated."""
    bandwidth_headroom: float
    engine_busy: float | None
    """Share of wall time a step runs: roughly what nvidia-smi reports."""
    source: FlopSource


class TtftSplit(OpenModel):
    """A run's mean client TTFT split into parts that sum to it; seconds (servelab/metrics/server_timings.py)."""

    model_config = ConfigDict(frozen=True)

    client_ttft_s: float
    """Mean TTFT the client measured over its requests that got a first token."""
    api_server_s: float
    """Outside the engine core: network, HTTP, tokenization, API-server CPU queueing, IPC (client TTFT - queue -
    prefill)."""
    queue_s: float
    """Queued in the engine before first scheduled (waiting for a sequence slot, KV blocks or token budget)."""
    prefill_s: float
    """From first scheduled to first token: the prompt's forward passes."""
    server_ttft_s: float
    """The server's own mean TTFT (from arrival in its engine client)."""
    requests: int
    """Client requests the client TTFT is the mean of."""
    server_requests: int
    """Requests in the server's TTFT histogram over the run."""
    queue_measured: bool
    """True: the queue is vLLM's queue-time histogram; False: server TTFT - prefill (the simulator's engines)."""
    server_e2e_s: float | None = None
    decode_s: float | None = None
    notes: tuple[str, ...] = ()
    """Why the parts may not describe the same requests, or were clipped to stay non-negative."""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def outside_server_s(self) -> float:
        """Client TTFT - server TTFT: network, HTTP, tokenization and the API server's queue before arrival."""
        return self.client_ttft_s - self.server_ttft_s

    @property
    def parts(self) -> dict[str, float]:
        return {"api_server": self.api_server_s, "queue": self.queue_s, "prefill": self.prefill_s}


class OutsideEngine(OpenModel):
    """The split's "API server & network" mean, seconds, as network and API server (diagnose/outside_engine.py)."""

    model_config = ConfigDict(frozen=True)

    outside_s: float
    """The split's API server & network part (client TTFT - queue - prefill)."""
    connect_s: float
    """Handshakes: mean over all requests (a reused connection pays none)."""
    send_s: float
    round_trip_s: float | None
    """One network round trip, the median handshake of new connections; None when every connection was reused."""
    api_server_s: float
    """What is left: the API server's own time (with the round trip in it when that is unknown)."""
    new_connection_share: float
    first_byte_s: float | None
    """Mean wait from sent to the response's first byte (vLLM sends its headers before the first token)."""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def network_s(self) -> float:
        return self.connect_s + self.send_s + (self.round_trip_s or 0.0)


class Evidence(OpenModel):
    """The numbers a diagnosis rests on, read off one run whatever its source (diagnose/evidence.py); None where the
    run did not carry the data (a server without /metrics)."""

    model_config = ConfigDict(frozen=True)

    completed: int
    failed: int
    duration_s: float
    request_rate: float
    """Achieved completions per second."""
    offered_rate: float | None
    """Requests per second the workload asked for (None for closed loop)."""
    max_concurrency: int | None
    mean_input_tokens: float
    mean_output_tokens: float
    mean_chunks: float | None = None
    """Streamed chunks with output per completed request (None when the records hold no chunk times): a server
    that falls behind merges tokens into fewer chunks, and the API server pays per chunk as well as per token."""
    mean_in_flight: float
    """Client-side requests outstanding, averaged over the run."""
    output_throughput: float
    mean_ttft_ms: float
    median_ttft_ms: float
    p99_ttft_ms: float
    median_tpot_ms: float | None
    """None (like ITL) when no request had a second token."""
    p99_tpot_ms: float | None
    p99_itl_ms: float | None
    median_e2el_ms: float
    mean_running: float | None = None
    max_running: float | None = None
    mean_waiting: float | None = None
    max_waiting: float | None = None
    frac_waiting: float | None = None
    """Share of samples with a non-empty waiting queue."""
    max_kv_usage: float | None = None
    mean_kv_usage: float | None = None
    preemptions: int | float | None = None
    """A counter's increase over the run, as the timeline holds it (an int from the simulator, a float scraped)."""
    prefix_hit_rate: float | None = None
    mean_server_ttft_ms: float | None = None
    mean_iteration_tokens: float | None = None
    achieved_flops: float | None = None
    """FLOP/s the server estimated for itself (vllm:estimated_flops_per_gpu_total)."""
    achieved_read_bandwidth: float | None = None
    steps_per_s: float | None = None
    """Engine iterations per second (vllm:iteration_tokens_total count)."""
    engine_busy: float | None = None
    """Share of time an engine step was running (known to the simulator only)."""
    ttft_split: TtftSplit | None = None
    """The client's mean TTFT split into API server & network, engine queue and prefill (the server's histograms)."""
    outside_engine: OutsideEngine | None = None
    """The split's API server & network part divided by the client's HTTP phases (None for the simulator)."""
    client_may_be_bottleneck: bool = False
    """The client's own verdict: its distortion of the figures was material (targets/client_stats.py)."""
    client_reason: str | None = None
    client_added_delay_ms: float | None = None
    """Estimated delay the client added to each timestamp it took (mean, weighted by requests in flight)."""
    source: str | None = None


class Alternative(OpenModel):
    """One option priced at the user's load (diagnose/alternatives.py): latency users feel, and dollars."""

    change: str
    engine_args: str | None
    gpus: int
    gpu: str
    usd_per_hour: float | None = Field(
        description="Per GPU: --gpu-cost-per-hour, or the documented default; null if none."
    )
    price_source: str | None
    median_ttft_ms: float | None
    p99_ttft_ms: float | None
    median_e2el_ms: float | None
    p99_e2el_ms: float | None
    median_tpot_ms: float | None
    output_throughput: float
    usd_per_mtok: float | None = Field(description="Dollars per million output tokens at this load.")
    verdict: str = Field(description="helps, no effect or hurts, judged on E2E p50; '—' for the deployment as it is.")
    why: str
    tried: str | None = Field(None, description="What the user saw this very change do (--tried), when they tried it.")


class EngineSwitch(OpenModel):
    """The diagnosed deployment's workload and load on each engine, and what switching would buy."""

    current: str = Field(description="The diagnosed engine, run with its own flags; the others run their defaults.")
    comparison: EngineComparison = Field(description="`servelab compare`'s result for this deployment at this load.")
    verdicts: list[str] = Field(
        description="Per other engine: throughput, latency, goodput and KV memory against the "
        "current engine's, before → after."
    )


class Lever(OpenModel):
    """One lever for the question asked (diagnose/levers.py), simulated at this load."""

    change: str
    metric: str = Field(
        description="E2E p50 ms (or streaming's perceived wait) for latency; ceiling req/s for throughput."
    )
    before: float
    after: float
    note: str
    tried: str | None = Field(None, description="What the user saw this very change do (--tried), when they tried it.")


class AssumptionPoint(OpenModel):
    value: str
    ceiling_rps: float
    median_e2el_ms: float


class Assumption(OpenModel):
    """Something the diagnosis assumed because it was not given, and how the answer moves across its range."""

    what: str
    assumed: str
    points: list[AssumptionPoint]


class Diagnosis(OpenModel):
    """What limits the deployment, the evidence, the ceilings and what to change."""

    schema_version: int = SCHEMA_VERSION
    source: str = Field(description="What the evidence came from: a results directory's source, or 'described'.")
    deployment: DeploymentInfo
    workload: WorkloadShape
    bottleneck: str | None = Field(description="The first finding's kind; null when nothing limits.")
    ceilings: Ceilings
    standing: dict[str, float | None] = Field(description="Where the deployment stands, as a share of each ceiling.")
    utilization: Annotated[Utilization | Json, WithJsonSchema(OPEN_OBJECT | {"title": "Utilization"})]
    evidence: Annotated[Evidence | Json, WithJsonSchema(OPEN_OBJECT | {"title": "Evidence"})]
    slo: SLOTerms | None
    slo_attainment: float | None
    observed: Observed
    caveats: list[Finding] = Field(
        [],
        description="Doubts on the measurement itself (a starved client), with their size; "
        "shown above the findings, never ranked among them.",
    )
    findings: list[Finding]
    alternatives: list[Alternative] = Field(
        [],
        description="The common options priced at this load (--gpu-cost-per-hour, "
        "--observed-e2e-ms, --observed-tpot-ms or --price-options).",
    )
    engine_comparison: EngineSwitch | None = Field(
        None,
        description="`--compare-engines`: this deployment's workload and "
        "load on each engine, and what switching would buy.",
    )
    notes: list[str]
    advice: list[AdviceRow] | None
    partial_run: str | None = Field(None, description="Present when the results directory is a partial run.")
    goal: str | None = Field(None, description="The question the diagnosis answers first: latency or throughput.")
    levers: list[Lever] = Field([], description="The question's levers, best first, each before -> after.")
    assumptions: list[Assumption] = Field(
        [],
        description="What was assumed because it was not given (output length, "
        "arrivals), with the ceiling and E2E p50 across its range.",
    )
    levers_at: str = Field(
        "",
        description="Where the levers were priced: the described load, or the likeliest "
        "explanation of what the user sees (e.g. ~222 requests in flight).",
    )
    verdict: str | None = Field(
        None,
        description="The first line when the offered load exceeds the simulated ceiling: "
        "the queue is unstable, and the capacity, not its percentiles, is "
        "what to read.",
    )
