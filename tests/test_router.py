"""Routers in front of simulated replicas: each policy's rule, and that cache-aware routing matters on chat."""

from __future__ import annotations


import numpy as np
import pytest

from servelab.metrics import timeline as tl
from servelab.metrics.records import MemorySink
from servelab.perf.engine_config import EngineConfig
from servelab.sim.linear_cost import LinearCostModel
from servelab.sim.radix_cache import RadixCache
from servelab.sim import router as router_mod
from servelab.sim.router import (
    LLMD_PREFIX_LOAD_PROFILE,
    POLICIES,
    Router,
    RouterPolicy,
    ScorerWeights,
    _holders_scaled,
    _radix_prefix,
)
from servelab.targets.errors import TargetError
from servelab.targets.sim import SimTarget
from servelab.workload.spec import LoadPlan, RequestSpec

COST = LinearCostModel()
FLEET = EngineConfig(max_num_seqs=16, max_num_batched_tokens=1024, data_parallel_size=4)


def chats(conversations, turns=4, system=512, user=128, reply=32, rate=None, seed=0):
    """Conversations that share a system prompt; turn k resends the history and the replies before it."""
    rng = np.random.default_rng(seed)
    shared = rng.integers(0, 9000, system)
    starts = np.cumsum(rng.exponential(1 / rate, conversations)) if rate else np.zeros(conversations)
    out = []
    for c in range(conversations):
        history, previous = shared, None
        for _ in range(turns):
            history = np.concatenate([history, rng.integers(0, 9000, user)])
            arrival = float(starts[c]) if previous is None else 0.0
            out.append(RequestSpec(len(out), history, reply, arrival, prefix_group=c, depends_on=previous))
            previous = len(out) - 1
            history = np.concatenate([history, rng.integers(0, 9000, reply)])
    return out


def serve(router, plan):
    """(prefix-cache hit rate, mean TTFT, engines) of the plan on the fleet behind `router`."""
    target = SimTarget(FLEET, 2000, COST, router=router)
    sink, samples = MemorySink(), []
    target.run(plan, sink, samples.append)
    last = samples[-1].values
    assert all(r.ok for r in sink.records)
    return last[tl.PREFIX_HITS] / last[tl.PREFIX_QUERIES], np.mean([r.ttft for r in sink.records]), target.last_engines


def test_cache_aware_routers_hit_more_and_answer_sooner_than_round_robin_on_a_busy_chat_fleet():
    """Round-robin sends 3 turns in 4 to a replica that never saw the conversation, so it prefills the
    history again; the prefix-aware and session routers send the turn where the history is cached."""
    plan = LoadPlan(chats(96), max_concurrency=96)
    rr_hits, rr_ttft, _ = serve("round-robin", plan)
    for router in ("prefix-aware", "session"):
        hits, ttft, engines = serve(router, plan)
        assert hits > rr_hits + 0.05, router
        assert ttft < rr_ttft, router
        assert min(e.num_steps for e in engines) > 0, router


def test_random_is_as_cache_blind_as_round_robin_on_a_busy_chat_fleet():
    """A random pick sends a turn where its history is no more often than a rotating counter does; it only
    spreads the steps less evenly."""
    plan = LoadPlan(chats(96), max_concurrency=96)
    rr_hits, _, rr_engines = serve("round-robin", plan)
    hits, _, engines = serve("random", plan)
    aware_hits, _, _ = serve("prefix-aware", plan)
    assert abs(hits - rr_hits) < 0.05
    assert hits < aware_hits - 0.1
    steps = [e.num_steps for e in engines]
    assert min(steps) > 0
    assert max(steps) - min(steps) > max(e.num_steps for e in rr_engines) - min(e.num_steps for e in rr_engines)


class _Replica:
    """A stand-in with the one attribute least-loaded reads."""

    def __init__(self, waiting=0, running=0, usage=0.0):
        self.load = (waiting, running, usage)


def spec(index, prompt, depends_on=None):
    return RequestSpec(index, np.asarray(prompt), 8, depends_on=depends_on)


def test_policy_names_are_a_closed_vocabulary():
    assert set(POLICIES) == set(RouterPolicy)
    with pytest.raises(ValueError, match="prefix-hash"):
        Router("sticky")
    with pytest.raises(TargetError, match="router"):
        SimTarget(FLEET, 2000, COST, router="sticky")


def test_random_draws_uniformly_with_its_own_seed_so_its_counts_drift_apart_where_round_robins_do_not():
    """A Kubernetes Service picks a pod at random: over 800 requests to 8 replicas the counts spread by chance
    (binomial, sd ~9.4 around 100), where round-robin's are exactly 100 each."""
    replicas = [_Replica() for _ in range(8)]
    counts = {}
    for name, seed in (("random", 0), ("random again", 0), ("random other seed", 1), ("round-robin", 0)):
        router = Router(name.split(" ")[0], seed=seed)
        counts[name] = np.bincount([router.pick(replicas, spec(i, [i]), 0.0) for i in range(800)], minlength=8)
    assert counts["round-robin"].tolist() == [100] * 8
    assert counts["random"].tolist() == counts["random again"].tolist()  # reproducible
    assert counts["random"].tolist() != counts["random other seed"].tolist()
    for name in ("random", "random other seed"):
        assert counts[name].min() > 60 and counts[name].max() < 140, counts[name]  # every replica used, ~uniform
        assert counts[name].max() - counts[name].min() > 5, counts[name]  # but not balanced like a counter


def test_least_outstanding_counts_only_its_own_unfinished_requests():
    router, replicas = Router("least-outstanding"), [_Replica(waiting=50), _Replica(), _Replica()]
    picks = [router.pick(replicas, spec(i, [1, 2, 3]), 0.0) for i in range(3)]
    assert sorted(picks) == [0, 1, 2]  # the replicas' queues are not its view: its own counts are
    router.finished(1)
    assert router.pick(replicas, spec(3, [1]), 0.0) == picks[1]


def test_session_keeps_a_conversation_on_the_replica_of_its_first_turn():
    router, replicas = Router("session"), [_Replica() for _ in range(4)]
    first = [router.pick(replicas, spec(i, [i]), 0.0) for i in range(4)]
    assert sorted(first) == [0, 1, 2, 3]
    for turn in range(4, 12):  # each conversation's next turns, one after another
        parent = turn - 4
        assert router.pick(replicas, spec(turn, [turn], depends_on=parent), 0.0) == first[turn % 4]


def test_prefix_hash_keeps_a_key_on_one_replica_until_the_load_bound_and_then_spills_along_the_ring():
    router, replicas = Router("prefix-hash"), [_Replica() for _ in range(4)]
    same_key = [router.pick(replicas, spec(i, [7] * 40 + [i]), 0.0) for i in range(6)]
    home = same_key[0]
    # KubeAI's bound, in flight + 1 <= 1.25 x (total + 1) / 4, admits no replica until 3 are in flight (then the
    # first on the ring, the owner, takes it); the 4th finds the owner over the bound and spills.
    assert same_key[:3] == [home] * 3
    assert same_key[3] != home
    for i in range(6):
        router.finished(i)
    assert router.pick(replicas, spec(9, [7] * 40 + [99]), 0.0) == home  # the tokens after the key do not count
    keys = {router.pick(replicas, spec(10 + k, [k] * 40), 0.0) for k in range(40)}
    assert len(keys) == 4  # different prompts spread over the ring


def test_llm_d_scorers_without_the_active_request_scorer_pile_a_shared_prompt_onto_one_replica(monkeypatch):
    """llm-d PR #669: with the precise guide's weights alone, the replica that cached the system prompt wins
    every request until queues form; the active-request scorer lets others warm up. (The router's own time is left
    out: on these fast replicas a millisecond more per request decides whether two requests overlap at all.)"""
    plan = LoadPlan(chats(40, rate=10.0))
    monkeypatch.setattr(router_mod, "ROUTER_COSTS", {})
    used = {}
    for name, weights in (("guide", ScorerWeights(active=0.0)), ("with active", ScorerWeights())):
        target = SimTarget(FLEET, 2000, COST, router="prefix-aware", router_weights=weights)
        target.run(plan, MemorySink())
        used[name] = sum(e.num_steps > 0 for e in target.last_engines)
    assert used["guide"] == 1
    assert used["with active"] > 1


def test_llm_d_scales_the_precise_prefix_score_over_the_replicas_that_hold_the_prompt_alone():
    """llm-d-kv-cache-manager v0.2.1 scores only the pods holding the prompt's first block; the scheduler (b9c56d36,
    indexedScoresToNormalizedScoredPods) min-max scales over those and gives the rest 0."""
    assert _holders_scaled([0, 8000, 9000, 0]) == [0.0, 0.0, 1.0, 0.0]  # the lesser holder scores as no holder
    assert _holders_scaled([0, 8000, 8500, 9000]) == [0.0, 0.0, 0.5, 1.0]
    assert _holders_scaled([0, 8000, 8000, 0]) == [0.0, 1.0, 1.0, 0.0]  # holders alike: all 1
    assert _holders_scaled([0, 64, 0, 0]) == [0.0, 1.0, 0.0, 0.0]  # one holder: 1, however little it holds
    assert _holders_scaled([0, 0, 0, 0]) == [0.0] * 4


def test_the_fuller_holder_wins_even_with_a_fuller_kv_cache_as_llm_d_scores_it(monkeypatch):
    """Prefix 2, KV usage 1: the replica holding all of the prompt beats one holding its system prompt, whose
    prefix score is 0 (scaled over all four replicas it would be 0.89 and its emptier KV cache would win)."""
    held = {0: 0, 1: 8000, 2: 9000, 3: 0}
    replicas = [_Replica(usage=0.0), _Replica(usage=0.0), _Replica(usage=0.9), _Replica(usage=0.0)]
    monkeypatch.setattr(router_mod, "_cached_prefix", lambda engine, ids: held[replicas.index(engine)])
    router = Router("prefix-aware", weights=LLMD_PREFIX_LOAD_PROFILE)
    assert router.pick(replicas, spec(0, np.arange(9000)), 0.0) == 2


def test_the_prefix_view_of_sglangs_tree_matches_its_own_lookup_without_changing_it():
    cache = RadixCache(10_000)
    for ids in ([1, 2, 3, 4, 5], [1, 2, 9, 9], [7, 7, 7]):
        cache.insert(ids)
    for probe in ([1, 2, 3, 4, 5, 6], [1, 2, 3, 8], [1, 2], [7, 7, 7, 7], [5]):
        before = _shape(cache.root)
        seen = _radix_prefix(cache, np.asarray(probe))
        assert _shape(cache.root) == before, probe  # no edge split, no access time touched
        assert seen == cache.match(probe, len(probe))[0], probe


def _shape(node):
    return node.key, node.last_access, sorted(_shape(child) for child in node.children.values())


def test_the_llm_d_scorer_pays_for_tokenizing_a_prompt_unless_its_tokenization_cache_holds_most_of_it():
    """Every request pays the endpoint picker's scheduling; a prompt is tokenized (and paid per token) unless
    the scorer's cache already holds 80% of it from its start, as llm-d-kv-cache-manager's prefix store does."""
    rng = np.random.default_rng(0)
    system, first, second = rng.integers(0, 9000, 8000), rng.integers(0, 9000, 1000), rng.integers(0, 9000, 1000)
    router = Router("prefix-aware")
    fixed, per_token = router_mod.EPP_SCHEDULING_S, router_mod.TOKENIZE_PER_TOKEN_S
    prompt = np.concatenate([system, first])
    assert router.own_time(RequestSpec(0, prompt, 8)) == pytest.approx(fixed + per_token * 9000)
    assert router.own_time(RequestSpec(1, prompt, 8)) == pytest.approx(fixed)  # the whole prompt is held
    assert router.own_time(RequestSpec(2, np.concatenate([system, second]), 8)) == pytest.approx(fixed)  # 89%
    half = np.concatenate([system[:4500], rng.integers(0, 9000, 4500)])
    assert router.own_time(RequestSpec(3, half, 8)) == pytest.approx(fixed + per_token * 9000)
    spent = router.time_spent()
    assert (spent.requests, spent.tokenized_share) == (4, 0.5)
    assert spent.mean_s == pytest.approx(fixed + per_token * 9000 / 2)


def test_routers_with_no_published_cost_take_no_time_of_their_own():
    prompt = np.arange(4000)
    for policy in POLICIES:
        if policy != RouterPolicy.PREFIX_AWARE:
            assert Router(policy).own_time(RequestSpec(0, prompt, 8)) == 0.0, policy


def test_a_request_reaches_its_replica_after_the_router_s_own_time_and_run_json_records_it(monkeypatch):
    """One request on an idle fleet: its first token comes the router's own time later than behind a router that
    costs nothing, and run.json's server_info says what the router spent."""
    spec = RequestSpec(0, np.arange(3000), 4)

    def first_token(costs):
        monkeypatch.setattr(router_mod, "ROUTER_COSTS", costs)
        sink = MemorySink()
        run = SimTarget(FLEET, 2000, COST, router="prefix-aware").run(LoadPlan([spec]), sink)
        return sink.records[0].ttft, run.server_info.get("router_time")

    free, none_recorded = first_token({})
    cost = router_mod.RouterCost(fixed_s=0.002, per_tokenized_token_s=1e-6)
    paid, recorded = first_token({RouterPolicy.PREFIX_AWARE: cost})
    assert none_recorded is None
    assert paid - free == pytest.approx(0.002 + 3000e-6)
    assert recorded["requests"] == 1 and recorded["mean_s"] == pytest.approx(0.005)
