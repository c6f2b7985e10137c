"""vLLM 0.32's async scheduling in the simulated engine, against schedules worked out by hand.

With async scheduling the engine core schedules step N+1 while the GPU runs
step N: the step's CPU work overlaps the previous step's GPU work, and a
request that arrives after step N started on the GPU joins step N+2.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from servelab.metrics.records import MemorySink
from servelab.perf.cost_model import CostCoefficients, StepBatch
from servelab.perf.engine_config import EngineConfig
from servelab.sim.engine import SimEngine
from servelab.sim.linear_cost import LinearCostModel
from servelab.targets.sim import SimTarget
from servelab.workload.spec import LoadPlan, RequestSpec


@dataclass(frozen=True)
class FlatCost:
    """Every step takes `total` seconds, whatever its batch: the hand-computed schedules stay readable."""

    total: float = 0.010

    def step_time(self, batch: StepBatch) -> float:
        return self.total

    def wake_time(self, idle_s: float) -> float:
        return 0.0


def cpu(step_s: float) -> CostCoefficients:
    return CostCoefficients(step_overhead_s=step_s, per_request_overhead_s=0.0, prefill_step_overhead_s=0.0)


def config(async_scheduling: bool) -> EngineConfig:
    return EngineConfig(max_num_seqs=8, max_num_batched_tokens=256, async_scheduling=async_scheduling)


def token_times(target: SimTarget, specs: list[RequestSpec]) -> dict[int, list[float]]:
    sink = MemorySink()
    target.run(LoadPlan(specs), sink)
    return {r.index: [round(t, 9) for t in r.chunk_times] for r in sink.records}


def two_requests() -> list[RequestSpec]:
    """A (3 tokens) at t=0; B (2 tokens) at t=5 ms, while A's first step runs."""
    return [RequestSpec(0, np.arange(16), 3, 0.0), RequestSpec(1, np.arange(100, 116), 2, 0.005)]


def test_synchronous_loop_takes_a_request_at_the_next_step():
    # Steps of 10 ms back to back: A prefills [0,10]; B, arrived at 5, joins step 2 [10,20].
    times = token_times(SimTarget(config(False), 100, FlatCost(), cpu_costs=cpu(0.004)), two_requests())
    assert times == {0: [0.010, 0.020, 0.030], 1: [0.020, 0.030]}


def test_async_overlaps_cpu_with_the_gpu_and_a_request_joins_one_step_later():
    # 4 ms of CPU, 6 ms of GPU per step.
    # step 1: scheduled at 0 (idle engine), GPU [4, 10]            -> A1 at 10
    # step 2: scheduled at 4 (when step 1 started on the GPU): B (arrived at 5) is not seen yet;
    #         GPU [max(4 + 4, 10), +6] = [10, 16]                    -> A2 at 16
    # step 3: scheduled at 10, sees B: GPU [max(14, 16), +6] = [16, 22] -> A3 and B1 at 22
    # step 4: scheduled at 16: GPU [max(20, 22), +6] = [22, 28]    -> B2 at 28
    times = token_times(SimTarget(config(True), 100, FlatCost(), cpu_costs=cpu(0.004)), two_requests())
    assert times == {0: [0.010, 0.016, 0.022], 1: [0.022, 0.028]}


def test_async_when_the_cpu_is_slower_than_the_gpu_steps_follow_the_cpu():
    # 8 ms of CPU, 2 ms of GPU: the GPU starts each step when its CPU work is done, every 8 ms.
    # step 1: GPU [8, 10]; step 2: scheduled at 8, GPU [16, 18]; step 3: scheduled at 16, GPU [24, 26].
    times = token_times(SimTarget(config(True), 100, FlatCost(), cpu_costs=cpu(0.008)), two_requests()[:1])
    assert times == {0: [0.010, 0.018, 0.026]}


def test_async_engine_with_nothing_to_run_schedules_after_the_output_like_the_synchronous_loop():
    # A alone, 1 token: step 1 GPU [4, 10]. B arrives at 7: when step 2 would have been scheduled (at 4)
    # nothing could run, so the engine core schedules again after step 1's output, at 10, and sees B.
    specs = [RequestSpec(0, np.arange(16), 1, 0.0), RequestSpec(1, np.arange(100, 116), 1, 0.007)]
    times = token_times(SimTarget(config(True), 100, FlatCost(), cpu_costs=cpu(0.004)), specs)
    assert times == {0: [0.010], 1: [0.020]}  # scheduled at 10: GPU [14, 20]


def test_async_without_cpu_costs_only_delays_admission():
    # All of a step is GPU time: steps still follow each other every 10 ms, B waits one more step.
    times = token_times(SimTarget(config(True), 100, FlatCost(), cpu_costs=cpu(0.0)), two_requests())
    assert times == {0: [0.010, 0.020, 0.030], 1: [0.030, 0.040]}


def test_async_decode_runs_fast_forwarded_match_step_by_step():
    """The decode fast-forward gives the same token times under async scheduling as stepping one by one."""
    rng = np.random.default_rng(3)
    specs = [
        RequestSpec(i, rng.integers(0, 9000, 64, dtype=np.int32), 40, float(t))
        for i, t in enumerate(np.cumsum(rng.exponential(0.05, 30)))
    ]
    cfg = EngineConfig(max_num_seqs=16, max_num_batched_tokens=512, async_scheduling=True)
    cost = LinearCostModel(overhead=0.004)
    coefficients = CostCoefficients(step_overhead_s=0.002, per_request_overhead_s=1e-4, prefill_step_overhead_s=5e-4)
    fast = SimTarget(cfg, 400, cost, cpu_costs=coefficients)
    slow = SimTarget(cfg, 400, cost, cpu_costs=coefficients)
    slow.make_engine = lambda: SimEngine(cfg, 400, cost, fast_forward=False, cpu_costs=coefficients)  # type: ignore[method-assign]
    a, b = token_times(fast, specs), token_times(slow, specs)
    assert fast.last_engines[0].fast_forward and not slow.last_engines[0].fast_forward
    assert a.keys() == b.keys() and len(a) == 30
    for k in a:
        assert a[k] == pytest.approx(b[k], abs=1e-9)
