"""prefix-estimate: llm-d's estimated prefix-cache router, whose only view of the caches is its own history."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from servelab.metrics import timeline as tl
from servelab.metrics.records import MemorySink
from servelab.perf.engine_config import EngineConfig
from servelab.sim.linear_cost import LinearCostModel
from servelab.sim.prefix_index import (
    BLOCK_TOKENS,
    MAX_PREFIX_BLOCKS,
    MODEL_BLOCK,
    PrefixIndex,
    estimate_block_hashes,
)
from servelab.sim.router import DEFAULT_WEIGHTS, ActiveRelease, Router, RouterPolicy, _cached_prefix
from servelab.targets.sim import SimTarget
from servelab.workload.spec import LoadPlan, RequestSpec

COST = LinearCostModel()
RNG = np.random.default_rng(7)


class _Replica:
    """A stand-in with the one attribute the router scrapes: (waiting, running, KV usage)."""

    def __init__(self, usage=0.0):
        self.load = (0, 0, usage)


def spec(index, prompt):
    return RequestSpec(index, np.asarray(prompt), 8)


def tokens(n):
    return RNG.integers(1000, 120000, n)


def test_the_lru_keeps_its_capacity_and_evicts_the_block_routed_there_longest_ago():
    index = PrefixIndex(2, capacity=3)
    index.add([1, 2, 3], 0)
    index.add([1], 0)  # routed again: to the front
    index.add([4], 0)  # over capacity: out goes 2, the oldest, not 1
    index.add([2, 9], 1)
    assert list(index.lru[0]) == [3, 1, 4]
    assert index.matched([1]) == [1, 0]
    assert index.matched([2]) == [0, 1]  # evicted from replica 0's LRU only: replica 1 still names it
    index.add([5, 6, 7], 1)
    assert len(index.lru[1]) == 3
    assert index.matched([2]) == [0, 0]
    assert index.matched([1, 3, 4]) == [3, 0]


def test_blocks_are_64_tokens_after_the_models_entry_and_the_walk_stops_at_a_block_no_replica_holds():
    prompt = tokens(BLOCK_TOKENS * 3 + 10)
    hashes = estimate_block_hashes(prompt)
    assert hashes[0] == MODEL_BLOCK and len(hashes) == 4  # the model's entry and 3 full blocks: the rest is ignored
    assert estimate_block_hashes(prompt[: BLOCK_TOKENS - 1]) == []  # under one block: nothing to match or record
    other = np.concatenate([prompt[:BLOCK_TOKENS], tokens(BLOCK_TOKENS)])
    assert estimate_block_hashes(other)[:2] == hashes[:2] and estimate_block_hashes(other)[2] != hashes[2]
    long = tokens(BLOCK_TOKENS * (MAX_PREFIX_BLOCKS + 5))
    assert len(estimate_block_hashes(long)) == MAX_PREFIX_BLOCKS + 1
    index = PrefixIndex(3)
    index.add(hashes, 0)
    index.add([hashes[0], hashes[1], hashes[3]], 1)  # a replica that lost block 2 but holds block 3
    assert index.matched(hashes) == [4, 3, 0]  # GIE's greedy walk counts block 3 for it: replica 0 held block 2


def serve_on(engine, prompt, now):
    """Run one request on one engine to its end, bypassing the router (so the router's history does not know)."""
    engine.add_request(np.asarray(prompt), 1, now)
    while engine.has_work():
        now = engine.begin_step(now)
        engine.finish_step()
    return now


def test_a_repeat_goes_where_the_router_sent_it_before_even_after_that_cache_evicted_it_and_another_holds_it():
    """The estimate's blind spots: it sends a prompt back to the replica its history names though that engine has
    evicted it, and does not see the replica that does hold it; the precise router, which reads the engines'
    caches, sends it there."""
    target = SimTarget(EngineConfig(max_num_seqs=4, max_num_batched_tokens=1024), 80, COST)
    engines = [target.make_engine(), target.make_engine()]
    prompt = tokens(512)
    estimate = Router("prefix-estimate")
    home = estimate.pick(engines, spec(0, prompt), 0.0)
    now = serve_on(engines[home], prompt, 0.0)
    estimate.finished(0)
    for _ in range(4):  # other prompts through the same engine push the first out of its 80 blocks
        now = serve_on(engines[home], tokens(512), now)
    other = 1 - home
    now = serve_on(engines[other], prompt, now)
    assert _cached_prefix(engines[home], prompt) == 0
    assert _cached_prefix(engines[other], prompt) == 512
    assert [estimate.pick(engines, spec(i, prompt), now + i) for i in (1, 2, 3)] == [home] * 3
    assert Router("prefix-aware").pick(engines, spec(4, prompt), now) == other


def test_kv_usage_decides_between_weak_matches_and_a_strong_match_outweighs_it():
    """prefix 2 x matched share against kv 1 x (1 - usage): a replica holding the whole prompt wins even full, one
    holding only its first block loses to an empty replica; with no match anywhere the emptiest wins."""
    router = Router("prefix-estimate")
    replicas = [_Replica(usage=0.9), _Replica(usage=0.0)]
    shared = tokens(BLOCK_TOKENS * 10)
    first = router.pick([_Replica(), _Replica(usage=0.5)], spec(0, shared), 0.0)
    assert first == 0  # nothing recorded yet: the emptier one
    assert router.pick(replicas, spec(1, shared), 1.0) == 0  # the whole prompt recorded there: 2 + 0.1 > 0 + 1
    weak = np.concatenate([shared[:BLOCK_TOKENS], tokens(BLOCK_TOKENS * 9)])
    assert router.pick(replicas, spec(2, weak), 2.0) == 1  # 2 x 2/11 + 0.1 < 1: the KV scorer wins


def test_the_router_sees_kv_usage_as_last_scraped_not_as_it_is():
    router = Router("prefix-estimate")
    before = [_Replica(usage=0.0), _Replica(usage=0.8)]
    after = [_Replica(usage=0.8), _Replica(usage=0.0)]
    assert router.pick(before, spec(0, tokens(8)), 0.0) == 0  # under one block: no prefix, KV decides
    assert router.pick(after, spec(1, tokens(8)), 0.01) == 0  # within the 50 ms scrape: the old usage
    assert router.pick(after, spec(2, tokens(8)), 0.1) == 1


def test_in_flight_counts_move_no_pick_as_the_benchmarks_image_ran_and_spread_ties_with_a_working_active_scorer():
    """The active-request scorer of the image the benchmark ran forgot a streamed request on its first bytes, so
    in effect it weighs 0 and a tie stays a tie, drawn at random as GIE's max-score-picker draws it; one that
    counts requests to their end (weight 1) sends the tie to the idle replica."""
    prompt = tokens(BLOCK_TOKENS * 2)
    working_weights = replace(DEFAULT_WEIGHTS[RouterPolicy.PREFIX_ESTIMATE], active_until=ActiveRelease.END)
    as_ran_picks, working_picks = set(), set()
    for seed in range(8):
        as_ran = Router("prefix-estimate", seed=seed)
        working = Router("prefix-estimate", weights=working_weights, seed=seed)
        for router in (as_ran, working):
            router.outstanding = [5, 0]
        as_ran_picks.add(as_ran.pick([_Replica(), _Replica()], spec(0, prompt), 0.0))
        working_picks.add(working.pick([_Replica(), _Replica()], spec(0, prompt), 0.0))
    assert as_ran_picks == {0, 1}
    assert working_picks == {1}


def test_on_a_chat_fleet_it_keeps_a_conversation_where_its_history_went_and_hits_more_than_round_robin():
    rng = np.random.default_rng(0)
    requests = []
    for _chat in range(48):
        history, previous = rng.integers(0, 9000, 256), None
        for _ in range(4):
            history = np.concatenate([history, rng.integers(0, 9000, 128)])
            requests.append(RequestSpec(len(requests), history, 16, depends_on=previous))
            previous = len(requests) - 1
    fleet = EngineConfig(max_num_seqs=16, max_num_batched_tokens=1024, data_parallel_size=4)
    hits = {}
    for router in ("round-robin", "prefix-estimate"):
        target = SimTarget(fleet, 2000, COST, router=router)
        sink, samples = MemorySink(), []
        target.run(LoadPlan(requests, max_concurrency=48), sink, samples.append)
        assert all(r.ok for r in sink.records)
        last = samples[-1].values
        hits[router] = last[tl.PREFIX_HITS] / last[tl.PREFIX_QUERIES]
    assert hits["prefix-estimate"] > hits["round-robin"] + 0.1, hits
