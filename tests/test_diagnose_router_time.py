"""diagnose of a simulated fleet names the router's own time when it is a material part of the first token.

The simulator charges a router's own time per request (sim/router.py ROUTER_COSTS) and run.json records what it came
to (`server_info.router_time`); diagnose reads that record, as it reads a measured fleet's replica loads.
"""

from __future__ import annotations

import pytest

from servelab.diagnose import fleet
from servelab.diagnose.analysis import analyse
from servelab.diagnose.scenario import synthetic
from servelab.metrics.records import MemorySink
from servelab.metrics.results import RunResult
from servelab.schemas.results import ArrivalInfo, PlanInfo, RunInfo
from servelab.schemas.vocabulary import DiagnosisSource, RouterPolicy
from servelab.sim import router as router_mod
from servelab.targets.deployment import build_deployment


def _diagnosis(monkeypatch: pytest.MonkeyPatch, costs: dict[RouterPolicy, router_mod.RouterCost]):
    """A simulated fleet's run as `servelab simulate` writes it (run.json's server_info, as the target reported it),
    diagnosed."""
    monkeypatch.setattr(router_mod, "ROUTER_COSTS", costs)
    d = build_deployment("h100", "llama-3.1-8b", replicas=2, router="prefix-aware")
    scenario = synthetic(256, 16, request_rate=4, num_requests=24)
    sink, samples = MemorySink(), []
    outcome = d.sim_target(scrape_interval=0.5).run(scenario.plan(), sink, samples.append)
    info = RunInfo.begun(
        source="sim", workload=PlanInfo(arrival=ArrivalInfo(request_rate=4)), server_info=outcome.server_info
    )
    run = RunResult(None, info, sink.records, samples)
    return analyse(d, scenario, run, source=DiagnosisSource.SIMULATED_RUN, with_recommendations=False)


def _router_findings(dx):
    return [f for f in dx.findings if f.kind == fleet.OUTSIDE_REPLICAS and "in the router" in f.title]


def test_a_router_that_spends_a_large_part_of_the_first_token_is_a_finding(monkeypatch: pytest.MonkeyPatch):
    slow = {RouterPolicy.PREFIX_AWARE: router_mod.RouterCost(fixed_s=0.05)}
    [finding] = _router_findings(_diagnosis(monkeypatch, slow))
    assert "the router spends 50.0 ms on each request" in finding.evidence[0]
    assert "over 24 requests" in finding.evidence[0]


def test_a_router_whose_own_time_is_small_is_not(monkeypatch: pytest.MonkeyPatch):
    assert _router_findings(_diagnosis(monkeypatch, dict(router_mod.ROUTER_COSTS))) == []
    assert _router_findings(_diagnosis(monkeypatch, {})) == []
