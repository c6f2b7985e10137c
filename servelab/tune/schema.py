"""tune.json and each stage-1 trial.json as typed models; their JSON Schemas are docs/schemas/tune.json and trial.json."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from servelab import SCHEMA_VERSION
from servelab.metrics.schema import DeploymentInfo, Json, SLOTerms, Versions
from servelab.typed import ClosedModel, OpenModel


class ObjectiveInfo(OpenModel):
    kind: str = Field(description="goodput, throughput, ttft, tpot, cost, ...")
    direction: str = Field(description="maximize or minimize")
    unit: str
    slo: SLOTerms | None
    percentile: float
    target_rate: float | None
    gpu_cost_per_hour: dict[str, float]


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
    metrics: Json = Field(description="Key statistics of the run the score rests on.")
    probes: list[Json]
    error: str | None
    sim_wall_s: float
    engine_config: Json


class Stage2Row(OpenModel):
    """One configuration measured on a real server (stage 2), beside its prediction."""

    label: str
    params: dict[str, Any]
    engine_args: str
    launch_line: str
    predicted: Json
    predicted_score: float | None
    predicted_violation: float | None
    measured: Json | None
    measured_score: float | None
    measured_violation: float | None
    server_pid: int | None
    startup_s: float | None
    bench_s: float | None
    directory: str | None
    error: str | None
    warnings: list[str]


class Stage2(OpenModel):
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


class TuneDeployment(DeploymentInfo):
    sim_args: str
    calibration: str | None
    simulated: DeploymentInfo


class TuneDocument(OpenModel):
    """tune.json: the study: objective, search, every trial, the ranking and Pareto front, stage 2, the choice."""

    schema_version: int = SCHEMA_VERSION
    kind: str = Field(description="Always 'tune'.")
    created_at: float
    versions: Versions
    objective: ObjectiveInfo
    deployment: TuneDeployment
    space: dict[str, list[Any]]
    search: Json
    workload: Json
    baseline: Trial
    trials: list[Trial]
    ranking: list[int]
    pareto: Pareto
    stage2: Stage2 | None
    recommendation: Recommendation | None
