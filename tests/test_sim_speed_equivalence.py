"""The simulator's output, bit for bit, on varied scenarios: speed work must not change behaviour.

Each scenario runs a few hundred requests through `SimTarget` and hashes, in
order, every record's JSON, every timeline sample's JSON and the run's
client stats (floats as Python's repr, so a last-bit change shows). The
digests were taken at 63abd8d, before the speed-up of issue 11; a change
that alters them alters what the simulator predicts. If that is intended,
regenerate them deliberately (`python tests/test_sim_speed_equivalence.py`)
and say why in the commit. Two were regenerated once, on purpose: the
decode fast-forward reported the KV-usage gauge of a run's first step for
the whole run, and now reports each step's, as stepping one by one does.
All were regenerated once more when every record gained bench's HTTP-phase,
replica and abandonment fields (null for the simulator): with those fields
left out of the JSON, every digest was the earlier one. Those with an API
server were regenerated when its event loop stopped serving a burst's whole
intake before any output round (it now takes in about (requests waiting) /
(streams woken + 1) requests between rounds; benchmarks/burst_costs.py,
docs/simulator.md). The fleet's (chunked_replicas) was regenerated when a simulated fleet's records began to name
the replica that served them (base_url replica-i, as bench's records do): with base_url nulled, its digest is the
earlier one; and again when its least-loaded router began to count the requests it sent each engine that have not
finished, as vLLM's balancer does (`engine_inflight`). overload_async_frontend's was regenerated when the API
server began to handle a step of more than 128 outputs in vLLM's slices of 128, a round of its own (its overload
runs such steps; the other scenarios' steps are narrower and their digests did not move).

The fast-forward itself is checked the same way: with it off, every
scenario gives the same digest.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass

import numpy as np
import pytest

from servelab.metrics import timeline as tl
from servelab.metrics.records import MemorySink
from servelab.metrics.timeline import TimelineSample
from servelab.perf.cost_model import CostModel, RooflineCostModel, StepBatch
from servelab.perf.vllm_cpu_costs import ApiServerCosts
from servelab.sim.hashing import (
    output_block_hash_array,
    output_block_hashes,
    prompt_block_hashes,
    prompt_block_hashes_many,
)
from servelab.targets.deployment import Deployment, build_deployment
from servelab.targets.sim import SimTarget
from servelab.workload.arrival import ArrivalConfig
from servelab.workload.datasets import WorkloadConfig
from servelab.workload.plan import Amount, build_plan
from servelab.workload.spec import LoadPlan


class _BatchOnly:
    """A cost model without `step_time_aggregate`: drives the engine's StepBatch path."""

    def __init__(self, inner: RooflineCostModel) -> None:
        self._inner = inner

    def step_time(self, batch: StepBatch) -> float:
        return self._inner.step_time(batch)

    def wake_time(self, idle_s: float) -> float:
        return self._inner.wake_time(idle_s)


@dataclass(frozen=True)
class Scenario:
    gpu: str
    model: str
    engine_args: str
    workload: WorkloadConfig
    arrival: ArrivalConfig
    requests: int
    frontend: bool = True
    """False: no API-server model, which turns the decode fast-forward on."""
    replicas: int | None = None
    router: str = "round-robin"
    tensor_parallel_size: int | None = None
    network_latency: float = 0.0
    priorities: bool = False
    batch_only_cost: bool = False
    datasheet: bool = False


SCENARIOS: dict[str, Scenario] = {
    # The benchmark's shape, shorter: overloaded, async, API server on.
    "overload_async_frontend": Scenario(
        "a100-80gb",
        "qwen2.5-7b",
        "",
        WorkloadConfig(input_len=1500, output_len=200),
        ArrivalConfig(request_rate=10.0),
        300,
    ),
    # Shared system prompts, fast-forward on (no frontend), lengths spread.
    "prefix_fast_forward": Scenario(
        "h100-sxm",
        "llama-3.1-8b",
        "",
        WorkloadConfig(
            dataset_name="prefix",
            prefix_len=700,
            num_prefixes=4,
            input_len=300,
            output_len=120,
            range_ratio=0.5,
            seed=3,
        ),
        ArrivalConfig(request_rate=25.0),
        400,
        frontend=False,
    ),
    # Chats whose later turns hit the cached blocks of earlier replies; closed loop with think time.
    "multiturn_closed_loop": Scenario(
        "a100-80gb",
        "qwen2.5-7b",
        "",
        WorkloadConfig(
            dataset_name="multiturn", turns=4, think_time=0.3, input_len=400, output_len=150, range_ratio=0.8, seed=5
        ),
        ArrivalConfig(max_concurrency=24),
        240,
    ),
    # KV pressure: preemption by recompute, synchronous loop, watermark, fast-forward on.
    "preempt_sync_fcfs": Scenario(
        "a100-80gb",
        "qwen2.5-7b",
        "--num-gpu-blocks-override 700 --max-model-len 4096 --no-async-scheduling --max-num-seqs 64 --watermark 0.01",
        WorkloadConfig(input_len=600, output_len=300, range_ratio=0.9, seed=7),
        ArrivalConfig(request_rate=40.0),
        300,
        frontend=False,
    ),
    # Priority preemption, async, without the full-prompt gate, through the StepBatch path.
    "preempt_async_priority": Scenario(
        "h100-sxm",
        "llama-3.1-8b",
        "--num-gpu-blocks-override 500 --max-model-len 4096 --scheduling-policy priority "
        "--no-scheduler-reserve-full-isl",
        WorkloadConfig(input_len=500, output_len=250, range_ratio=0.9, seed=11),
        ArrivalConfig(request_rate=30.0),
        300,
        priorities=True,
        batch_only_cost=True,
    ),
    # Chunked prefill with a long-prefill threshold, no prefix caching, two replicas, network latency.
    "chunked_replicas": Scenario(
        "a100-80gb",
        "qwen2.5-7b",
        "--max-num-batched-tokens 512 --long-prefill-token-threshold 128 --no-enable-prefix-caching",
        WorkloadConfig(input_len=1200, output_len=80, range_ratio=0.7, seed=13),
        ArrivalConfig(request_rate=12.0),
        300,
        replicas=2,
        router="least-loaded",
        network_latency=0.002,
    ),
    # Chunked prefill off (whole prompts only), synchronous, bursty arrivals.
    "no_chunking_sync": Scenario(
        "l40s",
        "qwen2.5-7b",
        "--no-enable-chunked-prefill --no-async-scheduling --max-num-seqs 32",
        WorkloadConfig(input_len=700, output_len=100, range_ratio=0.9, seed=17),
        ArrivalConfig(request_rate=8.0, burstiness=0.3),
        250,
    ),
    # A burst of short requests all at once: the API server is the limit.
    "burst_short": Scenario(
        "h100-sxm",
        "llama-3.1-8b",
        "",
        WorkloadConfig(input_len=128, output_len=4, seed=23),
        ArrivalConfig(),
        400,
    ),
    # A burst of 1,000 chat-like streams: steps of more than 128 outputs, which vLLM's API server handles in slices.
    "wide_burst_sliced": Scenario(
        "h100-sxm",
        "llama-3.1-8b",
        "",
        WorkloadConfig(input_len=64, output_len=64, range_ratio=0.5, seed=29),
        ArrivalConfig(),
        1000,
    ),
    # TP=4 on the datasheet roofline, two API servers, chunked streaming.
    "tp2_datasheet_api_servers": Scenario(
        "h100-sxm",
        "llama-3.1-70b",
        "--api-server-count 2 --stream-interval 3",
        WorkloadConfig(input_len=900, output_len=160, range_ratio=0.5, seed=19),
        ArrivalConfig(request_rate=6.0),
        200,
        tensor_parallel_size=4,
        datasheet=True,
    ),
}


def _target(s: Scenario) -> SimTarget:
    dep: Deployment = build_deployment(
        s.gpu,
        s.model,
        s.engine_args,
        replicas=s.replicas,
        router=s.router,
        tensor_parallel_size=s.tensor_parallel_size,
    )
    if not s.frontend:
        dep = Deployment.build(
            dep.hardware,
            dep.model,
            dep.requested,
            coefficients=dep.coefficients,
            router=dep.router,
            performance_mode=dep.performance_mode,
            api=ApiServerCosts(),
        )
    cost = RooflineCostModel(dep.hardware, dep.model, dep.config, dep.coefficients, kernels=not s.datasheet)
    cost_model: CostModel = _BatchOnly(cost) if s.batch_only_cost else cost
    return SimTarget(
        dep.config,
        dep.memory.num_blocks,
        cost_model,
        router=dep.router,
        scrape_interval=0.5,
        network_latency=s.network_latency,
        api=dep.api,
        cpu_costs=dep.coefficients,
    )


def _plan(s: Scenario) -> LoadPlan:
    plan = build_plan(s.workload, s.arrival, Amount(num_prompts=s.requests))
    specs = list(plan.requests)
    if s.priorities:
        for spec in specs:
            spec.priority = (spec.index * 7) % 3
    plan.requests = specs
    return plan


def digest(name: str) -> tuple[str, int, int, int]:
    """sha256 over the scenario's records, timeline and client stats, then what shows the scenario covers its
    case: engine steps, preemptions and prefix-cache hit tokens."""
    s = SCENARIOS[name]
    sink = MemorySink()
    samples: list[TimelineSample] = []
    run = _target(s).run(_plan(s), sink, samples.append)
    h = hashlib.sha256()
    for rec in sink.records:
        h.update(rec.to_json().encode())
    for sample in samples:
        h.update(sample.to_json().encode())
    h.update(json.dumps([run.duration, run.client_stats]).encode())
    last = samples[-1].values
    return h.hexdigest(), run.client_stats["engine_steps"], int(last[tl.PREEMPTIONS]), int(last[tl.PREFIX_HITS])


GOLDEN: dict[str, tuple[str, int, int, int]] = {
    "burst_short": ("fb514ba52c5a7e5b1c615e0e7739f5844fe110795581b818628541018ce0dec7", 139, 0, 0),
    "chunked_replicas": ("cf774361ede87b645f8fc538a6cc3fa7cfda6e8cdc0438d39cab8da64a76f29e", 3144, 0, 0),
    "multiturn_closed_loop": ("03647e0be96a6e037bbb07055aaee20a3a4e4d26f41a957c950d08105fb68bbe", 1995, 0, 190192),
    "no_chunking_sync": ("2296e2b83ac92778517fa357168be5a2532768af2fb98b1ffdce5c17656915e0", 959, 0, 0),
    "overload_async_frontend": ("81b8489c40624a3cf0bf8120cafd74648ae10a10b8fe9c0157ff06a6a0ef7a9c", 575, 0, 0),
    "preempt_async_priority": ("b9f2b2ad02f1a4d224a3a1a43b50eaa0f166f5e6c0a143c836459edb4f8ba4d4", 6822, 127, 0),
    "preempt_sync_fcfs": ("4e83762a82660d9e7ecd3b934df73b63a0573c03768cb2f103180c5c0fcf4b42", 7094, 106, 0),
    "prefix_fast_forward": ("01ad8ecd4a682524a8a62f2f507f1f5a85cd2b4b9495f830f1966f4e4c6cf162", 1988, 0, 272448),
    "tp2_datasheet_api_servers": ("cdae863ffd12c76d628fd478dc706613b999df70c71cab614b6ad15a27fc3477", 1626, 0, 0),
    "wide_burst_sliced": ("ab82f283d8897a7105377fdca5ab27b4e5baf1f1d1d0924735b69d8d27c9bc57", 1162, 0, 0),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_simulator_output_is_bit_identical_to_the_golden_run(name):
    assert digest(name) == GOLDEN[name]


@pytest.mark.parametrize(
    "name", ["chunked_replicas", "overload_async_frontend", "no_chunking_sync", "wide_burst_sliced"]
)
def test_decode_fast_forward_changes_nothing_with_the_api_server_modelled(name, monkeypatch):
    """Stepping one step at a time (the reference) gives the golden digest too, API-server rounds included."""
    build = _target
    monkeypatch.setattr(sys.modules[__name__], "_target", lambda s: _one_step_at_a_time(build(s)))
    assert digest(name) == GOLDEN[name]


def _one_step_at_a_time(target: SimTarget) -> SimTarget:
    target.fast_forward = False
    return target


def test_hashing_many_prompts_at_once_gives_each_its_own_hashes():
    rng = np.random.default_rng(4)
    shared = rng.integers(0, 150_000, 64)
    prompts = [rng.integers(0, 150_000, n) for n in (0, 15, 16, 17, 1500, 3, 40)] + [
        np.concatenate([shared, rng.integers(0, 150_000, 20)]),
        shared,
        list(shared[:33]),
    ]
    for block_size in (1, 16, 32):
        many = prompt_block_hashes_many(prompts, block_size)
        assert many == [prompt_block_hashes(p, block_size) for p in prompts]
        assert many[-3][: 64 // block_size] == many[-2]  # a shared prefix still hashes alike across the batch


def test_output_block_hashes_element_wise_match_the_ranges():
    uids, positions = np.array([0, 0, 7, 123_456]), np.array([0, 5, 93, 12])
    assert output_block_hash_array(uids, positions).tolist() == [
        output_block_hashes(u, j, j + 1)[0] for u, j in zip(uids.tolist(), positions.tolist())
    ]


if __name__ == "__main__":
    for key in sorted(SCENARIOS):
        print(f"    {key!r}: {digest(key)!r},")
