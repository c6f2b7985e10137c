"""From flags to a LoadPlan: dataset, arrival process and amount, one description for run.json.

A plan's request iterator is single-use, so a sweep calls `build_plan` once
per point; the dataset and the arrival process draw from separate seeded
streams, so every point of a rate sweep sends the same prompts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import islice

import numpy as np

from servelab.workload.arrival import ArrivalConfig, schedule
from servelab.workload.datasets import WorkloadConfig, open_dataset
from servelab.workload.errors import WorkloadError
from servelab.workload.spec import LoadPlan
from servelab.schemas.vocabulary import DURATION_REQUEST_CAP, PLAN_TOKEN_LIMIT

DEFAULT_NUM_PROMPTS = 1000
"""`vllm bench serve`'s default."""


@dataclass(frozen=True)
class Amount:
    num_prompts: int | None = None
    duration: float | None = None
    warmup: float = 0.0
    max_plan_tokens: int = PLAN_TOKEN_LIMIT
    count_flag: str = "--num-prompts"
    """The flag that set `num_prompts`, for messages (tune's stage 1 takes it from --sim-prompts)."""

    def __post_init__(self) -> None:
        if self.num_prompts is not None and self.duration is not None:
            raise WorkloadError("--num-prompts and --duration both set the amount of load; give one of them")
        if self.num_prompts is not None and self.num_prompts < 1:
            raise WorkloadError(f"{self.count_flag} must be >= 1, got {self.num_prompts}")
        if self.duration is not None and not self.duration > 0:
            raise WorkloadError(f"--duration must be > 0 seconds, got {self.duration}")
        if self.warmup < 0:
            raise WorkloadError(f"--warmup must be >= 0 seconds, got {self.warmup}")
        if self.duration is not None and self.warmup >= self.duration:
            raise WorkloadError(f"--warmup ({self.warmup:g} s) must be shorter than --duration ({self.duration:g} s)")

    @property
    def count(self) -> int | None:
        """Requests to generate: None for a duration run (lazy, stopped by time and the cap)."""
        if self.duration is not None:
            return None
        return self.num_prompts or DEFAULT_NUM_PROMPTS

    def describe(self) -> dict[str, object]:
        return {"num_prompts": self.count, "duration": self.duration, "warmup": self.warmup}


def build_plan(workload: WorkloadConfig, arrival: ArrivalConfig, amount: Amount) -> LoadPlan:
    """A fresh plan; bad dataset files, flag clashes and a plan too big to hold raise WorkloadError here, before any
    load."""
    _check_size(workload, arrival, amount)
    data_seed, arrival_seed = np.random.SeedSequence(workload.seed).spawn(2)
    dataset = open_dataset(workload, np.random.default_rng(data_seed))
    if dataset.timestamps and arrival.open_loop:
        raise WorkloadError(
            f"--request-rate conflicts with the timestamps in --dataset-path {workload.dataset_path} "
            "(trace replay); drop one of them"
        )
    specs = schedule(
        dataset.specs(amount.count),
        arrival,
        np.random.default_rng(arrival_seed),
        trace=dataset.timestamps,
        duration=amount.duration,
        count=amount.count,
    )
    if amount.count is None:
        specs = islice(specs, DURATION_REQUEST_CAP)
    return LoadPlan(
        requests=specs,
        max_concurrency=arrival.max_concurrency,
        duration=amount.duration,
        warmup=amount.warmup,
        description={
            "workload": dataset.describe(),
            "arrival": arrival.describe(trace=dataset.timestamps),
            "amount": amount.describe(),
            "text_prompts": dataset.text_prompts,
            "dataset_notes": dataset.notes,
        },
    )


def _check_size(workload: WorkloadConfig, arrival: ArrivalConfig, amount: Amount) -> None:
    """Refuse a plan whose requests x lengths exceed `amount.max_plan_tokens`, before a token is drawn: a typo such
    as --random-input-len 1000000000 would otherwise grow memory until the machine runs out."""
    per_request = workload.tokens_per_request()
    if per_request is None:  # lengths come from a file, which bounds them
        return
    if amount.count is not None:
        requests, source = float(amount.count), f"{amount.count_flag} {amount.count:,}"
    elif math.isfinite(arrival.request_rate) and amount.duration is not None:
        requests = min(arrival.request_rate * amount.duration, DURATION_REQUEST_CAP)
        source = (
            f"--duration {amount.duration:g} s at --request-rate {arrival.request_rate:g} (~{requests:,.0f} requests)"
        )
    else:
        return
    tokens = requests * per_request
    if tokens > amount.max_plan_tokens:
        raise WorkloadError(
            f"{source} x ~{_count(per_request)} prompt + output tokens a request = {tokens:,.3g} tokens, over the "
            f"{amount.max_plan_tokens:,} one run may plan: send fewer or shorter requests, or raise --max-plan-tokens"
        )


def _count(value: float) -> str:
    """1,152 as such; a count past a trillion (a typo's) in powers of ten, not as fifty digits."""
    return f"{value:,.0f}" if value < 1e12 else f"{value:.3g}"
