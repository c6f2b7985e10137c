"""diagnosis.json (`servelab diagnose`, also `--json`) as a typed model; its JSON Schema is docs/schemas/diagnosis.json."""

from __future__ import annotations

from pydantic import Field

from servelab import SCHEMA_VERSION
from servelab.schemas.compare import EngineComparison
from servelab.schemas.results import DeploymentInfo, Json, SLOTerms
from servelab.schemas.base import ClosedModel, OpenModel


class WorkloadShape(OpenModel):
    requests: int
    mean_input_tokens: float
    mean_output_tokens: float
    offered_rate: float | None
    max_concurrency: int | None


class Ceilings(OpenModel):
    """The physical limits of this workload on this deployment."""

    prefill_compute_rps: float | None
    decode_bandwidth_tps: float | None
    kv_capacity_seqs: int | None
    max_num_seqs: int | None
    slo_max_rps: float | None
    saturation_rps: float | None
    saturation_rps_interval: tuple[float, float] | None = Field(
        None, description="The simulated saturation's 80% interval (held-out residuals of saturated published runs).")
    decode_bandwidth_tps_at_max_batch: float | None


class Recommendation(OpenModel):
    change: str
    engine_args: str | None = Field(description="The full launch flags after the change; null for workload/hardware changes.")
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


class Alternative(OpenModel):
    """One option priced at the user's load (diagnose/alternatives.py): latency users feel, and dollars."""

    change: str
    engine_args: str | None
    gpus: int
    gpu: str
    usd_per_hour: float | None = Field(description="Per GPU: --gpu-cost-per-hour, or the documented default; null if none.")
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
    verdicts: list[str] = Field(description="Per other engine: throughput, latency, goodput and KV memory against the "
                                            "current engine's, before → after.")


class Lever(OpenModel):
    """One lever for the question asked (diagnose/levers.py), simulated at this load."""

    change: str
    metric: str = Field(description="E2E p50 ms (or streaming's perceived wait) for latency; ceiling req/s for throughput.")
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
    utilization: Json
    evidence: Json
    slo: SLOTerms | None
    slo_attainment: float | None
    observed: Observed
    caveats: list[Finding] = Field([], description="Doubts on the measurement itself (a starved client), with their size; "
                                               "shown above the findings, never ranked among them.")
    findings: list[Finding]
    alternatives: list[Alternative] = Field([], description="The common options priced at this load (--gpu-cost-per-hour, "
                                                        "--observed-e2e-ms, --observed-tpot-ms or --price-options).")
    engine_comparison: EngineSwitch | None = Field(None, description="`--compare-engines`: this deployment's workload and "
                                                                     "load on each engine, and what switching would buy.")
    notes: list[str]
    advice: list[AdviceRow] | None
    partial_run: str | None = Field(None, description="Present when the results directory is a partial run.")
    goal: str | None = Field(None, description="The question the diagnosis answers first: latency or throughput.")
    levers: list[Lever] = Field([], description="The question's levers, best first, each before -> after.")
    assumptions: list[Assumption] = Field([], description="What was assumed because it was not given (output length, "
                                                          "arrivals), with the ceiling and E2E p50 across its range.")
    levers_at: str = Field("", description="Where the levers were priced: the described load, or the likeliest "
                                           "explanation of what the user sees (e.g. ~222 requests in flight).")
    verdict: str | None = Field(None, description="The first line when the offered load exceeds the simulated ceiling: "
                                                  "the queue is unstable, and the capacity, not its percentiles, is "
                                                  "what to read.")
