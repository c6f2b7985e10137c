"""The files of a results directory as typed models: run.json, records.jsonl rows, summary.json, timeline.jsonl rows,
sweep.json. docs/schemas/ holds the JSON Schema generated from these (`servelab schema NAME`).

They describe what the writers in this package write, key for key: the
writers build these models and write their dump, the schema test walks
real results directories, and a reader of the files can validate against
the published schema. Parts other layers fill (a server's info, the
client's stats, a deployment's engine flags) are typed as far as every
writer agrees and open beyond that.
"""

from __future__ import annotations

import platform
import re
import time
from typing import Annotated, Any, Literal

from pydantic import GetJsonSchemaHandler, Field, SerializerFunctionWrapHandler, WithJsonSchema, model_serializer

from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from servelab import SCHEMA_VERSION, __version__
from servelab.schemas.vocabulary import Limit, Regime, Tier
from servelab.schemas.base import AsGiven, ClosedModel, InGivenOrder, Number, OpenModel

Json = dict[str, Any]
"""A JSON object at a file's edge: an open part of a document (another layer's own keys) or a serializer's output."""


class Versions(InGivenOrder):
    servelab: str
    python: str

    @classmethod
    def installed(cls) -> Versions:
        """servelab's and Python's versions as installed here: which code wrote a file."""
        return cls(servelab=__version__, python=platform.python_version())


class SLOTerms(ClosedModel):
    """A goodput SLO in milliseconds, as `--goodput ttft:MS tpot:MS e2el:MS` gave it (absent terms unset)."""

    ttft: float | None = None
    tpot: float | None = None
    e2el: float | None = None


class TimelineRow(ClosedModel):
    """One line of timeline.jsonl: the server's metrics at `t` seconds, keyed by vLLM's Prometheus names (the common
    names; another engine's own names beside them, servelab/metrics/engines.py)."""

    t: float
    values: dict[str, float] = Field(description="Counters cumulative as scraped, gauges instantaneous.")


PERCENTILE_KEY = re.compile(r"p\d+(\.\d+)?_(ttft|tpot|itl|e2el)_ms")
"""The per-percentile columns a summary has beside its named fields, as `vllm bench serve` spells them."""


class HttpPhases(ClosedModel):
    """Where the HTTP requests' time went (servelab.metrics.http_phases), in ms: mean, median and p99 of connect
    (new connections only), send, wait (sent to the first byte) and receive (first byte to last)."""

    requests: int
    connection_reused_share: float
    mean_connect_ms: float | None
    median_connect_ms: float | None
    p99_connect_ms: float | None
    mean_send_ms: float | None
    median_send_ms: float | None
    p99_send_ms: float | None
    mean_wait_ms: float | None
    median_wait_ms: float | None
    p99_wait_ms: float | None
    mean_receive_ms: float | None
    median_receive_ms: float | None
    p99_receive_ms: float | None


class ReplicaShare(ClosedModel):
    """One replica's part of a run spread over several --base-url."""

    completed: int
    failed: int
    mean_ttft_ms: float | None
    mean_e2el_ms: float | None


class AddedDelay(OpenModel):
    """The delay the client estimates it added to each timestamp (its event-loop probe, weighted by requests)."""

    mean_ms: float
    median_ms: float
    p99_ms: float
    samples: int


class StartupWave(OpenModel):
    """The requests a run released at once at its start, and how long the client took to send them."""

    requests: int
    left_within_ms: float
    median_send_lag_ms: float
    ended_at_s: float


class ClientStats(OpenModel):
    """client_stats: what the load generator says of itself (bench, servelab/targets/client_stats.py), the
    simulated engine's busy time (simulate), or one entry per client (a run from several clients, `clients`).
    Each source writes its own keys, so every named one is optional; the renderers read them as attributes."""

    median_schedule_lag_ms: float | None = Field(None, description="Send time minus intended time.")
    p99_schedule_lag_ms: float | None = None
    max_schedule_lag_ms: float | None = None
    median_loop_lag_ms: float | None = Field(None, description="The client's event-loop probe: how late it woke.")
    p99_loop_lag_ms: float | None = None
    max_loop_lag_ms: float | None = None
    cpu_share: float | None = Field(None, description="Client CPU seconds per wall second, per process.")
    processes: int | None = None
    startup_wave: StartupWave | None = None
    added_delay: AddedDelay | None = None
    mean_steady_send_lag_ms: float | None = Field(None, description="Mean send lag after the startup wave.")
    typical_gap_ms: float | None = Field(None, description="The run's median inter-token gap (else median TTFT).")
    client_may_be_bottleneck: bool | None = Field(
        None, description="The client's distortion of the figures was material."
    )
    reason: str | None = None
    server_gone: str | None = Field(None, description="Why release stopped: the server refused connections.")
    engine_steps: int | None = Field(None, description="Simulate: engine steps run.")
    engine_busy_s: list[float] | None = Field(None, description="Simulate: busy seconds per engine (replica).")
    frontend_busy_s: float | None = Field(None, description="Simulate: the API server's busy seconds.")
    api_server_busy_share: float | None = Field(
        None, description="Simulate: the share of the run each API server's core was busy (its mean over the servers)."
    )
    clients: list[ClientEntry] | None = Field(None, description="A run from several clients: each client's own stats.")


class SlotBrokerCost(OpenModel):
    """What the shared concurrency cap cost one client of `bench --clients N` (servelab/cluster/slot_broker.py): each
    slot taken from the broker cost a round trip, beyond its wait for a free slot: send lag the cap added to that
    request (a kept slot costs none)."""

    acquires: int = Field(description="Slots it took from the broker.")
    kept: int = Field(description="Slots it passed from a finished request of its own to a waiting one, no round trip.")
    median_round_trip_ms: float | None
    p99_round_trip_ms: float | None
    max_round_trip_ms: float | None


class ClientEntry(ClientStats):
    """One client of a run from several (`bench --ray-address --clients N`, servelab/cluster/clients.py): its place
    and clock beside its own stats; a client that died has `died` (and `slots_reclaimed`) instead of stats."""

    client: int
    host: str
    clock_offset_ms: float = Field(description="Its wall clock minus the driver's (NTP-style, quickest of 8 readings).")
    clock_rtt_ms: float = Field(description="That reading's round trip: half of it bounds the offset's error.")
    start_skew_ms: float | None = Field(None, description="Its preparation before its clock started.")
    slot_broker: SlotBrokerCost | None = Field(
        None, description="The shared cap's cost to it (several clients, a cap)."
    )
    died: str | None = Field(None, description="Why it died, as Ray said.")
    slots_reclaimed: int | None = Field(None, description="Slots of the shared cap it held at its death, given back.")


class IntervalBasis(ClosedModel):
    """What a simulated summary's intervals were read from (servelab.metrics.intervals, docs/accuracy.md)."""

    tier: Tier = Field(description="What the prediction was grounded in: specs only, the user's runs, live probes.")
    regime: Regime = Field(description="Where on the load curve the run sits, as classify_regime decided.")
    limit: Limit | None = Field(
        None,
        description="What set the simulated run's pace, as classify_limit decided: the engine, or the API server's "
        "core (busy most of the run); absent where not decided.",
    )
    level: float = Field(description="The intervals' nominal coverage (0.8).")
    residuals_tier: Tier = Field(
        description="The tier whose held-out residuals were used (specs-only's when the tier has none)."
    )
    notes: list[str] = Field(
        description="Cells pooled with a neighbouring regime for want of runs, and similar caveats."
    )


class Summary(OpenModel):
    """summary.json: statistics derived from records.jsonl (`servelab.metrics.summary.summarize`).

    Keys follow `vllm bench serve`'s result JSON. Beside the named keys, each of ttft, tpot, itl and e2el has
    one `p{P}_{metric}_ms` key per requested percentile (`--metric-percentiles`, default 50,90,95,99). A run's
    summary (bench, simulate) also has requests_recorded, warmup, interrupted, client_stats and warnings.
    """

    schema_version: int = SCHEMA_VERSION
    duration: float
    completed: int
    failed: int
    errors_by_kind: dict[str, int]
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    request_goodput: float | None
    output_throughput: float
    total_token_throughput: float
    slo: SLOTerms | None
    mean_ttft_ms: float | None
    median_ttft_ms: float | None
    std_ttft_ms: float | None
    mean_tpot_ms: float | None
    median_tpot_ms: float | None
    std_tpot_ms: float | None
    mean_itl_ms: float | None
    median_itl_ms: float | None
    std_itl_ms: float | None
    mean_e2el_ms: float | None
    median_e2el_ms: float | None
    std_e2el_ms: float | None
    abandoned: int | None = Field(
        None, description="Requests the client gave up on (--abandon-after): neither completed nor failed."
    )
    abandoned_output_chunks: int | None = Field(
        None, description="Chunks the abandoned requests had received: work done for nobody."
    )
    http_phases: HttpPhases | None = Field(None, description="HTTP phase breakdown (bench); null for the simulator.")
    replicas: dict[str, ReplicaShare] | None = Field(
        None, description="Per --base-url, when bench spread the load over several; null otherwise."
    )
    requests_recorded: int | None = Field(None, description="Records written, warm-up included (a run's summary).")
    warmup: float | None = None
    interrupted: bool | None = None
    client_stats: ClientStats | None = Field(
        None, description="The load generator's own overhead (bench) or the engine's busy time (simulate)."
    )
    warnings: list[str] | None = None
    intervals: dict[str, tuple[float, float]] | None = Field(
        None,
        description="Simulated runs: per predicted statistic with held-out residuals, its 80% interval [low, high] "
        "under the statistic's own key. Null for measured runs.",
    )
    interval_basis: IntervalBasis | None = Field(
        None, description="Simulated runs: the tier and regime the intervals are for."
    )

    @model_serializer(mode="wrap")
    def _in_file_order(self, handler: SerializerFunctionWrapHandler) -> Json:
        """summary.json's keys in the order its writers always wrote them (`vllm bench serve`'s): the counts and
        rates, each latency's mean, median, std and percentile columns together, then what the run adds."""
        data: Json = handler(self)
        ordered = {key: data.pop(key) for key in _SUMMARY_HEAD if key in data}
        for metric in STAT_METRICS:
            named = [f"{stat}_{metric}_ms" for stat in ("mean", "median", "std")]
            columns = [key for key in data if PERCENTILE_KEY.fullmatch(key) and key.endswith(f"_{metric}_ms")]
            ordered.update({key: data.pop(key) for key in [*named, *columns] if key in data})
        ordered.update({key: data.pop(key) for key in _SUMMARY_TAIL if key in data})
        return {**ordered, **data}

    def statistic(self, key: str) -> Any:
        """A statistic by its key, for tables that list their columns by name: a named field as its attribute (a
        misspelt name is an AttributeError, not a blank cell), a percentile column (`p99_ttft_ms`) as stored,
        None when --metric-percentiles did not ask for it."""
        if key in Summary.model_fields:
            return getattr(self, key)
        if not PERCENTILE_KEY.fullmatch(key):
            raise AttributeError(f"a summary has no statistic {key!r}")
        return (self.model_extra or {}).get(key)


STAT_METRICS = ("ttft", "tpot", "itl", "e2el")
_SUMMARY_HEAD = (
    "schema_version",
    "duration",
    "completed",
    "failed",
    "errors_by_kind",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    "slo",
    "abandoned",
    "abandoned_output_chunks",
    "http_phases",
    "replicas",
)
_SUMMARY_TAIL = (
    "intervals",
    "interval_basis",
    "requests_recorded",
    "warmup",
    "interrupted",
    "client_stats",
    "warnings",
)


class DeploymentInfo(OpenModel):
    """A simulated deployment as run.json, diagnosis.json and tune.json record it."""

    gpu: str
    model: str
    engine: str = Field(
        "vllm", description="The simulated engine (vllm, sglang, trtllm); vllm in files written before it was recorded."
    )
    engine_args: str
    engine_config: Json = Field(description="Every EngineConfig field, resolved (servelab.perf.engine_config).")
    num_gpu_blocks: int
    kv_cache_gib: float
    coefficients: dict[str, float | None]
    cpu_costs_source: str
    frontend: dict[str, float | None] = Field(
        description="The API server's CPU costs (null where not modelled, e.g. the cpu device)."
    )
    warnings: list[str]


class RunDeployment(AsGiven, DeploymentInfo):
    """run.json's simulated deployment, written back key for key as Deployment.describe() gave it (diagnosis.json
    writes its DeploymentInfo in the model's order). The published schema is DeploymentInfo's: only the writing
    differs (servelab.cli.schema publishes it under DeploymentInfo's name)."""

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return handler(DeploymentInfo.__pydantic_core_schema__)


class EngineIdentity(ClosedModel):
    """The serving engine as the server reported it at pre-flight (servelab/targets/engine_identity.py)."""

    name: str | None = Field(
        description="vllm, sglang, trtllm or llamacpp; null when the server showed no known engine."
    )
    version: str | None = Field(
        description="The engine's own version string (llama.cpp: its build_info); null when not reported."
    )
    reported_by: str | None = Field(
        description="Where name and version came from: `GET /version`, `GET /server_info`, "
        "`GET /props`, `/metrics` (names only) or `--engine`."
    )


class ServerInfo(InGivenOrder):
    """A run's server, as pre-flight found it (model, endpoint, ...) and the engine it reported; a fleet's replicas as
    bench scraped them or the simulator ran them. The parts diagnose and report read by name are typed, the rest kept
    as given."""

    engine: EngineIdentity | None = None
    model: str | None = Field(None, description="The model the server said it serves.")
    replicas: list[Json] | None = Field(
        None,
        description="A fleet's replicas, one load each (servelab.schemas.fleet.ReplicaLoad, which its readers check): "
        "bench from each replica's /metrics, simulate from each simulated replica; absent for one server.",
    )
    router_time: Json | None = Field(
        None,
        description="simulate, a fleet: the simulated router's own time (servelab.schemas.fleet.RouterTime, which its "
        "readers check).",
    )


class LengthInfo(InGivenOrder):
    """A length distribution of the plan (servelab.workload.lengths): its shape, mean and spread in tokens."""

    shape: str | None = None
    mean: Number | None = None
    spread: Number | None = None


class DatasetInfo(InGivenOrder):
    """What the requests were: the dataset and, for synthetic ones, the prompt and output lengths."""

    dataset_name: str | None = None
    seed: int | None = None
    input_len: LengthInfo | None = None
    output_len: LengthInfo | None = None
    prefix_len: int | None = Field(None, description="--dataset-name prefix: tokens each prompt shares with its group.")
    system_prompt_len: int | None = Field(
        None, description="--dataset-name multiturn: tokens of the system prompt each conversation opens with."
    )
    system_prompts: int | None = Field(
        None, description="--dataset-name multiturn: the system prompts the conversations draw from (0: none)."
    )


class ArrivalInfo(InGivenOrder):
    """How the requests were sent (servelab.workload.arrival): the process in words, its rate and cap."""

    process: str | None = None
    request_rate: Number | Literal["inf"] | None = None
    burstiness: Number | None = None
    max_concurrency: int | None = None


class AmountInfo(InGivenOrder):
    num_prompts: int | None = None
    duration: Number | None = None
    warmup: Number | None = None


class PlanInfo(InGivenOrder):
    """A load plan's description (servelab.workload.plan): what was sent, how, how many."""

    workload: DatasetInfo | None = None
    arrival: ArrivalInfo | None = None
    amount: AmountInfo | None = None


class RunFlags(InGivenOrder):
    """The command's flags as run.json keeps them (servelab.runs.run_info): paths as text, values as the flag gave
    them. The ones read back by name are typed, the rest kept as given."""

    model: str | None = None
    base_url: str | None = None
    replica_metrics_urls: list[str] | None = Field(
        None, description="bench: --replica-metrics-url, the replicas behind a router (empty: none given)."
    )
    engine: str | None = Field(None, description="bench and simulate: --engine as given.")
    gpu: str | None = Field(None, description="simulate: --gpu, the catalogue entry (null with --calibration).")
    calibration: str | None = Field(None, description="simulate: --calibration, the profile's path.")
    engine_args: str | None = Field(None, description="simulate: --engine-args as given (empty: none).")
    tp: int | None = Field(None, description="simulate: --tp (null: --engine-args or the default sets it).")
    replicas: int | None = Field(
        None, description="simulate: --replicas (null: --engine-args' --data-parallel-size, else one)."
    )
    router: str | None = Field(None, description="simulate: the router the fleet ran, --router or its default.")
    router_weights: str | None = Field(None, description="simulate: --router-weights; absent when not given.")
    gpu_file: str | None = Field(None, description="simulate: --gpu-file, the path of the user's GPU catalogue.")
    vllm_version: str | None = Field(None, description="simulate: --vllm-version (null: the default release).")
    request_rate: Number | None = Field(
        None, description="bench, simulate: --request-rate, requests/s (Infinity, or null when not given: all at once)."
    )
    max_concurrency: int | None = Field(None, description="bench, simulate: --max-concurrency (null: no cap).")


class RunInfo(InGivenOrder):
    """run.json: what was run. Written at the start, completed at the end; `finished_at` absent means the client
    was killed mid-run (a partial run). The verbs add their own keys (flags, argv, deployment, ...)."""

    schema_version: int = SCHEMA_VERSION
    started_at: float = Field(description="Unix time of the run's zero, which every time in the files counts from.")
    versions: Versions
    verb: str | None = Field(None, description="bench, simulate, calibrate, validate, tune, speed-check, ...")
    workload: PlanInfo | None = Field(None, description="The plan's description: workload, arrival, amount.")
    source: str | None = Field(None, description="http (measured) or sim (simulated); absent for experiment runs.")
    argv: list[str] | None = None
    flags: RunFlags | None = None
    model: str | None = Field(None, description="The model served, where no flags name it (tune's stage-2 runs).")
    base_url: str | None = Field(None, description="The server measured, where no flags name it (tune's stage-2 runs).")
    engine_args: str | None = Field(None, description="The server's engine flags (tune's stage-2 runs).")
    kind: str | None = Field(None, description="tune-stage2 for tune's stage-2 runs.")
    label: str | None = Field(
        None, description="The run's name in a report (tune's stage-2 runs: the configuration's label)."
    )
    deployment: RunDeployment | None = None
    server_info: ServerInfo | None = None
    client_host: Json | None = Field(
        None, description="The client host's conditions during the run (load, CPU steal, GPUs)."
    )
    interrupted: bool | None = None
    finished_at: float | None = None
    error: str | None = Field(None, description="The exception that ended the run, if one did.")

    @classmethod
    def begun(cls, **keys: Any) -> RunInfo:
        """run.json as a run begins: the schema version, the run's zero (now), the versions, then the verb's own
        keys in the order given, which is the order the file keeps them in (servelab.schemas.base.InGivenOrder)."""
        stamp = {"schema_version": SCHEMA_VERSION, "started_at": time.time(), "versions": Versions.installed()}
        return cls.model_validate({**stamp, **keys})

    def with_keys(self, **keys: Any) -> RunInfo:
        """This run.json with `keys` set (checked as the model types them), new keys after the ones it has."""
        return type(self).model_validate({**self.model_dump(exclude_unset=True), **keys})

    def restarted(self) -> RunInfo:
        """The same keys with the run's zero set to now: a sweep's points share their verb's keys, each begins
        when it is written."""
        return self.with_keys(started_at=time.time())


class SweepPoint(OpenModel):
    """One point of a sweep: its directory, the curve's columns (experiment.sweep.CURVE_KEYS, null where the
    summary has none), its full summary. The swept flag (e.g. `request-rate`) is a key of its own holding the
    point's value."""

    directory: str = Field(description="The point's results directory, relative to sweep.json's.")
    completed: int | None = None
    failed: int | None = None
    request_throughput: float | None = None
    output_throughput: float | None = None
    total_token_throughput: float | None = None
    request_goodput: float | None = None
    mean_ttft_ms: float | None = None
    p99_ttft_ms: float | None = Field(None, description="Null also when --metric-percentiles has no 99.")
    mean_tpot_ms: float | None = None
    p99_tpot_ms: float | None = None
    mean_itl_ms: float | None = None
    mean_e2el_ms: float | None = None
    p99_e2el_ms: float | None = None
    summary: Summary | None = Field(None, description="The point's summary.json (readers fall back to that file).")
    profile: str | None = Field(None, description="`--sweep auto`: synchronous, throughput or constant (a rate).")
    stopped_early: bool | None = Field(
        None, description="`--sweep auto`, a rate point: release stopped once the server was over-saturated."
    )
    offered_rate_realized: float | None = Field(
        None, description="`--sweep auto`, a rate point: the rate its arrivals came at, (n - 1) / their span."
    )
    over_saturated: str | None = Field(
        None, description="`--sweep auto`, a rate point: the backlog and TTFT trends that showed over-saturation."
    )

    @model_serializer(mode="wrap")
    def _in_file_order(self, handler: SerializerFunctionWrapHandler) -> Json:
        """The point's keys in the order sweep.json always had: the swept value (and `--sweep auto`'s profile) first,
        then the directory, the curve's columns and the summary, then what the saturation guard found."""
        data: Json = handler(self)
        head = [*(self.model_extra or {}), "profile"]
        tail = ("stopped_early", "over_saturated", "offered_rate_realized")
        ordered = {key: data.pop(key) for key in head if key in data}
        rest = {key: data.pop(key) for key in tail if key in data}
        return {**ordered, **data, **rest}

    def swept(self, key: str) -> int | float | Literal["inf"]:
        """The point's value of the swept flag `key` (a key of its own in the file, e.g. `request-rate`)."""
        value: int | float | Literal["inf"] = (self.model_extra or {})[key]
        return value


SweepValue = Annotated[
    int | float | Literal["inf"], WithJsonSchema({"anyOf": [{"type": "number"}, {"const": "inf", "type": "string"}]})
]
"""A swept value as written: an integer concurrency stays an integer, a rate a float, an unbounded rate "inf"."""


class SweepSpec(ClosedModel):
    key: str
    values: list[SweepValue] = Field(description='The swept values in order; an unbounded rate is "inf".')


class AutoSweepResult(OpenModel):
    """What `--sweep auto` concluded from its points (servelab/experiment/auto_sweep.py); rates in requests/s."""

    synchronous_rate: float | None = Field(description="One request at a time.")
    throughput_rate: float | None = Field(description="Everything at once (or at --max-concurrency).")
    knee_rate: float | None = Field(description="The highest offered rate the server kept up with.")
    first_over_saturated_rate: float | None = Field(description="The lowest offered rate found over-saturated.")
    max_goodput_rate: float | None = Field(
        description="The highest offered rate at which slo_attainment of the requests met --goodput."
    )
    slo_attainment: float | None = Field(
        description="The share of requests that must meet the SLO; null: no --goodput."
    )
    note: str | None = None


class SweepIndex(OpenModel):
    """sweep.json: the points of a `--sweep`, one results directory each."""

    schema_version: int = SCHEMA_VERSION
    sweep: SweepSpec
    points: list[SweepPoint]
    interrupted: bool | None = Field(
        None, description="The sweep stopped at an interrupted point (`--sweep` writes it)."
    )
    auto: AutoSweepResult | None = Field(None, description="`--sweep auto`: the knee and the rates around it.")
