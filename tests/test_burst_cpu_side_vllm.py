"""The CPU-side model reproduces a measured burst on the vLLM CPU build, within the burst's own noise.

One moderate burst (300 requests of 128 in / 4 out, all released at once) is
served three times by the real vLLM CPU server, pinned as
benchmarks/burst_costs.py pins it. Everything the simulator needs comes from
this session, so the check holds on any host: the engine step from the
engine core timed in process on the same burst, the served engine's factor
from a steady closed loop, and the API server's cost per request from its
event loop's CPU time over these same loads. The simulator then replays the
burst's own requests; its request throughput and mean TTFT must lie within
the burst's noise: the larger of the three repeats' own spread and the
spread benchmarks/burst_costs.py recorded for moderate bursts (the data
file's `bursts` section). TPOT is not checked: the replay's engine step
(the CPU build's model, not a GPU's) over-predicts it on prefill-heavy steps
(docs/simulator.md), which is not the CPU side.
"""

from __future__ import annotations

import statistics

import pytest

from servelab.perf.vllm_cpu_costs import burst_noise
from support.benchmark_script import load_benchmark

pytestmark = pytest.mark.vllm

BURST = ("burst", "128/4", 300, 300)
STEADY = ("steady", "128/4", 320, 64)
REPEATS = 3


def test_the_cpu_side_model_reproduces_a_measured_burst(launch_vllm, vllm_python, tiny_model, monkeypatch):
    burst_costs = load_benchmark("burst_costs")
    engine = burst_costs.measure_engine(vllm_python, tiny_model, 300, sizes=(BURST[2],), shapes=(BURST[1],))
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "1")  # the model's OpenMP threads on the engine's core
    with launch_vllm(burst_costs.SERVER_ARGS, kv_cache_gib=2) as server:
        with burst_costs.AttachedProbe(vllm_python, server.base_url, server.pid, server.model_name) as probe:
            rows = burst_costs.serve_loads(probe, [STEADY] + [BURST] * REPEATS, 1, 300)
    raw = {"engine": engine, "served": rows, "reference_s": burst_costs.reference_loop_s(repeats=2)}
    api = burst_costs.per_request_api(raw)  # one shape: the loop's CPU per request, all at intake
    factor = burst_costs.fit_served_factor(raw, api)
    bursts = [r for r in rows if r["kind"] == "burst"]
    predicted = burst_costs.replay(bursts[0], burst_costs.fit_engine(engine), api, factor)
    recorded = burst_noise()
    for metric in ("requests_per_s", "mean_ttft_ms"):
        measured = statistics.mean(r[metric] for r in bursts)
        noise = max(burst_costs.repeat_spread(bursts, metric), recorded[metric])
        error = predicted[metric] / measured - 1
        assert abs(error) <= noise, (
            f"{metric}: predicted {predicted[metric]:.1f}, measured {measured:.1f} "
            f"({[round(r[metric], 1) for r in bursts]}): error {error:+.1%} beyond the noise {noise:.1%}; "
            f"served factor {factor:.2f}, API server {1e3 * api.per_request_s:.2f} ms per request"
        )
