"""The names and defaults the command line and the result files' schemas show: engines, routers, datasets, goals,
regimes and tiers, kept apart from the code that uses them (so `--help` and `servelab schema` import none of it)."""

from __future__ import annotations

from enum import StrEnum

DEFAULT_PERCENTILES: tuple[float, ...] = (50, 90, 95, 99)
"""The percentiles of TTFT, TPOT, ITL and E2E latency a summary reports unless `--metric-percentiles` names others."""


class Regime(StrEnum):
    """Where on the load curve a prediction sits: its accuracy differs there, so its interval does."""

    UNDER_CAPACITY = "under_capacity"
    SATURATED = "saturated"
    CONCURRENCY_1 = "concurrency_1"


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
    LEAST_LOADED = "least-loaded"
    LEAST_OUTSTANDING = "least-outstanding"
    PREFIX_HASH = "prefix-hash"
    PREFIX_AWARE = "prefix-aware"
    SESSION = "session"


ROUND_ROBIN = RouterPolicy.ROUND_ROBIN
LEAST_LOADED = RouterPolicy.LEAST_LOADED
POLICIES = tuple(RouterPolicy)
CLIENT_ROUTES = (ROUND_ROBIN, RouterPolicy.LEAST_OUTSTANDING, RouterPolicy.PREFIX_HASH, RouterPolicy.SESSION)
"""The routers `bench` runs itself over several --base-url (`--route`): those that read no server state."""
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
"""A `--duration` run without a rate (closed loop) could ask for requests forever; this bounds it (and --num-prompts)."""
PLAN_TOKEN_LIMIT = 100_000_000
"""Prompt + output tokens one plan may hold unless --max-plan-tokens says more: prompts are materialised as token
ids and every output token's arrival is recorded, so this is ~1 GB of memory, far beyond a day's benchmark."""


# The question a diagnosis answers first (`diagnose --goal`).
class Goal(StrEnum):
    LATENCY = "latency"
    THROUGHPUT = "throughput"
