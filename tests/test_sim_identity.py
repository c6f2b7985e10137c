"""The simulator's fast path gives exactly what stepping one engine step at a time gives.

`SimTarget(fast_forward=False)` is the reference: every engine step is one
schedule() and one update(). The fast path advances steady stretches of
decode steps at once; it must change nothing a user can see: the same
records (every token time, to the last bit), the same timeline samples and
the same run statistics. Hypothesis draws small random workloads over the
three engines' schedulers, prefix sharing, KV small enough to preempt,
synchronous and async scheduling, with and without the API-server model and
over one or two replicas.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servelab.metrics import timeline as tl
from servelab.metrics.records import MemorySink, RequestRecord
from servelab.metrics.timeline import TimelineSample
from servelab.perf.vllm_cpu_costs import ApiServerCosts
from servelab.sim import hashing
from servelab.sim.block_pool import BlockPool
from servelab.sim.engines import ENGINES
from servelab.targets.deployment import Deployment, build_deployment
from servelab.targets.engine_deployment import build_engine_deployment
from servelab.sim.engine import SimEngine
from servelab.targets.sim import SimTarget, _Simulation
from servelab.workload.spec import LoadPlan, RequestSpec

_DEPLOYMENTS: dict[str, Deployment] = {}


@dataclass(frozen=True)
class Case:
    engine: str
    kv_tokens: int
    """KV capacity in tokens: a few thousand makes the schedulers preempt (retract, pause)."""
    async_scheduling: bool
    frontend: bool
    replicas: int
    max_num_seqs: int
    prefix_len: int
    """Tokens every prompt shares with the others of its group (0: none), for prefix-cache hits."""
    requests: tuple[tuple[float, int, int, int], ...]
    """(arrival gap, prompt length, output tokens, prefix group) per request."""
    max_concurrency: int | None = None
    """A closed loop: a response that reaches the client releases the next request (decode runs must stop for it)."""
    follow_ups: bool = False
    """Odd requests from the third on are a chat's next turns: each sent 10 ms after the one two before it finishes,
    its prompt that one's prompt, its reply and a new message (so an engine running that one learns its reply's
    tokens when the turn is pulled, at the release of the request between them)."""
    frozen: bool = False
    """The fast path's prompts are read-only arrays, as a diagnosis's are: their block hashes are kept by identity
    and shared by every run that sends them (it runs twice, the second from the kept hashes); the reference's are
    writable, hashed afresh."""


def _deployment(engine: str) -> Deployment:
    if engine not in _DEPLOYMENTS:
        _DEPLOYMENTS[engine] = build_engine_deployment(engine, "a100-80gb", "qwen2.5-7b")
    return _DEPLOYMENTS[engine]


def _target(case: Case, fast_forward: bool) -> SimTarget:
    dep = _deployment(case.engine)
    config = dep.config.with_(
        async_scheduling=case.async_scheduling,
        data_parallel_size=case.replicas,
        max_num_seqs=min(case.max_num_seqs, dep.config.max_num_seqs or case.max_num_seqs),
    )
    return SimTarget(
        config,
        max(2, case.kv_tokens // config.block_size),
        dep.step_cost(),
        router=dep.router,
        scrape_interval=0.05,
        api=dep.api if case.frontend else ApiServerCosts(),
        cpu_costs=dep.coefficients,
        fast_forward=fast_forward,
        scheduler_factory=dep.scheduler_factory,
    )


def _plan(case: Case, frozen: bool = False) -> LoadPlan:
    rng = np.random.default_rng(len(case.requests))
    prefixes = [rng.integers(0, 150_000, case.prefix_len) for _ in range(3)]
    specs, t = [], 0.0
    for i, (gap, prompt_len, output, group) in enumerate(case.requests):
        t += gap
        prompt = np.concatenate([prefixes[group], rng.integers(0, 150_000, prompt_len)])
        after = i - 2 if case.follow_ups and i % 2 and i > 2 else None
        if after is not None:
            before = specs[after]
            prompt = np.concatenate([before.prompt_ids, rng.integers(0, 150_000, before.max_tokens), prompt])
        prompt.flags.writeable = not frozen
        specs.append(RequestSpec(i, prompt, output, t, prefix_group=group, depends_on=after, think_time=0.01))
    return LoadPlan(specs, max_concurrency=case.max_concurrency)


def _run(case: Case, fast_forward: bool) -> tuple[list[str], list[str], object, list[int]]:
    target = _target(case, fast_forward)
    sink = MemorySink()
    samples: list[TimelineSample] = []
    run = target.run(_plan(case), sink, samples.append)
    steps = [e.num_steps for e in target.last_engines]
    return [r.to_json() for r in sink.records], [s.to_json() for s in samples], (run.duration, run.client_stats), steps


def _assert_identical(case: Case) -> tuple[TimelineSample | None, int]:
    """Both paths agree exactly; returns the reference run's last sample and how many steps the fast path skipped."""
    reference = _run(case, fast_forward=False)
    plan = _plan(case, frozen=case.frozen)
    for _ in range(2 if case.frozen else 1):
        fast_target = _target(case, fast_forward=True)
        sink = MemorySink()
        samples: list[TimelineSample] = []
        run = fast_target.run(plan, sink, samples.append)
        fast = (
            [r.to_json() for r in sink.records],
            [s.to_json() for s in samples],
            (run.duration, run.client_stats),
            [e.num_steps for e in fast_target.last_engines],
        )
        assert fast[3] == reference[3], "engine step counts differ"
        assert fast[0] == reference[0], "records differ"
        assert fast[1] == reference[1], "timeline samples differ"
        assert fast[2] == reference[2], "run statistics differ"
    skipped = sum(e.fast_forwarded_steps for e in fast_target.last_engines)
    return (samples[-1] if samples else None), skipped


requests = st.lists(
    st.tuples(
        st.sampled_from([0.0, 0.001, 0.01, 0.05, 0.3]), st.integers(1, 300), st.integers(1, 80), st.integers(0, 2)
    ),
    min_size=1,
    max_size=24,
).map(tuple)

cases = st.builds(
    Case,
    engine=st.sampled_from(ENGINES),
    kv_tokens=st.sampled_from([2_500, 6_000, 200_000]),
    async_scheduling=st.booleans(),
    frontend=st.booleans(),
    replicas=st.sampled_from([1, 1, 2]),
    max_num_seqs=st.sampled_from([4, 16, 256]),
    prefix_len=st.sampled_from([0, 0, 40, 300]),
    requests=requests,
    max_concurrency=st.sampled_from([None, None, 1, 3]),
    follow_ups=st.booleans(),
    frozen=st.booleans(),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases)
def test_fast_path_matches_step_by_step_on_random_workloads(case: Case) -> None:
    _assert_identical(case)


def _steady(engine: str, **changes: object) -> Case:
    """Twelve long decodes arriving close together: long steady stretches, with arrivals and finishes between."""
    fields = dict(
        engine=engine,
        kv_tokens=200_000,
        async_scheduling=True,
        frontend=True,
        replicas=1,
        max_num_seqs=256,
        prefix_len=0,
        requests=tuple((0.02, 100 + 10 * i, 60 + 7 * i, i % 3) for i in range(12)),
    )
    fields.update(changes)
    return Case(**fields)  # type: ignore[arg-type]


def test_the_fast_path_is_taken_and_agrees_on_vllm_sync_and_async() -> None:
    for async_scheduling in (False, True):
        for frontend in (False, True):
            _, skipped = _assert_identical(_steady("vllm", async_scheduling=async_scheduling, frontend=frontend))
            assert skipped > 100  # most of the ~800 decode steps went through the fast path


def test_preemption_and_prefix_hits_happen_and_agree() -> None:
    """KV for about two of the requests at once: vLLM preempts by recompute; shared prefixes hit the cache."""
    case = _steady("vllm", kv_tokens=1_200, prefix_len=300, async_scheduling=False, frontend=False)
    last, skipped = _assert_identical(case)
    assert last is not None and last.values[tl.PREEMPTIONS] > 0 and last.values[tl.PREFIX_HITS] > 0
    assert skipped > 0


def test_read_only_prompts_and_quoted_replies_are_hashed_once_and_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chat's read-only prompts (a diagnosis's): each prompt's hashes are computed in the first run only (a turn
    that quotes its reply is hashed as the next turn's prompt), and both runs give the writable prompts' results."""
    hashed: list[int] = []
    fresh = hashing.prompt_block_hashes_many

    def counted(prompts: list[np.ndarray], block_size: int) -> list[list[int]]:
        hashed.append(len(prompts))
        return fresh(prompts, block_size)

    monkeypatch.setattr(hashing, "prompt_block_hashes_many", counted)
    monkeypatch.setattr(hashing, "_FROZEN", {})
    case = _steady("vllm", kv_tokens=1_200, prefix_len=300, follow_ups=True, frozen=True)
    last, _ = _assert_identical(case)
    assert last is not None and last.values[tl.PREFIX_HITS] > 0
    assert 0 < sum(hashed) <= len(case.requests)  # once per prompt, all in the first run
    assert len(hashing._FROZEN) == sum(hashed)


def test_sglang_and_trtllm_agree_under_kv_pressure() -> None:
    for engine in ("sglang", "trtllm"):
        last, _ = _assert_identical(_steady(engine, kv_tokens=1_500, prefix_len=40))
        assert last is not None


def _walk(pool: BlockPool, hashes: list[int], max_blocks: int) -> list[int]:
    """The prefix lookup block by block, as vLLM walks its chain: a hit while the index holds the hash and the
    block still carries it."""
    found = []
    for h in hashes[:max_blocks]:
        b = pool._hash_to_block.get(h)
        if b is None or pool.block_hash[b] != h:
            break
        found.append(b)
    return found


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 6), st.integers(0, 5), st.booleans()), min_size=1, max_size=30), st.integers(0, 8)
)
def test_the_vectorised_prefix_lookup_finds_what_the_block_walk_finds(
    ops: list[tuple[int, int, bool]], limit: int
) -> None:
    """BlockPool.lookup checks a hit's blocks in one numpy pass: the same blocks as the walk, with stale index
    entries (evicted blocks), hashes cached twice, misses in the middle and limits."""
    pool = BlockPool(24, enable_caching=True)
    held: list[list[int]] = []
    for size, group, release in ops:
        if pool.num_free >= size:
            blocks = pool.allocate(size)
            pool.cache(blocks, [1000 * group + j for j in range(1, size + 1)])  # chains of one group share a start
            held.append(blocks)
        if release and held:
            pool.free(held.pop(0)[::-1])
        for g in range(6):
            chain = [1000 * g + j for j in range(1, 8)]
            assert pool.lookup(chain, limit) == _walk(pool, chain, limit)
            gapped = chain[:2] + [999_999] + chain[3:]
            assert pool.lookup(gapped, limit) == _walk(pool, gapped, limit)


def test_rounds_wait_for_a_backlog_at_the_api_server() -> None:
    """Steps shorter than an intake (AWQ weights): a step's round comes due while the API server has requests to
    take in, so it waits its turn (SimTarget._round), also inside a decode run that goes on past the intakes."""
    deployment = build_deployment("a100-80gb", "qwen2.5-7b", "--quantization awq")
    rng = np.random.default_rng(0)
    arrivals = np.cumsum(rng.exponential(1 / 40, 40))
    specs = [RequestSpec(i, rng.integers(0, 150_000, 300), 40, float(arrivals[i])) for i in range(40)]
    runs = []
    for fast_forward in (False, True):
        target = deployment.sim_target()
        target.fast_forward = fast_forward
        sink = MemorySink()
        samples: list[TimelineSample] = []
        run = target.run(LoadPlan(specs), sink, samples.append)
        runs.append(([r.to_json() for r in sink.records], [s.to_json() for s in samples], run.client_stats))
    assert runs[1] == runs[0]
    assert target.last_engines[0].fast_forwarded_steps > 0


def test_a_response_that_is_only_recorded_does_not_stop_a_decode_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """In an open loop a response's delivery changes nothing but the records, so it waits outside the events that
    bound a decode run (`_Simulation.deliveries`): fewer steps begun one call at a time than with it among them,
    and the same results."""
    case = _steady("vllm", requests=tuple((0.05, 100 + 10 * i, 40 + 3 * i, 0) for i in range(16)))
    begun: list[SimEngine] = []
    begin_step = SimEngine.begin_step

    def counted(engine: SimEngine, now: float, horizon: float = float("inf")) -> float:
        begun.append(engine)
        return begin_step(engine, now, horizon)

    def begins_and_records() -> tuple[int, list[str]]:
        begun.clear()
        sink = MemorySink()
        _target(case, fast_forward=True).run(_plan(case), sink)
        return len(begun), [r.to_json() for r in sink.records]

    monkeypatch.setattr(SimEngine, "begin_step", counted)
    apart = begins_and_records()
    push_delivery = _Simulation._push_delivery

    def among_events(sim: _Simulation, rec: RequestRecord) -> None:
        sim.inert_deliveries = False
        push_delivery(sim, rec)

    monkeypatch.setattr(_Simulation, "_push_delivery", among_events)
    among = begins_and_records()
    assert apart[1] == among[1]
    assert apart[0] < among[0]
