"""SimTarget releases requests by the HttpTarget rules and emits the same records and timeline."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from servelab.perf.vllm_cpu_costs import ApiServerCosts
from servelab.metrics import timeline as tl
from servelab.metrics.intervals import Limit, classify_limit
from servelab.metrics.records import MemorySink
from servelab.metrics.summary import summarize
from servelab.perf.engine_config import EngineConfig
from servelab.perf.trtllm_args import TRTLLMSettings
from servelab.sim.engine import SimEngine
from servelab.sim.engines import trtllm_factory
from servelab.sim.linear_cost import LinearCostModel
from servelab.targets.errors import TargetError
from servelab.targets.sim import SimTarget
from servelab.workload.spec import LoadPlan, RequestSpec
from support.overlap import most_open_at_once

COST = LinearCostModel()
CONFIG = EngineConfig(max_num_seqs=32, max_num_batched_tokens=1024)


def specs(n, prompt_len=200, out=16, rate=None, seed=0):
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, n)) if rate else np.zeros(n)
    return [RequestSpec(i, rng.integers(0, 9000, prompt_len, dtype=np.int32), out, float(t[i])) for i in range(n)]


def run(target, plan):
    sink = MemorySink()
    samples = []
    result = target.run(plan, sink, samples.append)
    return sink.records, samples, result


def test_records_carry_every_token_and_the_engine_view():
    records, _, result = run(SimTarget(CONFIG, 2000, COST), LoadPlan(specs(20, rate=5)))
    assert len(records) == 20 and all(r.ok for r in records)
    for r in records:
        assert r.output_tokens == 16 == len(r.chunk_times)
        assert r.first_token_time == r.chunk_times[0] and r.finish_time == r.chunk_times[-1]
        assert r.chunk_times == sorted(r.chunk_times)
        assert r.send_time == r.intended_time <= r.schedule_time < r.first_token_time
        assert r.prompt_tokens == 200
    assert result.duration == pytest.approx(max(r.finish_time for r in records) - min(r.send_time for r in records))
    assert result.server_info["simulated"] and result.client_stats["engine_steps"] > 0


def test_closed_loop_concurrency_is_respected_and_slots_are_reused_at_once():
    records, _, _ = run(SimTarget(CONFIG, 2000, COST), LoadPlan(specs(40), max_concurrency=4))
    assert most_open_at_once((r.send_time, r.finish_time) for r in records) == 4
    by_index = sorted(records, key=lambda r: r.index)
    assert [r.send_time for r in by_index[:4]] == [0.0] * 4
    finishes = sorted(r.finish_time for r in records)
    assert by_index[4].send_time == finishes[0]  # the fifth goes the moment a slot frees


def test_open_loop_sends_on_schedule_and_a_cap_delays_it():
    plan_specs = specs(30, rate=50)
    free, _, _ = run(SimTarget(CONFIG, 2000, COST), LoadPlan(plan_specs))
    assert all(r.send_time == plan_specs[r.index].arrival_time for r in free)
    capped, _, _ = run(SimTarget(CONFIG, 2000, COST), LoadPlan(plan_specs, max_concurrency=2))
    assert most_open_at_once((r.send_time, r.finish_time) for r in capped) <= 2
    assert all(r.send_time >= plan_specs[r.index].arrival_time for r in capped)
    assert any(r.send_time > plan_specs[r.index].arrival_time for r in capped)


def test_nothing_is_sent_at_or_after_the_duration():
    plan_specs = specs(200, rate=20)
    records, _, _ = run(SimTarget(CONFIG, 2000, COST), LoadPlan(iter(plan_specs), duration=3.0))
    assert records and max(r.send_time for r in records) < 3.0
    assert len(records) == sum(1 for s in plan_specs if s.arrival_time < 3.0)


def test_a_follow_up_turn_waits_for_its_predecessor_and_the_think_time():
    base = specs(3)
    turns = [base[0], dataclasses.replace(base[1], depends_on=0, think_time=0.5), base[2]]
    records, _, _ = run(SimTarget(CONFIG, 2000, COST), LoadPlan(turns, max_concurrency=2))
    by = {r.index: r for r in records}
    assert by[1].send_time == pytest.approx(by[0].finish_time + 0.5)
    assert by[2].send_time == 0.0  # the independent request is not held up by the waiting turn
    bad = [dataclasses.replace(base[0], depends_on=2)]
    with pytest.raises(TargetError, match="depends on request 2"):
        run(SimTarget(CONFIG, 2000, COST), LoadPlan(bad))


def test_runs_are_deterministic_and_fast_forward_changes_nothing():
    plan = LoadPlan(specs(120, rate=30, seed=3), max_concurrency=24)
    a, sa, _ = run(SimTarget(CONFIG, 700, COST), plan)
    b, sb, _ = run(SimTarget(CONFIG, 700, COST), plan)
    assert [r.to_json() for r in a] == [r.to_json() for r in b]
    assert [s.to_json() for s in sa] == [s.to_json() for s in sb]

    class StepByStep(SimTarget):
        def make_engine(self) -> SimEngine:
            return SimEngine(self.config, self.num_gpu_blocks, self.cost_model, fast_forward=False)

    c, sc, _ = run(StepByStep(CONFIG, 700, COST), plan)
    key = lambda r: r.index  # noqa: E731
    assert [r.to_json() for r in sorted(a, key=key)] == [r.to_json() for r in sorted(c, key=key)]
    counters = [n for n in tl.COUNTERS if n in sa[0].values]
    assert [[s.values[n] for n in counters] for s in sa] == [[s.values[n] for n in counters] for s in sc]


def test_the_timeline_uses_vllm_names_and_adds_up():
    records, samples, _ = run(SimTarget(CONFIG, 2000, COST, scrape_interval=0.5), LoadPlan(specs(60, rate=20)))
    assert [s.t for s in samples[:4]] == [0.0, 0.5, 1.0, 1.5]
    last = samples[-1].values
    assert last[tl.GENERATION_TOKENS] == sum(r.output_tokens for r in records)
    assert last[tl.PROMPT_TOKENS] == sum(r.prompt_tokens for r in records)
    assert last[tl.TTFT_COUNT] == 60
    assert last[tl.TTFT_SUM] == pytest.approx(sum(r.ttft for r in records))
    assert max(s.values[tl.RUNNING] for s in samples) > 1
    assert all(0 <= s.values[tl.KV_USAGE] <= 1 for s in samples)
    for name in tl.COUNTERS:
        if name in last:
            seq = [s.values[name] for s in samples]
            assert seq == sorted(seq), name


def test_replicas_share_the_load_and_raise_throughput():
    plan = LoadPlan(specs(200, prompt_len=400, out=32, rate=400))
    one, _, _ = run(SimTarget(CONFIG, 2000, COST), plan)
    for router in ("round-robin", "least-loaded"):
        target = SimTarget(CONFIG.with_(data_parallel_size=2), 2000, COST, router=router)
        two, samples, _ = run(target, plan)
        steps = [e.num_steps for e in target.last_engines]
        assert min(steps) > 0.6 * max(steps)
        assert summarize(two).request_throughput > 1.5 * summarize(one).request_throughput
        assert samples[-1].values[tl.GENERATION_TOKENS] == 200 * 32


def test_network_latency_shifts_client_times():
    plan = LoadPlan(specs(5, rate=1))
    base, _, _ = run(SimTarget(CONFIG, 2000, COST), plan)
    slow, _, _ = run(SimTarget(CONFIG, 2000, COST, network_latency=0.01), plan)
    for a, b in zip(sorted(base, key=lambda r: r.index), sorted(slow, key=lambda r: r.index)):
        assert b.ttft == pytest.approx(a.ttft + 0.02)
        assert b.chunk_times[-1] - b.chunk_times[0] == pytest.approx(a.chunk_times[-1] - a.chunk_times[0])


def test_impossible_requests_get_an_error_record_like_an_http_400():
    plan = LoadPlan([*specs(2), RequestSpec(2, np.arange(600), 16)])
    records, _, _ = run(SimTarget(CONFIG, 2000, COST, max_model_len=512), plan)
    by = {r.index: r for r in records}
    assert by[0].ok and by[1].ok
    assert not by[2].ok and by[2].error_kind == "http_400" and "max_model_len" in by[2].error


def test_bad_settings_fail_before_any_load():
    with pytest.raises(TargetError, match="router"):
        SimTarget(CONFIG, 2000, COST, router="sticky")
    with pytest.raises(TargetError):
        SimTarget(CONFIG, 2000, COST, scrape_interval=0)
    with pytest.raises(TargetError):
        run(SimTarget(CONFIG, 2000, COST), LoadPlan(specs(2), max_concurrency=0))
    with pytest.raises(TargetError, match="resolved"):
        SimTarget(EngineConfig(), 2000, COST)
    with pytest.raises(TargetError, match="KV blocks"):
        SimTarget(CONFIG, 1, COST)


def frontend_gap(target, rate, n=300):
    """Mean client TTFT minus the engine's own mean TTFT (vllm:time_to_first_token_seconds), in seconds."""
    records, samples, result = run(target, LoadPlan(specs(n, rate=rate, seed=4)))
    last = samples[-1].values
    engine_ttft = last[tl.TTFT_SUM] / last[tl.TTFT_COUNT]
    return summarize(records).mean_ttft_ms / 1000 - engine_ttft, engine_ttft, result


def test_a_saturated_frontend_opens_a_gap_between_client_and_engine_ttft():
    # 10 ms + 200 x 50 us to tokenize, 50 us per streamed token: ~48 req/s on one core, below the engine's ~75.
    frontend = dict(api=ApiServerCosts(per_request_s=0.010, per_prompt_token_s=50e-6, per_output_token_s=50e-6))
    light_gap, _, _ = frontend_gap(SimTarget(CONFIG, 2000, COST, **frontend), rate=10)
    heavy_gap, heavy_engine_ttft, result = frontend_gap(SimTarget(CONFIG, 2000, COST, **frontend), rate=150)
    assert 0.020 <= light_gap < 0.05  # tokenization plus a little streaming work
    assert heavy_gap > 20 * light_gap  # requests queue before the engine
    assert heavy_engine_ttft < 0.2 * heavy_gap  # the engine itself is not the bottleneck
    assert result.client_stats["frontend_busy_s"] > 0.9 * result.duration  # the one core is saturated
    share = result.client_stats["api_server_busy_share"]
    assert share == pytest.approx(result.client_stats["frontend_busy_s"] / result.duration)
    assert classify_limit(result.client_stats) == Limit.API_SERVER  # its interval is the API server's
    no_frontend_gap, _, _ = frontend_gap(SimTarget(CONFIG, 2000, COST), rate=150)
    assert abs(no_frontend_gap) < 1e-9


def test_zero_frontend_coefficients_change_nothing_and_a_negligible_frontend_almost_nothing():
    plan = LoadPlan(specs(80, rate=20, seed=6), max_concurrency=16)
    base, base_samples, _ = run(SimTarget(CONFIG, 700, COST), plan)
    zero, zero_samples, _ = run(SimTarget(CONFIG, 700, COST, api=ApiServerCosts()), plan)
    assert [r.to_json() for r in base] == [r.to_json() for r in zero]
    assert [s.values for s in base_samples] == [s.values for s in zero_samples]
    tiny, _, _ = run(
        SimTarget(
            CONFIG,
            700,
            COST,
            api=ApiServerCosts(per_request_s=1e-12, per_prompt_token_s=1e-12, per_output_token_s=1e-12),
        ),
        plan,
    )
    by_index = {r.index: r for r in tiny}
    for r in base:
        t = by_index[r.index]
        assert t.output_tokens == r.output_tokens
        assert t.chunk_times == pytest.approx(r.chunk_times, abs=1e-6)


def test_frontend_coefficients_cannot_be_negative():
    with pytest.raises(TargetError, match="API server"):
        SimTarget(CONFIG, 700, COST, api=ApiServerCosts(per_prompt_token_s=-1e-6))


def _chunks(record):
    """How many SSE chunks a record's tokens came in (one arrival time per chunk, as a real client records)."""
    assert record.chunk_times == sorted(set(record.chunk_times))
    return len(record.chunk_times)


def test_a_frontend_that_keeps_up_sends_a_chunk_per_step_and_a_saturated_one_merges_them():
    plan = LoadPlan(specs(32, prompt_len=50, out=64), max_concurrency=32)
    engine_only, _, engine_result = run(SimTarget(CONFIG, 2000, COST), plan)
    light, _, _ = run(SimTarget(CONFIG, 2000, COST, api=ApiServerCosts(per_chunk_s=1e-6)), plan)
    assert all(_chunks(r) == r.output_tokens for r in light)
    # 32 streams x 2 ms per chunk = 64 ms a round, many steps of this engine: chunks must carry several tokens.
    heavy, _, heavy_result = run(SimTarget(CONFIG, 2000, COST, api=ApiServerCosts(per_chunk_s=2e-3)), plan)
    assert all(r.output_tokens == 64 for r in heavy)
    assert sum(_chunks(r) for r in heavy) < 0.5 * sum(r.output_tokens for r in heavy)
    # Merging keeps the frontend's cost per round, not per token: it delays tokens but cannot hold the engine back,
    # so the run lasts about the engine's time plus a round or two, far less than a chunk per token would take.
    per_token_work = 32 * 64 * 2e-3
    assert heavy_result.duration < engine_result.duration + 0.25 * per_token_work
    assert heavy_result.client_stats["frontend_busy_s"] < 0.5 * per_token_work
    assert max(r.finish_time for r in heavy) > max(r.finish_time for r in engine_only)


WIDE = EngineConfig(max_num_seqs=512, max_num_batched_tokens=16384)


def _tokens_per_chunk(streams, scheduler_factory=None):
    """A burst of `streams` requests (20 in / 32 out) behind an API server whose chunks cost 0.5 ms: at 100 streams
    a round's chunks take 50 ms, at 300 150 ms, against engine steps of ~11 and ~23 ms, so it falls behind at both."""
    api = ApiServerCosts(per_chunk_s=5e-4)
    target = SimTarget(WIDE, 20_000, COST, api=api, scheduler_factory=scheduler_factory)
    records, _, result = run(target, LoadPlan(specs(streams, prompt_len=20, out=32)))
    assert len(records) == streams and all(r.output_tokens == 32 for r in records)
    return sum(r.output_tokens for r in records) / sum(_chunks(r) for r in records), result


def test_a_lagging_api_server_merges_steps_of_up_to_128_outputs_and_sends_one_token_a_chunk_above():
    """vLLM's output handler takes queued steps back to back while each has at most 128 outputs (their tokens merge
    in the requests' collectors), but yields the loop after each slice of 128 of a wider step, so the streams send
    their one new token before the next step is taken: a step a round, ~1 token a chunk, however far behind."""
    narrow, _ = _tokens_per_chunk(100)
    wide, result = _tokens_per_chunk(300)
    assert narrow > 2
    assert wide == pytest.approx(1.0, abs=0.05)
    # Every token is its own chunk, so the server's core pays a chunk per token: 300 x 32 x 0.5 ms.
    assert result.client_stats["frontend_busy_s"] == pytest.approx(300 * 32 * 5e-4, rel=1e-6)


def test_another_engines_api_server_merges_however_wide_the_step():
    """TensorRT-LLM's (and SGLang's) servers do not slice vLLM's way: the same 300 streams get merged chunks."""
    merged, _ = _tokens_per_chunk(300, trtllm_factory(WIDE, TRTLLMSettings()))
    assert merged > 2


def test_a_wide_step_sends_each_slices_chunks_before_the_next_slice_is_processed():
    """300 one-token requests finish in one step, handled in slices of 128, 128 and 44 at 0.1 ms an output and
    0.1 ms a chunk: slice k starts after the earlier slices' outputs and chunks, and its chunks go out after its
    own outputs, so the mean send time is 35.8 ms after the step, not the 45.1 ms of all outputs first."""
    api = ApiServerCosts(per_output_token_s=1e-4, per_chunk_s=1e-4)
    target = SimTarget(WIDE, 20_000, COST, api=api)
    records, _, _ = run(target, LoadPlan(specs(300, prompt_len=20, out=1)))
    assert target.last_engines[0].num_steps == 1
    starts, sizes = np.array([0, 256e-4, 512e-4]), np.array([128, 128, 44])
    mean_send = np.dot(sizes, starts + 1e-4 * sizes + 1e-4 * (sizes + 1) / 2) / 300
    step_end = target.last_engines[0].step_ends[0]
    assert [r.first_token_time for r in records] == pytest.approx([step_end + mean_send] * 300, abs=1e-12)
    assert mean_send == pytest.approx(0.035834, abs=1e-6)


def test_a_per_step_output_cost_is_paid_for_every_step_and_can_make_the_frontend_the_bottleneck():
    plan = LoadPlan(specs(8, prompt_len=50, out=64), max_concurrency=8)
    _, _, engine_result = run(SimTarget(CONFIG, 2000, COST), plan)
    steps = engine_result.client_stats["engine_steps"]
    step = engine_result.duration / steps
    # Receiving a step's outputs costs 3 steps' time: every step is received (no merging of that part), so the one
    # core falls behind and the run lasts about 3x the engine's; the chunks it sends merge the steps it drained.
    records, _, result = run(SimTarget(CONFIG, 2000, COST, api=ApiServerCosts(per_output_step_s=3 * step)), plan)
    assert all(r.output_tokens == 64 for r in records)
    assert sum(_chunks(r) for r in records) < 0.6 * 8 * 64
    assert result.client_stats["frontend_busy_s"] == pytest.approx(3 * step * steps, rel=1e-9)
    assert result.duration > 2.5 * engine_result.duration


def test_replicas_behind_a_router_take_requests_in_on_their_own_api_servers():
    """Separate servers behind a router each run their own API servers: a router that sends every request to one
    replica leaves all the intake to that replica's one core, while vLLM's data-parallel balancer (least-loaded)
    runs inside API servers its engines share, so both cores take the requests in whichever engine serves them."""
    api = ApiServerCosts(per_request_s=0.05)
    config = CONFIG.with_(data_parallel_size=2)
    one_chat = [dataclasses.replace(s, conversation=0) for s in specs(60, prompt_len=32, out=2)]

    def served(router, config=config):
        target = SimTarget(config, 2000, COST, api=api, router=router)
        records, _, result = run(target, LoadPlan(one_chat))
        assert all(r.ok for r in records)
        return len(records) / result.duration, result.server_info["api_server_count"]

    (pinned, servers), (shared, shared_servers) = served("session"), served("least-loaded")
    assert servers == shared_servers == 2
    assert pinned == pytest.approx(1 / 0.05, rel=0.1)  # one core's intake
    assert shared == pytest.approx(2 / 0.05, rel=0.1)  # two cores'
    assert served("round-robin", config.with_(api_server_count=2))[1] == 4  # --api-server-count is each replica's
    assert served("least-loaded", config.with_(api_server_count=2))[1] == 2
