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

_GAP_CHUNK = 4096


@dataclass(frozen=True)
class ArrivalConfig:
    request_rate: float = math.inf
    burstiness: float = 1.0
    max_concurrency: int | None = None

    def __post_init__(self) -> None:
        if not self.request_rate > 0:
            raise WorkloadError(f"--request-rate must be > 0 (or inf), got {self.request_rate}")
        if not (self.burstiness > 0 and math.isfinite(self.burstiness)):
            raise WorkloadError(f"--burstiness must be a positive number, got {self.burstiness}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise WorkloadError(f"--max-concurrency must be >= 1, got {self.max_concurrency}")

    @property
    def open_loop(self) -> bool:
        return math.isfinite(self.request_rate)

    def describe(self, trace: bool = False) -> dict[str, object]:
        if trace:
            kind = "trace replay (timestamps from the dataset)"
        elif self.open_loop:
            kind = "poisson" if self.burstiness == 1 else f"gamma (burstiness {self.burstiness:g})"
        else:
            kind = "closed loop" if self.max_concurrency else "all at once"
        return {
            "process": kind,
            "request_rate": "inf" if not self.open_loop else self.request_rate,
            "burstiness": self.burstiness,
            "max_concurrency": self.max_concurrency,
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


def schedule(
    specs: Iterator[RequestSpec],
    config: ArrivalConfig,
    rng: np.random.Generator,
    *,
    trace: bool = False,
    duration: float | None = None,
) -> Iterator[RequestSpec]:
    """Specs with arrival times set; stops at the first arrival at or past `duration`."""
    times = arrival_times(config.request_rate, config.burstiness, rng) if config.open_loop and not trace else None
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
