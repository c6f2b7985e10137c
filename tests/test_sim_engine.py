"""The simulated engine behaves like vLLM qualitatively, and its bookkeeping is exact."""

from __future__ import annotations

import numpy as np
import pytest

from servelab.metrics.records import MemorySink
from servelab.metrics.summary import summarize
from servelab.perf.cost_model import CostCoefficients
from servelab.perf.engine_config import EngineConfig
from servelab.perf.hardware import get_gpu
from servelab.perf.models import get_model
from servelab.sim.engine import SimEngine
from servelab.sim.linear_cost import LinearCostModel
from servelab.targets.deployment import Deployment
from servelab.targets.sim import SimTarget
from servelab.workload.spec import LoadPlan, RequestSpec

COST = LinearCostModel(overhead=0.005, per_token=60e-6, per_context_token=5e-9)
CONFIG = EngineConfig(max_num_seqs=64, max_num_batched_tokens=2048)


def specs(n, prompt_len=256, out=32, rate=None, seed=0, shared_prefix=0, priority=None):
    rng = np.random.default_rng(seed)
    prefix = rng.integers(0, 50_000, shared_prefix, dtype=np.int32)
    t = np.cumsum(rng.exponential(1 / rate, n)) if rate else np.zeros(n)
    out_specs = []
    for i in range(n):
        ids = np.concatenate([prefix, rng.integers(0, 50_000, prompt_len - shared_prefix, dtype=np.int32)])
        out_specs.append(
            RequestSpec(
                i,
                ids,
                out,
                float(t[i]),
                priority=priority[i] if priority else 0,
                prefix_group=0 if shared_prefix else None,
                prefix_len=shared_prefix,
            )
        )
    return out_specs


def run(target, plan):
    sink = MemorySink()
    samples = []
    result = target.run(plan, sink, samples.append)
    return sink.records, samples, result


def test_throughput_rises_with_load_and_saturates():
    target = SimTarget(CONFIG, 20_000, COST)
    rates = [2, 8, 32, 128, 512]
    thr = []
    for rate in rates:
        records, _, _ = run(target, LoadPlan(specs(300, 512, 64, rate=rate)))
        thr.append(summarize(records).request_throughput)
    assert thr[1] > 3 * thr[0] and thr[2] > 3 * thr[1]  # below capacity: served as offered
    assert thr[4] < 1.15 * thr[3]  # past capacity: flat
    assert thr[4] < 0.5 * rates[4]


def test_long_prompts_cut_request_throughput_several_fold():
    target = Deployment.build(get_gpu("a100-80gb"), get_model("qwen2.5-7b"), EngineConfig()).sim_target()
    short, _, _ = run(target, LoadPlan(specs(256, 128, 64), max_concurrency=128))
    long, _, _ = run(target, LoadPlan(specs(256, 1500, 64), max_concurrency=128))
    ratio = summarize(short).request_throughput / summarize(long).request_throughput
    assert ratio > 3


def test_too_few_sequences_make_ttft_grow_by_queueing():
    plan = LoadPlan(specs(200, 256, 64, rate=40))
    roomy, _, _ = run(SimTarget(CONFIG, 20_000, COST), plan)
    tight, _, _ = run(SimTarget(CONFIG.with_(max_num_seqs=2), 20_000, COST), plan)
    assert summarize(tight).mean_ttft_ms > 5 * summarize(roomy).mean_ttft_ms
    assert max(r.schedule_time - r.send_time for r in tight) > 1.0


def test_a_small_kv_cache_preempts_and_still_finishes_everything():
    target = SimTarget(CONFIG, 200, COST)  # 199 usable blocks = 3184 tokens for 64 x 288-token requests
    records, samples, _ = run(target, LoadPlan(specs(64, 256, 32)))
    assert len(records) == 64 and all(r.ok and r.output_tokens == 32 for r in records)
    assert sum(r.preemptions for r in records) > 0
    assert samples[-1].values["vllm:num_preemptions_total"] == sum(r.preemptions for r in records)
    pool = target.last_engines[0].pool
    pool.check()
    assert pool.num_free == pool.num_blocks - 1


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_preemption_picks_the_request_vllm_picks(policy):
    # Three 32-token prompts growing to 72 tokens in 9 usable blocks: decoding must preempt.
    engine = SimEngine(CONFIG.with_(scheduling_policy=policy), 10, COST)
    a = engine.add_request(np.arange(0, 32), 40, 0.0, priority=1)
    b = engine.add_request(np.arange(100, 132), 40, 0.0, priority=0)
    c = engine.add_request(np.arange(200, 232), 40, 0.0, priority=1)
    t = 0.0
    while engine.has_work():
        t = engine.begin_step(t)
        engine.finish_step()
    assert engine.scheduler.num_preemptions >= 2
    if policy == "fcfs":  # the last of the running queue goes; the first admitted never does
        assert a.preemptions == 0 and c.preemptions > 0
    else:  # the least important (highest value), latest first; the important one never
        assert b.preemptions == 0 and a.preemptions > 0 and c.preemptions > 0
        assert b.finish_step < min(a.finish_step, c.finish_step)
    assert all(r.num_output_tokens == 40 for r in (a, b, c))


def test_priority_policy_serves_the_most_important_first():
    prio = [5, 3, 9, 0, 7, 1]
    plan = LoadPlan(specs(6, 64, 4, priority=prio))
    records, _, _ = run(SimTarget(CONFIG.with_(max_num_seqs=1, scheduling_policy="priority"), 1000, COST), plan)
    by_start = [r.priority for r in sorted(records, key=lambda r: r.schedule_time)]
    assert by_start == sorted(prio)
    fcfs, _, _ = run(SimTarget(CONFIG.with_(max_num_seqs=1), 1000, COST), plan)
    assert [r.index for r in sorted(fcfs, key=lambda r: r.schedule_time)] == list(range(6))


def test_a_shared_system_prompt_is_served_from_the_prefix_cache():
    plan = LoadPlan(specs(100, 1200, 32, rate=20, shared_prefix=1000))
    cached, samples, _ = run(SimTarget(CONFIG, 20_000, COST), plan)
    uncached, samples_off, _ = run(SimTarget(CONFIG.with_(enable_prefix_caching=False), 20_000, COST), plan)
    assert summarize(cached).mean_ttft_ms < 0.6 * summarize(uncached).mean_ttft_ms
    hits = samples[-1].values["vllm:prefix_cache_hits_total"]
    queries = samples[-1].values["vllm:prefix_cache_queries_total"]
    assert queries == 100 * 1200
    assert 99 * 992 <= hits <= 99 * 1000  # every request after the first hits the 62 full shared blocks
    assert samples_off[-1].values["vllm:prefix_cache_hits_total"] == 0


def test_requests_resending_a_prompt_run_at_once_on_one_copy_of_its_full_blocks():
    # vLLM 0.8.5 v1/core/kv_cache_manager.py: allocate_slots caches a prompt's full blocks as it schedules them,
    # get_computed_blocks finds them for a later request with the same prompt (all but the last block, which is
    # recomputed for its logits), and allocate_slots touches them (one more reference): only the rest is its own.
    # 64 requests over 10 distinct 400-token prompts, 64 tokens out each: 64 private copies would need
    # 64 x 29 blocks; shared, 10 x 29 for the first of each prompt and 54 x 5 for the others.
    engine = SimEngine(CONFIG, 600, COST, fast_forward=False)
    prompts = [np.arange(1000 * p, 1000 * p + 400) for p in range(10)]
    reqs = [engine.add_request(prompts[i % 10], 64, 0.0) for i in range(64)]
    most_running = most_held = 0
    t = 0.0
    while engine.has_work():
        t = engine.begin_step(t)
        running = engine.scheduler.reqs
        held = int(np.count_nonzero(engine.pool.ref_cnt))
        assert int(engine.pool.ref_cnt.sum()) == sum(len(r.blocks) for r in running)
        most_running, most_held = max(most_running, len(running)), max(most_held, held)
        engine.finish_step()
    assert most_running == 64 and engine.scheduler.num_preemptions == 0
    assert most_held <= 10 * 29 + 54 * 5
    assert all(r.num_output_tokens == 64 for r in reqs)


def test_tensor_parallelism_lowers_tpot():
    gpu, model = get_gpu("a100-80gb"), get_model("qwen2.5-7b")
    plan = LoadPlan(specs(64, 512, 128), max_concurrency=16)
    tp1, _, _ = run(Deployment.build(gpu, model, EngineConfig()).sim_target(), plan)
    tp2, _, _ = run(Deployment.build(gpu, model, EngineConfig(tensor_parallel_size=2)).sim_target(), plan)
    assert summarize(tp2).mean_tpot_ms < 0.8 * summarize(tp1).mean_tpot_ms


def test_chunked_prefill_and_long_prefill_threshold_split_prompts():
    def first_token_steps(config, prompt_len):
        engine = SimEngine(config, 5000, COST)
        long = engine.add_request(np.arange(prompt_len), 2, 0.0)
        engine.add_request(np.arange(10_000, 10_064), 100, 0.0)  # keeps a second request eligible
        steps = 0
        while long.first_token_step is None:
            engine.begin_step(engine.step_ends[-1] if engine.step_ends else 0.0)
            engine.finish_step()
            steps += 1
        return steps

    assert first_token_steps(CONFIG, 5000) == 3  # 2048 + 2048 + 904
    assert first_token_steps(CONFIG.with_(long_prefill_token_threshold=512), 5000) == 10
    assert first_token_steps(CONFIG.with_(max_num_batched_tokens=8192, enable_chunked_prefill=False), 5000) == 1


@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_block_accounting_holds_at_every_step(policy):
    config = CONFIG.with_(scheduling_policy=policy, max_num_seqs=16, max_num_batched_tokens=512)
    engine = SimEngine(config, 90, COST, fast_forward=False)
    rng = np.random.default_rng(1)
    prefix = rng.integers(0, 1000, 100)
    reqs = [
        engine.add_request(np.concatenate([prefix, rng.integers(0, 1000, 60 + 7 * i)]), 20 + i, 0.0, priority=i % 3)
        for i in range(24)
    ]
    t = 0.0
    while engine.has_work():
        t = engine.begin_step(t)
        engine.pool.check()
        engine.finish_step()
        engine.pool.check()
        held = sum(len(r.blocks) for r in engine.scheduler.reqs)
        assert held >= int(np.count_nonzero(engine.pool.ref_cnt))
    assert engine.scheduler.num_preemptions > 0
    assert all(r.num_output_tokens == r.max_tokens for r in reqs)
    assert engine.pool.num_free == engine.pool.num_blocks - 1
    assert engine.pool.ref_cnt.min() == 0 and engine.pool.ref_cnt.max() == 0


def test_a_step_after_an_idle_spell_pays_the_wake_up_and_back_to_back_steps_do_not():
    hw, model = get_gpu("a100-80gb"), get_model("qwen2.5-7b")
    plain = Deployment.build(hw, model, CONFIG, coefficients=CostCoefficients())  # the same CPU terms as below
    waking = Deployment.build(
        hw, model, CONFIG, coefficients=CostCoefficients(idle_wake_s=4e-3, idle_wake_time_constant_s=0.01)
    )

    def step_lengths(deployment: Deployment) -> list[float]:
        engine = SimEngine(deployment.config, deployment.memory.num_blocks, deployment.cost_model())
        engine.add_request(np.arange(0, 64), 3, 0.0)
        t = 0.0
        while engine.has_work():  # back to back from t=0: only the first step follows idleness (since start)
            t = engine.begin_step(t)
            engine.finish_step()
        engine.add_request(np.arange(100, 164), 1, t + 0.01)  # after 10 ms idle
        end = engine.begin_step(t + 0.01)
        engine.finish_step()
        ends = engine.step_ends
        return [ends[0], *np.diff(ends[:-1]), end - (t + 0.01)]

    base, woken = step_lengths(plain), step_lengths(waking)
    assert woken[0] - base[0] == pytest.approx(4e-3)  # never ran before: the full wake-up
    assert woken[1:-1] == pytest.approx(base[1:-1])  # decode steps straight after each other
    assert woken[-1] - base[-1] == pytest.approx(4e-3 * (1 - np.exp(-1)))  # one time constant of idleness
