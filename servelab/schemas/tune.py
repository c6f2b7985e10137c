"""tune.json and each stage-1 trial.json as typed models; their JSON Schemas are docs/schemas/tune.json and
trial.json."""

from __future__ import annotations

from typing import Any

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    field_serializer,
    model_serializer,
)

from servelab import SCHEMA_VERSION
from servelab.schemas.vocabulary import VLLM, TrialStatus
from servelab.schemas.fleet import ReplicaLoad
from servelab.schemas.results import DeploymentInfo, Json, PlanInfo, SLOTerms, Versions
from servelab.schemas.base import AsGiven, ClosedModel, OpenModel


BASELINE = "baseline"
"""The label of the current configuration among stage 2's rows and in a recommendation (others are `trial-N`)."""


class ObjectiveInfo(OpenModel):
    kind: str = Field(description="goodput, throughput, ttft, tpot, cost, ...")
    direction: str = Field(description="maximize or minimize")
    unit: str
    slo: SLOTerms | None
    percentile: float
    target_rate: float | None
    gpu_cost_per_hour: dict[str, float]

    @field_serializer("slo")
    def _set_terms_only(self, slo: SLOTerms | None) -> dict[str, float] | None:
        """The SLO's bounds as `--goodput` gave them: an absent term is left out, not written as null."""
        return None if slo is None else slo.model_dump(exclude_none=True)


class KeyMetrics(OpenModel):
    """The key statistics of a run a trial's score rests on (servelab.tune.objectives.key_metrics), each null when
    the run had nothing to measure it by. The report and tune's table read them as attributes or through
    `statistic`, so a misspelt name fails instead of printing a blank cell."""

    completed: int | None = None
    failed: int | None = None
    request_throughput: float | None = None
    request_goodput: float | None = None
    output_throughput: float | None = None
    median_ttft_ms: float | None = None
    p99_ttft_ms: float | None = Field(None, description="Null also when the objective's percentiles have no 99.")
    median_tpot_ms: float | None = None
    p99_tpot_ms: float | None = None
    p99_e2el_ms: float | None = None
    intervals: dict[str, tuple[float, float]] | None = Field(
        None, description="A prediction's 80% intervals of the statistics above (summary.json's); null when measured."
    )

    def statistic(self, key: str) -> float | None:
        """A statistic named by a string (the Pareto plot's axes come from tune.json); AttributeError for a name
        that is not one of the fields, even one an old file happens to carry."""
        if key not in KEY_STATISTICS:
            raise AttributeError(f"a trial's metrics have no statistic {key!r}")
        value = getattr(self, key)
        return None if value is None else float(value)

    @model_serializer(mode="wrap")
    def _empty_when_not_run(self, handler: SerializerFunctionWrapHandler) -> Json:
        """A configuration that could not run has no statistics at all: `{}`, not a row of nulls."""
        return handler(self) if self.model_fields_set else {}


KEY_STATISTICS = tuple(k for k in KeyMetrics.model_fields if k != "intervals")
"""The statistics a trial keeps (its intervals aside)."""


class Trial(OpenModel):
    """One evaluated candidate (stage 1, on the simulator): tune.json's `baseline` and `trials` rows, and trial.json."""

    number: int | None = Field(None, description="The trial's number; absent for the baseline.")
    params: dict[str, Any] = Field(description="The searched knobs' values.")
    engine_args: str
    status: str = Field(description="ok, or invalid when the configuration cannot run.")
    score: float | None
    violation: float | None
    feasible: bool
    rate: float | None = Field(description="For goodput: the highest rate whose SLO held.")
    gpu: str | None
    gpus: int | None
    cost_per_million_tokens: float | None
    metrics: KeyMetrics = Field(description="Key statistics of the run the score rests on.")
    probes: list[Json]
    error: str | None
    sim_wall_s: float
    engine_config: Json

    @property
    def ran(self) -> bool:
        """Whether the simulator could run the configuration (it has a score)."""
        return self.status == TrialStatus.OK and self.score is not None


class FleetServer(OpenModel):
    """One replica of a fleet measured in stage 2: its own server, started from --server-cmd with the
    configuration's flags less the replica count."""

    base_url: str = Field(description="Where the bench client reached it.")
    pid: int | None = Field(None, description="Its process group's leader, on `host`.")
    startup_s: float | None = Field(None, description="Launch to ready (/health and /v1/models answered).")
    host: str | None = Field(None, description="The node it ran on.")
    exit_code: int | None = Field(None, description="Set when the server had exited before it was stopped.")


class Stage2Row(OpenModel):
    """One configuration measured on a real server (stage 2), beside its prediction; a configuration whose server
    would not start keeps the defaults of what it never measured, and the reason in `error`."""

    label: str
    params: dict[str, Any]
    engine_args: str
    launch_line: str
    predicted: KeyMetrics
    predicted_score: float | None
    predicted_violation: float | None
    measured: KeyMetrics | None = Field(None, description="Null when the configuration could not be measured.")
    measured_score: float | None = None
    measured_violation: float | None = None
    server_pid: int | None = None
    startup_s: float | None = None
    bench_s: float | None = None
    directory: str | None = None
    error: str | None = None
    warnings: list[str] = Field(default_factory=list)
    started_at: float | None = Field(None, description="Wall-clock span of the trial, server start to stop.")
    ended_at: float | None = None
    host: str | None = Field(None, description="The node it ran on (a Ray cluster spreads trials over several).")
    route: str | None = Field(
        None,
        description="A fleet's: the client-side route (bench --route) its replicas were measured behind; null for "
        "one server.",
    )
    fleet: list[FleetServer] = Field(
        default_factory=list, description="A fleet's replicas, one server each; empty for one server."
    )
    replicas: list[ReplicaLoad] = Field(
        default_factory=list,
        description="A fleet's: each replica's load over the measurement, from its own /metrics (run.json's "
        "server_info.replicas).",
    )

    @model_serializer(mode="wrap")
    def _fleet_fields_for_a_fleet(self, handler: SerializerFunctionWrapHandler) -> Json:
        """One server's row is written as it was before stage 2 measured fleets: `route`, `fleet` and `replicas`
        only in a fleet's row (its route is set)."""
        row: Json = handler(self)
        if self.route is None:
            for key in FLEET_FIELDS:
                row.pop(key, None)
        return row

    @property
    def ok(self) -> bool:
        """Measured, and the measurement describes the configuration (its server neither failed nor died)."""
        return self.error is None and self.measured is not None


FLEET_FIELDS = ("route", "fleet", "replicas")
"""A stage-2 row's fields that only a fleet has."""


class Stage2File(Stage2Row):
    """stage2/<label>/stage2.json: one configuration's stage-2 result, which `tune --resume` reads back."""

    schema_version: int = Field(1, description="Absent (schema 1) in files written before it was recorded.")


class Stage2(OpenModel):
    """tune.json's stage 2: how each server was started, which configurations were measured, and their results."""

    server_cmd: str = Field(description="--server-cmd: the command template each server was started from.")
    env: dict[str, str] = Field(description="--server-env: set on top of tune's environment for each server.")
    top_k: int = Field(description="How many of the simulator's best were measured besides the baseline.")
    configs: list[str] = Field(description="The labels of the configurations measured, baseline first.")
    results: list[Stage2Row]


class Pareto(ClosedModel):
    x: str
    y: str
    trials: list[int]


class Recommendation(OpenModel):
    source: str = Field(description="stage1 (simulated) or stage2 (measured).")
    label: str
    params: dict[str, Any]
    engine_args: str
    launch_line: str | None
    score: float | None
    slo_met: bool
    baseline_score: float | None
    gain_over_baseline: float | None

    def placement(self) -> str:
        """ " on GPU" and " behind the X router" where the search chose them (the `gpu` and `router` knobs are not
        engine flags, so engine_args cannot carry them), else nothing: for the line that names the configuration."""
        gpu, router = self.params.get("gpu"), self.params.get("router")
        return (f" on {gpu}" if gpu else "") + (f" behind the {router} router" if router else "")


class TuneDeployment(AsGiven, DeploymentInfo):
    engine: str = Field(
        VLLM,
        description="Whose configurations the study searched (vllm, sglang, trtllm); absent "
        "in a tune.json written before tune took --engine, which searched vLLM's.",
    )
    sim_args: str
    calibration: str | None
    simulated: DeploymentInfo


class SearchInfo(OpenModel):
    """How stage 1 searched: the sampler, the space's size and how many configurations it simulated."""

    sampler: str = Field(description="grid (the whole space) or tpe.")
    n_trials: int | None = None
    budget: int | None = None
    space_size: int
    seed: int | None = None
    evaluated: int


class TuneWorkloads(AsGiven):
    """The load plans: stage 1's simulated runs and stage 2's measurements."""

    stage1: PlanInfo | None = None
    stage2: PlanInfo | None = None


class TuneDocument(OpenModel):
    """tune.json: the study: objective, search, every trial, the ranking and Pareto front, stage 2, the choice."""

    schema_version: int = SCHEMA_VERSION
    kind: str = Field(description="Always 'tune'.")
    created_at: float
    versions: Versions
    objective: ObjectiveInfo
    deployment: TuneDeployment
    space: dict[str, list[Any]]
    search: SearchInfo
    workload: TuneWorkloads
    baseline: Trial
    trials: list[Trial]
    ranking: list[int]
    pareto: Pareto
    stage2: Stage2 | None
    recommendation: Recommendation | None

    @field_serializer("baseline", mode="wrap")
    def _unnumbered(self, baseline: Trial, handler: SerializerFunctionWrapHandler) -> Json:
        data: Json = handler(baseline)
        data.pop("number", None)
        return data
