"""The first token's time outside the engine core, divided by the client's HTTP phases, as diagnose evidence.

The split (servelab/metrics/server_timings.py) says how much of the client's
TTFT the engine core did not account for; the records' HTTP phases say how
much of that the network took. Checked on hand-made records (the arithmetic,
and the client edge cases: every connection reused, no HTTP at all), then
end to end on a simulated run whose records are given an API-server delay
and HTTP phases as bench would measure them (the real server's case is in
test_diagnose_planted_vllm.py).
"""

from __future__ import annotations

import dataclasses

import pytest

from servelab.diagnose import findings as fk
from servelab.diagnose.analysis import analyse
from servelab.diagnose.outside_engine import describe, outside_engine
from servelab.diagnose.scenario import simulate, synthetic
from servelab.metrics.records import RequestRecord
from servelab.metrics.server_timings import TtftSplit
from servelab.targets.deployment import build_deployment


def split(api_server_s: float) -> TtftSplit:
    return TtftSplit(
        client_ttft_s=api_server_s + 0.3,
        api_server_s=api_server_s,
        queue_s=0.1,
        prefill_s=0.2,
        server_ttft_s=0.35,
        requests=4,
        server_requests=4,
        queue_measured=True,
    )


def record(i: int, *, connect: float | None, send: float = 0.001, wait: float = 0.2) -> RequestRecord:
    return RequestRecord(
        index=i,
        intended_time=0.0,
        send_time=0.0,
        first_token_time=0.5,
        finish_time=1.0,
        connection_reused=connect is None,
        http_connect_s=connect,
        http_send_s=send,
        http_wait_s=wait,
        http_receive_s=0.5,
    )


def test_the_network_share_is_the_handshakes_the_sends_and_one_round_trip_and_the_rest_is_the_api_server():
    # Two of four requests opened a connection (2 ms and 4 ms handshakes: a 3 ms median round trip).
    records = [record(0, connect=0.002), record(1, connect=0.004), record(2, connect=None), record(3, connect=None)]
    o = outside_engine(records, split(0.5))
    assert o is not None
    assert o.connect_s == pytest.approx(0.006 / 4) and o.send_s == pytest.approx(0.001)
    assert o.round_trip_s == pytest.approx(0.003) and o.new_connection_share == 0.5
    assert o.network_s + o.api_server_s == pytest.approx(o.outside_s) == pytest.approx(0.5)
    assert o.first_byte_s == pytest.approx(0.2)
    line = describe(o)
    assert "of the 500 ms outside the engine core, 5.5 ms was the network" in line
    assert "50% of requests opening a connection" in line and "494 ms the API server (" in line


def test_with_every_connection_reused_the_round_trip_is_unknown_and_said_to_be_in_the_api_servers_part():
    o = outside_engine([record(i, connect=None) for i in range(3)], split(0.2))
    assert o is not None and o.round_trip_s is None
    assert o.network_s == pytest.approx(0.001) and o.api_server_s == pytest.approx(0.199)
    assert "round trip unknown" in describe(o) and "the API server and the network's round trip" in describe(o)


def test_no_breakdown_without_http_records_or_without_the_servers_split():
    simulated = dataclasses.replace(record(0, connect=None), connection_reused=None)
    assert outside_engine([simulated], split(0.2)) is None
    assert outside_engine([record(0, connect=0.001)], None) is None


def test_a_request_held_in_the_api_server_is_frontend_bound_with_the_http_breakdown_and_not_underloaded():
    """Four users on an A100 is underloaded (test_diagnose.py); the same run where every request waited 400 ms
    before the engine saw it (as a saturated API server makes it) is not: the client's TTFT minus the engine's
    queue + prefill is the evidence, and the HTTP phases say the network took almost none of it."""
    d = build_deployment("a100-80gb", "qwen2.5-7b")
    scenario = synthetic(100, 100, max_concurrency=4)
    run = simulate(d, scenario)
    held = 0.4
    run.records = [
        dataclasses.replace(
            r,
            send_time=r.send_time - held,
            intended_time=r.intended_time - held,
            connection_reused=r.index % 2 == 0,
            http_connect_s=None if r.index % 2 == 0 else 0.0004,
            http_send_s=0.0001,
            http_wait_s=held,
        )
        for r in run.records
    ]
    dx = analyse(d, scenario, run, source="measured", with_recommendations=False)
    assert dx.bottleneck == fk.FRONTEND_CPU_BOUND, [(f.kind, round(f.score, 2)) for f in dx.findings]
    assert fk.UNDERLOADED not in [f.kind for f in dx.findings]
    evidence = dx.findings[0].evidence
    assert any(line.startswith("TTFT mean ") and "ms API server & network" in line for line in evidence)
    breakdown = next(line for line in evidence if "outside the engine core" in line)
    assert "0.7 ms was the network" in breakdown and "50% of requests opening a connection" in breakdown
    assert dx.evidence.outside_engine is not None and dx.evidence.outside_engine.api_server_s > 0.39
    assert any(n.startswith("Outside the engine, by the client's HTTP phases: ") for n in dx.notes)
    assert dx.model_dump()["evidence"]["outside_engine"]["network_s"] == pytest.approx(
        dx.evidence.outside_engine.network_s
    )
