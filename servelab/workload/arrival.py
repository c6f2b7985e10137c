"""When requests are released: closed loop, open loop (Poisson or gamma-bursty), or a trace.

Open-loop gaps follow vLLM's `--burstiness`: gamma with shape=burstiness and
mean 1/rate (burstiness 1 is Poisson, < 1 burstier, > 1 more regular). The
first request goes at t=0. `request_rate=inf` sends everything at once, which
with `max_concurrency` is the closed loop. Only the first turn of a
conversation gets a new arrival; later turns keep it, and the target sends
them when the previous turn has finished plus the think time.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from servelab.workload.errors import WorkloadError
from servelab.workload.spec import RequestSpec
from servelab.schemas.vocabulary import RAMPS

_GAP_CHUNK = 4096


@dataclass(frozen=True)
class Ramp:
    """An open loop whose rate rises from `start_rps` to `end_rps` over the run, as vLLM's `--ramp-up-*` flags.

    Progress is the request's place in the plan (vLLM's definition: request i of N is at i / (N - 1)) or, for a
    `--duration` run, which has no N, the share of the duration elapsed. Linear interpolates the rate,
    exponential its logarithm. Each gap is drawn at the current rate (gamma with the run's burstiness).
    """

    strategy: str
    start_rps: float
    end_rps: float

    def __post_init__(self) -> None:
        if self.strategy not in RAMPS:
            raise WorkloadError(f"--ramp-up-strategy {self.strategy!r}: choose one of {', '.join(RAMPS)}")
        if not (0 < self.start_rps <= self.end_rps and math.isfinite(self.end_rps)):
            raise WorkloadError(
                f"--ramp-up-start-rps ({self.start_rps:g}) and --ramp-up-end-rps ({self.end_rps:g}) must be finite "
                "rates > 0 with start <= end"
            )

    def rate(self, progress: float) -> float:
        p = min(max(progress, 0.0), 1.0)
        if self.strategy == "linear":
            return self.start_rps + (self.end_rps - self.start_rps) * p
        return self.start_rps * (self.end_rps / self.start_rps) ** p

    def describe(self) -> dict[str, object]:
        return {"strategy": self.strategy, "start_rps": self.start_rps, "end_rps": self.end_rps}


@dataclass(frozen=True)
class ArrivalConfig:
    request_rate: float = math.inf
    burstiness: float = 1.0
    max_concurrency: int | None = None
    ramp: Ramp | None = None
    """A rising rate in place of `request_rate` (which must then be inf)."""

    def __post_init__(self) -> None:
        if self.ramp is not None and math.isfinite(self.request_rate):
            raise WorkloadError("--ramp-up-strategy sets the request rate over the run: drop --request-rate")
        if not self.request_rate > 0:
            raise WorkloadError(f"--request-rate must be > 0 (or inf), got {self.request_rate}")
        if not (self.burstiness > 0 and math.isfinite(self.burstiness)):
            raise WorkloadError(f"--burstiness must be a positive number, got {self.burstiness}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise WorkloadError(f"--max-concurrency must be >= 1, got {self.max_concurrency}")

    @property
    def open_loop(self) -> bool:
        return math.isfinite(self.request_rate) or self.ramp is not None

    def describe(self, trace: bool = False) -> dict[str, object]:
        if trace:
            kind = "trace replay (timestamps from the dataset)"
        elif self.open_loop:
            kind = "poisson" if self.burstiness == 1 else f"gamma (burstiness {self.burstiness:g})"
            if self.ramp is not None:
                kind += f", {self.ramp.strategy} ramp {self.ramp.start_rps:g} -> {self.ramp.end_rps:g} req/s"
        else:
            kind = "closed loop" if self.max_concurrency else "all at once"
        return {
            "process": kind,
            "request_rate": self.request_rate if math.isfinite(self.request_rate) else "inf",
            "burstiness": self.burstiness,
            "max_concurrency": self.max_concurrency,
            "ramp": self.ramp.describe() if self.ramp is not None else None,
        }


def arrival_times(rate: float, burstiness: float, rng: np.random.Generator) -> Iterator[float]:
    """Endless open-loop send times starting at 0, drawn in numpy chunks."""
    scale = 1.0 / (rate * burstiness)
    t = 0.0
    while True:
        gaps = rng.gamma(burstiness, scale, size=_GAP_CHUNK)
        times = t + np.concatenate(([0.0], np.cumsum(gaps[:-1])))
        yield from times.tolist()
        t = float(times[-1] + gaps[-1])


def ramp_times(
    ramp: Ramp, burstiness: float, rng: np.random.Generator, count: int | None, duration: float | None
) -> Iterator[float]:
    """Endless send times starting at 0 with the rate `ramp` gives at each request's progress (index or time)."""
    t = 0.0
    i = 0
    while True:
        yield t
        progress = i / max(count - 1, 1) if count is not None else (t / duration if duration else 1.0)
        rate = ramp.rate(progress)
        t += float(rng.gamma(burstiness, 1.0 / (rate * burstiness)))
        i += 1


def schedule(
    specs: Iterator[RequestSpec],
    config: ArrivalConfig,
    rng: np.random.Generator,
    *,
    trace: bool = False,
    duration: float | None = None,
    count: int | None = None,
) -> Iterator[RequestSpec]:
    """Specs with arrival times set; stops at the first arrival at or past `duration`. `count` (the plan's
    requests) places a ramp's requests along it."""
    times: Iterator[float] | None = None
    if config.ramp is not None and not trace:
        times = ramp_times(config.ramp, config.burstiness, rng, count, duration)
    elif config.open_loop and not trace:
        times = arrival_times(config.request_rate, config.burstiness, rng)
    start: dict[int, float] = {}
    for spec in specs:
        if spec.depends_on is not None:
            spec.arrival_time = start[spec.depends_on]
        elif times is not None:
            spec.arrival_time = next(times)
        elif not trace:
            spec.arrival_time = 0.0
        if duration is not None and spec.arrival_time >= duration:
            return
        start[spec.index] = spec.arrival_time  # a later turn may point here
        yield spec
