"""The CPU-side model replays a burst measured on the vLLM CPU build, end to end, from this session's measurements.

One moderate burst (300 requests of 128 in / 4 out, all released at once) is served three times by the real vLLM
CPU server, pinned as benchmarks/burst_costs.py pins it (client beside the API server), and replayed by the
simulator with everything measured here: the engine step timed in process on the same burst, the API server's core
per request from its event loop's and the load generator's CPU over these bursts, and the served engine's factor
fitted to their request throughput.

How close the replay's mean TTFT comes to the measured one is an accuracy figure, and on a shared 2-core host it
moves with whatever else runs: it is the benchmark's (`benchmarks/burst_costs.py --one-burst`, docs/simulator.md,
"Requests in flight"), not this test's. This test checks what must hold on any host: every request of every burst
was served and timed, the fit is physical, and the replay's TTFT comes from the API server's intake (charging more
CPU per request makes it later, as a serial intake queue must).
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from support.benchmark_script import load_benchmark

pytestmark = pytest.mark.vllm

REPEATS = 3


def test_the_cpu_side_model_replays_a_measured_burst(launch_vllm, vllm_python, tiny_model, monkeypatch):
    burst_costs = load_benchmark("burst_costs")
    burst = burst_costs.ONE_BURST
    engine = burst_costs.measure_engine(vllm_python, tiny_model, 300, sizes=(burst[2],), shapes=(burst[1],))
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "1")  # the model's OpenMP threads on the engine's core
    with launch_vllm(burst_costs.SERVER_ARGS, kv_cache_gib=2) as server:
        with burst_costs.AttachedProbe(vllm_python, server.base_url, server.pid, server.model_name) as probe:
            bursts = burst_costs.serve_loads(probe, [burst] * REPEATS, 1, 300)

    assert [len(b["requests"]) for b in bursts] == [burst[2]] * REPEATS
    assert all(b["mean_ttft_ms"] > 0 and b["loop_cpu_s"] > 0 for b in bursts)
    reference_s = burst_costs.reference_loop_s(repeats=2)
    check = burst_costs.one_burst_check(engine, bursts, reference_s)
    assert check["served_factor"] > 0 and check["api_per_request_ms"] > 0
    assert math.isfinite(check["predicted_ttft_ms"]) and check["predicted_ttft_ms"] > 0

    raw = {"engine": engine, "served": bursts, "reference_s": reference_s}
    api = burst_costs.per_request_api(raw)
    engine_fit = burst_costs.fit_engine(engine)
    slower_intake = dataclasses.replace(api, per_request_s=2 * api.per_request_s)
    as_fitted = burst_costs.replay(bursts[0], engine_fit, api, check["served_factor"])
    slower = burst_costs.replay(bursts[0], engine_fit, slower_intake, check["served_factor"])
    assert slower["mean_ttft_ms"] > as_fitted["mean_ttft_ms"], (as_fitted, slower)
