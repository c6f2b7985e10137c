"""`diagnose --compare-engines`: what switching engine would buy this deployment, at its own workload and load.

The diagnosed deployment (its engine, its flags) runs beside each other
engine at that engine's defaults on the same chip, model, TP and replicas,
through `servelab compare`'s own code (compare/compare.py), so the numbers
are the ones `servelab compare` gives for the same deployment and load. The
load is the diagnosis's scenario: a measured run replayed, or the described one.
Each other engine then gets one sentence: what it would change in
throughput, latency at this load, goodput under the SLO and how many of these
requests fit in its KV memory.
"""

from __future__ import annotations

from collections.abc import Sequence

from servelab.diagnose.scenario import Scenario
from servelab.schemas.diagnosis import EngineSwitch
from servelab.compare.compare import compare_engines
from servelab.schemas.compare import EngineResult
from servelab.metrics.slo import SLO
from servelab.sim.engines import ENGINES
from servelab.targets.deployment import Deployment
from servelab.targets.engine_deployment import build_engine_deployment

POINT = "this load"
"""The label of the one load point: the diagnosed run's own."""


def _change(before: float | None, after: float | None, unit: str, lower_is_better: bool) -> str:
    if before is None or after is None:
        return "—"
    text = f"{before:,.0f} → {after:,.0f} {unit}"
    if not before:
        return text
    gain = (after - before) / before
    better = gain < 0 if lower_is_better else gain > 0
    return f"{text} ({gain:+.0%}{', better' if better and abs(gain) >= 0.05 else ''})"


def verdict(current: EngineResult, other: EngineResult) -> str:
    """One engine against the current one at this load, each metric before → after."""
    a, b = current.points[0], other.points[0]
    goodput = (
        f"; goodput {a.request_goodput:.2f} → {b.request_goodput:.2f} req/s under the SLO"
        if a.request_goodput is not None and b.request_goodput is not None
        else ""
    )
    output = _change(a.output_throughput, b.output_throughput, "tok/s", False)
    return (
        f"{other.label} instead of {current.label}: output {output}; "
        f"mean TTFT {_change(a.mean_ttft_ms, b.mean_ttft_ms, 'ms', True)}; "
        f"mean TPOT {_ms(a.mean_tpot_ms)} → {_ms(b.mean_tpot_ms)} ms; "
        f"mean E2E {_change(a.mean_e2el_ms, b.mean_e2el_ms, 'ms', True)}{goodput}; "
        f"{other.memory.sequences_fit:,} of these requests fit in its KV memory at once "
        f"({other.memory.kv_token_capacity:,} tokens) vs {current.memory.sequences_fit:,}"
    )


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{x:,.1f}"


def compare_on_engines(d: Deployment, scenario: Scenario, slo: SLO | None, engines: Sequence[str]) -> EngineSwitch:
    """`d` and each engine of `engines` (at its defaults, same chip, model, TP and replicas) on `scenario`."""
    others = [e for e in ENGINES if e in engines and e != d.engine]
    deployments = [d] + [
        build_engine_deployment(
            e,
            d.hardware,
            d.model,
            tensor_parallel_size=d.config.tensor_parallel_size,
            replicas=d.config.data_parallel_size,
            router=d.router,
        )
        for e in others
    ]
    comparison = compare_engines(deployments, [(POINT, scenario.plan)], slo)
    current, *rest = comparison.engines
    return EngineSwitch(current=d.engine, comparison=comparison, verdicts=[verdict(current, r) for r in rest])
