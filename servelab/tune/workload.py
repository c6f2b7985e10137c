"""The workload every trial is judged on: the bench/simulate workload, replayable at any rate.

Each trial must see identical requests (common random numbers), otherwise the
ranking measures the dice rather than the configuration. `build_plan` draws
everything from the workload's seed, and a gamma/Poisson gap scales with
1/rate on the same draws, so the goodput search over the rate compares like
with like and feasibility is monotone in the rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from servelab.workload.arrival import ArrivalConfig
from servelab.workload.datasets import WorkloadConfig
from servelab.workload.plan import Amount, build_plan
from servelab.workload.spec import LoadPlan


@dataclass(frozen=True)
class TuneWorkload:
    """The same three parts `bench` and `simulate` take: what is sent, when, and how much."""

    workload: WorkloadConfig
    arrival: ArrivalConfig
    amount: Amount

    def plan(self, rate: float | None = None, *, burst: bool = False, open_loop: bool = False) -> LoadPlan:
        """A fresh plan at `rate` (default: the arrival's own); `burst` sends everything at once.

        `open_loop` drops the concurrency cap: the goodput search asks what the
        server sustains, not what a capped client can send.
        """
        arrival = self.arrival
        if burst:
            arrival = replace(arrival, request_rate=math.inf)
        elif rate is not None:
            arrival = replace(arrival, request_rate=rate)
        if open_loop:
            arrival = replace(arrival, max_concurrency=None)
        return build_plan(self.workload, arrival, self.amount)

    def with_amount(self, amount: Amount) -> TuneWorkload:
        return replace(self, amount=amount)

    def describe(self) -> dict[str, object]:
        plan = build_plan(self.workload, self.arrival, Amount(num_prompts=1))
        return {**plan.description, "amount": self.amount.describe()}
