"""TensorRT-LLM's capacity and micro-batch schedulers against schedules worked out by hand (sim/trtllm_scheduler.py)."""

from __future__ import annotations

import numpy as np

from servelab.perf.engine_config import EngineConfig
from servelab.perf.trtllm_args import GUARANTEED_NO_EVICT, MAX_UTILIZATION, TRTLLMSettings
from servelab.sim.block_pool import BlockPool
from servelab.sim.request import SimRequest
from servelab.sim.trtllm_scheduler import TRTLLMScheduler


def make(
    blocks: int,
    *,
    policy: str = GUARANTEED_NO_EVICT,
    max_num_tokens: int = 64,
    chunked: bool = False,
    reuse: bool = True,
) -> TRTLLMScheduler:
    settings = TRTLLMSettings(
        max_num_tokens=max_num_tokens,
        tokens_per_block=4,
        capacity_scheduler_policy=policy,
        enable_chunked_prefill=chunked,
        enable_block_reuse=reuse,
    )
    return TRTLLMScheduler(EngineConfig(block_size=4), settings, BlockPool(blocks, reuse))


def req(uid: int, ids: list[int], max_tokens: int) -> SimRequest:
    return SimRequest(uid, np.array(ids), len(ids), max_tokens, 0.0)


def step(s: TRTLLMScheduler, n: int) -> tuple[list[int], list[int]]:
    granted, before = s.schedule(0.0)
    s.update(n)
    return granted.tolist(), before.tolist()


def run_out(s: TRTLLMScheduler, start: int = 0, limit: int = 500) -> int:
    n = start
    while s.has_work() and n < limit:
        step(s, n)
        n += 1
    return n


def three(s: TRTLLMScheduler) -> list[SimRequest]:
    reqs = [req(i, list(range(10 * i, 10 * i + 8)), 8) for i in range(3)]
    for r in reqs:
        s.add(r)
    return reqs


def test_guaranteed_no_evict_reserves_whole_lengths_and_never_pauses():
    s = make(9, policy=GUARANTEED_NO_EVICT)  # 8 usable blocks of 4 tokens; each request needs 4 blocks to finish
    a, b, c = three(s)
    assert step(s, 0) == ([8, 8], [0, 0])  # A and B reserve 8 blocks: C waits
    assert [r.uid for r in s.running] == [0, 1] and list(s.waiting) == [c]
    run_out(s, 1)
    assert s.num_preemptions == 0 and c.finish_step is not None and c.schedule_time is not None


def test_max_utilization_admits_on_prompt_blocks_and_pauses_the_latest():
    s = make(9, policy=MAX_UTILIZATION)
    a, b, c = three(s)
    assert step(s, 0) == ([8, 8, 8], [0, 0, 0])  # 2 prompt blocks each: all three fit now
    # Step 1 needs a 3rd block for each of the three (tokens 9): 2 free, so C, the latest started, is paused.
    assert step(s, 1) == ([1, 1], [8, 8])
    assert s.num_preemptions == 1 and list(s.waiting) == [c] and c.num_computed_tokens == 0 and c.num_tokens == 9
    run_out(s, 2)
    assert all(r.finish_step is not None for r in (a, b, c))


def test_in_flight_batch_mixes_generation_and_context_within_max_num_tokens():
    s = make(64, max_num_tokens=10)
    s.add(req(0, list(range(8)), 4))
    s.add(req(1, list(range(20, 28)), 4))
    assert step(s, 0) == ([8], [0])  # B's 8 do not fit the 2 tokens left, and without chunked context it waits
    assert step(s, 1) == ([1, 8], [8, 0])  # A generates, B's context joins the same iteration
    chunked = make(64, max_num_tokens=12, chunked=True)
    chunked.add(req(0, list(range(8)), 4))
    chunked.add(req(1, list(range(20, 28)), 4))
    assert step(chunked, 0) == ([8, 4], [0, 0])  # chunked context: B takes the 4 left (a multiple of the block size)


def test_kv_block_reuse_hits_whole_blocks_of_a_shared_prefix():
    s = make(64)
    s.add(req(0, list(range(1, 13)), 1))  # 3 full blocks, registered once computed
    step(s, 0)
    s.add(req(1, list(range(1, 9)) + [50, 51, 52, 53], 1))
    assert step(s, 1) == ([4], [8])
    assert (s.prefix.queries, s.prefix.hits) == (24, 8)
    s.pool.check()
