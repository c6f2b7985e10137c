"""benchmarks/client_capacity.py pairs each peer's per-request timings with the server's own stamps; the published
client-added TTFT and ITL rest on that arithmetic, so it is checked here on hand-made stamps (no server, no peer)."""

from __future__ import annotations


import pytest
from support.benchmark_script import load_benchmark


@pytest.fixture(scope="module")
def capacity():
    return load_benchmark("client_capacity")


def server_stats(writes: dict[str, list[float]], arrival: dict[str, float], wall_minus_perf: float) -> dict:
    return {
        "arrival": arrival,
        "first_write": {k: v[0] for k, v in writes.items()},
        "writes": writes,
        "wall_minus_perf": wall_minus_perf,
    }


def test_a_wall_clock_peer_is_moved_onto_the_servers_clock(capacity):
    """AIPerf stamps with time.time(): 2 ms after the first write, 3 ms more than the server's 10 ms TTFT."""
    shift = 1000.0
    stats = server_stats({"a": [100.010, 100.030, 100.050]}, {"a": 100.0}, shift)
    timings = {
        "a": {
            "send": 99.999 + shift,
            "chunks": [100.012 + shift, 100.0325 + shift, 100.052 + shift],
            "wall_clock": True,
        }
    }
    row = capacity._accuracy(timings, stats, concurrency=1)
    assert row["added_ttft_from_write_p50_ms"] == pytest.approx(2.0, abs=1e-6)
    assert row["added_ttft_from_arrival_p50_ms"] == pytest.approx(3.0, abs=1e-6)
    assert row["added_itl_p50_ms"] == pytest.approx(0.0, abs=1e-6)  # gaps of 20.5 and 19.5 ms against 20 and 20
    assert row["server_ttft_p50_ms"] == pytest.approx(10.0, abs=1e-6)


def test_guidellm_timings_give_a_per_request_mean_gap(capacity):
    """GuideLLM keeps the first and last token times and the count: 43 ms over 2 gaps against the server's 40."""
    stats = server_stats({"00000001": [200.010, 200.030, 200.050]}, {"00000001": 200.0}, 0.0)
    timings = {"00000001": {"send": 200.0, "chunks": [200.011, 200.054], "iterations": 3, "wall_clock": True}}
    row = capacity._accuracy(timings, stats, concurrency=1)
    assert row["added_itl_p50_ms"] == pytest.approx(1.5, abs=1e-6)
    assert row["added_ttft_from_arrival_p50_ms"] == pytest.approx(1.0, abs=1e-6)


def test_requests_the_server_never_saw_are_left_out(capacity):
    stats = server_stats({"a": [1.01, 1.03]}, {"a": 1.0}, 0.0)
    timings = {"a": {"send": 1.0, "chunks": [1.011, 1.031]}, "ghost": {"send": 1.0, "chunks": [9.0, 9.5]}}
    row = capacity._accuracy(timings, stats, concurrency=1)
    assert row["added_ttft_from_write_p99_ms"] == pytest.approx(1.0, abs=1e-6)
