"""Ceilings only the simulator can give: all limits at once, and the SLO's limit.

Saturation is the throughput of a closed loop deep enough that the engine
never idles; the SLO rate is the highest Poisson rate at which the chosen
share of requests still meets every bound, found by bisection.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from servelab.diagnose import parallel
from servelab.diagnose.scenario import Scenario, simulate
from servelab.metrics.intervals import Limit, classify_limit, interval_text
from servelab.metrics.slo import SLO
from servelab.metrics.summary import summarize
from servelab.targets.deployment import Deployment

DEFAULT_ATTAINMENT = 0.9
"""Share of requests that must meet the SLO for a rate to count as sustainable."""
MODEL_ERROR = 0.15
"""The simulated ceiling's own error on real GPUs where it has no prediction interval (docs/accuracy.md: 5-15%)."""


def overload(offered: float | None, ceiling: float | None, interval: Sequence[float] | None = None) -> str | None:
    """The first line of a diagnosis whose offered load exceeds what the deployment can serve; None when it does not.

    Above the ceiling the queue grows for as long as the load lasts: its latency percentiles measure the run's length,
    not the server, so the capacity is what to read. An offered rate inside the ceiling's 80% prediction interval
    (or, without one, within the model's usual error) is "at or just above" it, not a verdict either way."""
    if not offered or not ceiling or offered <= ceiling:
        return None
    high = interval[1] if interval else (1 + MODEL_ERROR) * ceiling
    how_sure = f" ({interval_text(interval)})" if interval else ""
    where = (
        "at or just above it (inside the ceiling's own uncertainty: measure before concluding)"
        if offered <= high
        else f"{offered / ceiling:.1f}x what it can serve"
    )
    return (
        f"Overloaded: {offered:.2f} req/s offered against a simulated ceiling of {ceiling:.2f} req/s{how_sure} for "
        f"this workload, {where}. Requests queue for as long as the load lasts, so latency percentiles here "
        f"describe the run's length, not the server: the capacity is {ceiling:.2f} req/s, and the changes below "
        "are judged on how far they raise it."
    )


def max_batch(deployment: Deployment, scenario: Scenario) -> int:
    """Sequences one replica can run at once at this workload's lengths."""
    seq_len = round(scenario.mean_input + scenario.mean_output)
    max_num_seqs = deployment.config.max_num_seqs
    assert max_num_seqs is not None  # a Deployment's config is resolved: every knob set
    return max(1, min(max_num_seqs, deployment.memory.max_concurrency(seq_len)))


_CEILINGS: dict[tuple[object, ...], tuple[float, Limit]] = {}
"""saturation_rps and what limited that run, by deployment and workload: findings, levers and assumptions ask for the
same ceilings."""
parallel.share(_CEILINGS)


def _saturating(deployment: Deployment, scenario: Scenario) -> tuple[tuple[object, ...], Scenario]:
    """The closed loop that saturates `deployment`, and its key in _CEILINGS."""
    depth = max(8, int(max_batch(deployment, scenario) * 1.5)) * deployment.config.data_parallel_size
    closed = scenario.closed_loop(depth)
    return (
        json.dumps(deployment.describe(), sort_keys=True, default=str),
        deployment.router,  # not in describe(): a fleet's routes differ only here
        closed.shapes,
        depth,
        closed.prefix_len,
        closed.seed,
    ), closed


def ceiling_known(deployment: Deployment, scenario: Scenario) -> bool:
    return _saturating(deployment, scenario)[0] in _CEILINGS


def ceiling_key(deployment: Deployment, scenario: Scenario) -> tuple[object, ...]:
    """The ceiling's key in _CEILINGS as a background batch names it (diagnose/parallel.py)."""
    return ("ceiling", _saturating(deployment, scenario)[0])


def saturation_rps(deployment: Deployment, scenario: Scenario) -> float:
    """Request throughput with more requests outstanding than the engine can run at once."""
    return _ceiling(deployment, scenario)[0]


def saturation_limit(deployment: Deployment, scenario: Scenario) -> Limit:
    """What limits the saturating run: the engine, or the API server's core (servelab.metrics.intervals)."""
    return _ceiling(deployment, scenario)[1]


def _ceiling(deployment: Deployment, scenario: Scenario) -> tuple[float, Limit]:
    key, closed = _saturating(deployment, scenario)
    if key not in _CEILINGS:
        parallel.wait_for(("ceiling", key))
    if key not in _CEILINGS:
        if len(_CEILINGS) >= 64:
            _CEILINGS.pop(next(iter(_CEILINGS)))
        run = simulate(deployment, closed)
        rps = float(summarize(run.records).request_throughput)
        _CEILINGS[key] = rps, classify_limit(run.run_info.model_extra or {})  # the what-if's own keys
    return _CEILINGS[key]


def attainment(deployment: Deployment, scenario: Scenario, slo: SLO) -> float:
    run = simulate(deployment, scenario)
    return sum(1 for r in run.records if slo.is_met(r)) / max(1, len(run.records))


def slo_max_rps(
    deployment: Deployment,
    scenario: Scenario,
    slo: SLO,
    upper: float,
    *,
    share: float = DEFAULT_ATTAINMENT,
    iterations: int = 8,
) -> float:
    """Highest request rate in (0, upper] whose SLO attainment is at least `share` (0 when none is)."""
    low, high = 0.0, upper
    if attainment(deployment, scenario.at_rate(high), slo) >= share:
        return high
    for _ in range(iterations):
        mid = (low + high) / 2
        if attainment(deployment, scenario.at_rate(mid), slo) >= share:
            low = mid
        else:
            high = mid
    return low
