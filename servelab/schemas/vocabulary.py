"""The names and defaults the command line and the result files' schemas show: engines, routers, datasets, goals,
regimes, limits and tiers, kept apart from the code that uses them (so `--help` and `servelab schema` import none of
it)."""

from __future__ import annotations

from enum import StrEnum

DEFAULT_PERCENTILES: tuple[float, ...] = (50, 90, 95, 99)
"""The percentiles of TTFT, TPOT, ITL and E2E latency a summary reports unless `--metric-percentiles` names others."""


class Regime(StrEnum):
    """Where on the load curve a prediction sits: its accuracy differs there, so its interval does."""

    UNDER_CAPACITY = "under_capacity"
    SATURATED = "saturated"
    CONCURRENCY_1 = "concurrency_1"


class Limit(StrEnum):
    """What sets a simulated run's pace: the engine (its steps on the GPU) or vLLM's API server, whose one CPU core
    takes requests in and streams their tokens out. The model misses differently when the API server's core is the
    limit (its costs depend on the host's CPU), so its interval does."""

    ENGINE = "engine"
    API_SERVER = "api_server"


class Tier(StrEnum):
    """What the prediction was grounded in: specs only, the user's own runs (`calibrate --from`), or live probes."""

    SPECS_ONLY = "specs_only"
    CALIBRATED_FROM_RUNS = "calibrated_from_runs"
    CALIBRATED_LIVE = "calibrated_live"


# The engines the simulator models and the routers it puts before replicas: what `--engine` and `--router` take.
VLLM, SGLANG, TRTLLM = "vllm", "sglang", "trtllm"
ENGINES = (VLLM, SGLANG, TRTLLM)
LABELS = {VLLM: "vLLM", SGLANG: "SGLang", TRTLLM: "TensorRT-LLM"}


class RouterPolicy(StrEnum):
    """How a router picks among data-parallel replicas (servelab.sim.router, docs/fleets.md)."""

    ROUND_ROBIN = "round-robin"
    RANDOM = "random"
    """Each request to a replica drawn uniformly at random: a Kubernetes Service (kube-proxy) or llm-d's random
    picker. Cache-blind like round-robin, but its counts per replica drift apart by chance."""
    LEAST_LOADED = "least-loaded"
    LEAST_OUTSTANDING = "least-outstanding"
    PREFIX_HASH = "prefix-hash"
    PREFIX_AWARE = "prefix-aware"
    PREFIX_ESTIMATE = "prefix-estimate"
    """llm-d's estimated prefix-cache scheduling: the prompt's blocks it routed to each replica before (its own LRU
    per replica, no cache reads), weighed against the replicas' scraped KV usage (servelab.sim.prefix_index)."""
    SESSION = "session"


ROUND_ROBIN = RouterPolicy.ROUND_ROBIN
LEAST_LOADED = RouterPolicy.LEAST_LOADED
POLICIES = tuple(RouterPolicy)
SESSION_HEADER = "X-Session-ID"
"""Where `bench` puts a request's conversation id by default: the header session-affinity routers key on."""


# The workload's names and bounds (`--dataset-name`, `--length-distribution`, ...), kept apart from the generators.
DATASETS = ("random", "prefix", "multiturn", "sharegpt", "jsonl")
"""`--dataset-name`."""
FILE_DATASETS = ("sharegpt", "jsonl")
"""The datasets read from `--dataset-path`: their lengths come from the file."""
DISTRIBUTIONS = ("fixed", "uniform", "normal", "lognormal")
"""The shapes of a length distribution (`--length-distribution`)."""
RAMPS = ("linear", "exponential")
"""`--ramp-up-strategy`, as `vllm bench serve` names them."""
DURATION_REQUEST_CAP = 1_000_000
"""A `--duration` run without a rate (closed loop) could ask for requests forever; this bounds it (and
--num-prompts)."""
PLAN_TOKEN_LIMIT = 100_000_000
"""Prompt + output tokens one plan may hold unless --max-plan-tokens says more: prompts are materialised as token
ids and every output token's arrival is recorded, so this is ~1 GB of memory, far beyond a day's benchmark."""


# The question a diagnosis answers first (`diagnose --goal`).
class Goal(StrEnum):
    LATENCY = "latency"
    THROUGHPUT = "throughput"


# diagnosis.json's words (servelab/diagnose/). The file's fields stay strings: these are the values written there.
class FindingKind(StrEnum):
    """What a finding (or a caveat) names: a limit of the server, or a doubt on the figures it rests on."""

    UNDERLOADED = "underloaded"
    MAX_NUM_SEQS_BOUND = "max_num_seqs_bound"
    KV_CAPACITY_BOUND = "kv_capacity_bound"
    PREFILL_COMPUTE_BOUND = "prefill_compute_bound"
    DECODE_BANDWIDTH_BOUND = "decode_bandwidth_bound"
    DECODE_COMPUTE_BOUND = "decode_compute_bound"
    FRONTEND_CPU_BOUND = "frontend_cpu_bound"
    SLO_TRADEOFF = "slo_tradeoff"
    PREFIX_CACHING_OFF = "prefix_caching_off"
    LAUNCH_BOUND = "launch_bound"
    CLIENT_BOUND = "client_bound"
    """A caveat's kind: the load generator distorted the figures."""
    OBSERVATIONS_INCONSISTENT = "observations_inconsistent"
    OBSERVED_VS_SIMULATED = "observed_vs_simulated"
    TRIED = "tried_changes"
    FLEET_IMBALANCE = "fleet_imbalance"
    """Replicas behind a router: one queues while another idles (diagnose/fleet.py)."""
    ROUTING_CACHE_MISSES = "routing_cache_misses"
    """Replicas behind a router: prefix-cache hits lost to a route that scatters shared prompts."""
    OUTSIDE_REPLICAS = "outside_replicas"
    """Replicas behind a router: first tokens wait between the client and the replicas (router, network, client)."""


class Verdict(StrEnum):
    """What a change does at the diagnosed load: an option priced, a lever, or a tuning tip (`--check-advice`)."""

    HELPS = "helps"
    NO_EFFECT = "no effect"
    HURTS = "hurts"
    TRADE_OFF = "trade-off"
    OBSOLETE = "obsolete"
    OUTSIDE = "outside the model"
    AS_DEPLOYED = "—"
    """The options table's first row: the deployment as it is, the one the others are judged against."""


class DiagnosisSource(StrEnum):
    """What a diagnosis's evidence came from."""

    MEASURED = "measured"
    SIMULATED_RUN = "simulated run"
    DESCRIBED = "simulated"
    """A described deployment, reproduced by the simulator first."""


class FlopSource(StrEnum):
    """Where the utilisation's FLOP rate came from."""

    SERVER = "server"
    """vLLM's own estimate, scraped (vllm:estimated_flops_per_gpu_total)."""
    MODEL = "model"


# tune's words (`tune --objective`, `--sampler`, and what tune.json records of each trial and its recommendation).
class ObjectiveKind(StrEnum):
    """What "best" means to `tune`: the highest rate under the SLO, tokens/s under it, or dollars per token."""

    GOODPUT = "goodput"
    THROUGHPUT = "throughput"
    COST = "cost"


class Direction(StrEnum):
    """Which way an objective's number improves (optuna's words)."""

    MAXIMIZE = "maximize"
    MINIMIZE = "minimize"


class TrialStatus(StrEnum):
    """A stage-1 trial's verdict: it ran on the simulator, or the configuration cannot run at all (does not fit,
    inconsistent limits), which is a verdict rather than a crash."""

    OK = "ok"
    INVALID = "invalid"


class Sampler(StrEnum):
    """How stage 1 searches: the whole grid when it fits in --n-trials (auto), always the grid, or TPE."""

    AUTO = "auto"
    GRID = "grid"
    TPE = "tpe"


class RecommendationSource(StrEnum):
    """Where the recommended configuration's score comes from: the simulator (stage 1) or a real server (stage 2)."""

    STAGE1 = "stage1"
    STAGE2 = "stage2"


# A request's outcome and how bench spreads load over replicas (records.jsonl's `status`, `bench --route`).
class RequestStatus(StrEnum):
    """How a request ended (records.jsonl's `status`)."""

    OK = "ok"
    ERROR = "error"
    ABANDONED = "abandoned"
    """The client gave up on it on purpose (`--abandon-after`): not an error."""


class Route(StrEnum):
    """How `bench` spreads requests over several --base-url with no router in front (`--route`): the routers that
    read no server state, with the simulator's names for them (RouterPolicy)."""

    ROUND_ROBIN = "round-robin"
    LEAST_OUTSTANDING = "least-outstanding"
    PREFIX_HASH = "prefix-hash"
    """The conversation's prefix hashed onto a ring of replicas, with a load bound (servelab.workload.routing)."""
    SESSION = "session"
    """Every turn of a conversation to the replica that served its first."""


class Disturbance(StrEnum):
    """Error kinds that say the measurement was disturbed (a process went away mid-run), not that the server
    answered badly: a run with any of them does not describe the server under that load."""

    CONNECTION_REFUSED = "connection_refused"
    """Nothing listens at the server's address any more: it exited or was killed."""
    CONNECTION_ERROR = "connection_error"
    """The server could not be reached for another reason (unresolvable, connect timeout)."""
    CONNECTION_RESET = "connection_reset"
    """The connection ended mid-response: the server (or something between) dropped it."""
    CLIENT_WORKER_DIED = "client_worker_died"
    """A client process exited before it reported the request (`bench --workers`)."""
