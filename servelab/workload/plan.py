"""From flags to a LoadPlan: dataset, arrival process and amount, one description for run.json.

A plan's request iterator is single-use, so a sweep calls `build_plan` once
per point; the dataset and the arrival process draw from separate seeded
streams, so every point of a rate sweep sends the same prompts.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice

import numpy as np

from servelab.workload.arrival import ArrivalConfig, schedule
from servelab.workload.datasets import WorkloadConfig, open_dataset
from servelab.workload.errors import WorkloadError
from servelab.workload.spec import LoadPlan

DEFAULT_NUM_PROMPTS = 1000
"""`vllm bench serve`'s default."""
DURATION_REQUEST_CAP = 1_000_000
"""A `--duration` run without a rate (closed loop) could ask for requests forever; this bounds it."""


@dataclass(frozen=True)
class Amount:
    num_prompts: int | None = None
    duration: float | None = None
    warmup: float = 0.0

    def __post_init__(self) -> None:
        if self.num_prompts is not None and self.duration is not None:
            raise WorkloadError("--num-prompts and --duration both set the amount of load; give one of them")
        if self.num_prompts is not None and self.num_prompts < 1:
            raise WorkloadError(f"--num-prompts must be >= 1, got {self.num_prompts}")
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
    """A fresh plan; bad dataset files and flag clashes raise WorkloadError here, before any load."""
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
