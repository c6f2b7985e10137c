"""What vLLM 0.32 does by default and the simulator now models: async scheduling, the full-prompt
admission gate, the watermark, 0.92 of GPU memory, the API server's measured CPU cost and
--api-server-count, --stream-interval; and diagnose saying when the API server is the limit."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from servelab.diagnose import findings as fk
from servelab.diagnose.analysis import diagnose_described
from servelab.diagnose.scenario import synthetic
from servelab.metrics.records import MemorySink
from servelab.perf.cost_model import CostCoefficients
from servelab.perf.engine_args import parse_engine_args, resolve
from servelab.perf.engine_config import EngineConfig
from servelab.perf.hardware import get_gpu
from servelab.perf.models import get_model
from servelab.perf.vllm_cpu_costs import ApiServerCosts, measured
from servelab.sim.block_pool import BlockPool
from servelab.sim.request import SimRequest
from servelab.sim.scheduler import Scheduler
from servelab.targets.deployment import Deployment, build_deployment
from servelab.workload.spec import LoadPlan, RequestSpec


# -- defaults resolved as vLLM 0.32 resolves them ---------------------------------------------------------


def test_async_scheduling_is_on_for_gpus_and_forced_off_on_the_cpu_backend():
    model = get_model("qwen2.5-7b")
    on_gpu = resolve(EngineConfig(), get_gpu("h100"), model)
    assert on_gpu.async_scheduling is True
    assert resolve(parse_engine_args("--no-async-scheduling").config, get_gpu("h100"), model).async_scheduling is False
    # CpuPlatform.check_and_update_config sets it False whatever the flag said.
    assert resolve(parse_engine_args("--async-scheduling").config, get_gpu("cpu"), model).async_scheduling is False


def test_one_api_server_per_data_parallel_engine_unless_set():
    model, h100 = get_model("qwen2.5-7b"), get_gpu("h100")
    assert resolve(EngineConfig(), h100, model).api_server_count == 1
    assert resolve(parse_engine_args("-dp 4").config, h100, model).api_server_count == 4
    assert resolve(parse_engine_args("-dp 4 --api-server-count 2").config, h100, model).api_server_count == 2


def test_gpu_memory_utilization_default_is_092_and_the_device_alias_sets_it():
    assert EngineConfig().gpu_memory_utilization == 0.92
    alias = build_deployment("h100", "qwen2.5-7b", "--device-memory-utilization 0.8")
    plain = build_deployment("h100", "qwen2.5-7b", "--gpu-memory-utilization 0.8")
    default = build_deployment("h100", "qwen2.5-7b")
    assert alias.config.gpu_memory_utilization == 0.8
    assert alias.memory.num_blocks == plain.memory.num_blocks < default.memory.num_blocks


# -- the admission gate and the watermark -----------------------------------------------------------------


def _scheduler(free_blocks: int, **config) -> Scheduler:
    cfg = EngineConfig(max_num_seqs=4, max_num_batched_tokens=64, block_size=16, **config)
    return Scheduler(cfg, BlockPool(free_blocks + 1, enable_caching=False))  # + vLLM's null block


def test_full_prompt_gate_admits_only_when_the_whole_prompt_fits():
    # 10 free blocks; a 320-token prompt needs 20 of them, its first 64-token chunk only 4.
    gated = _scheduler(10)
    gated.add(SimRequest(0, np.arange(320), 320, 8, 0.0))
    granted, _ = gated.schedule(0.0)
    assert granted.size == 0 and gated.num_running == 0  # vLLM 0.32 default: waits for room for the whole prompt
    chunked = _scheduler(10, scheduler_reserve_full_isl=False)
    chunked.add(SimRequest(0, np.arange(320), 320, 8, 0.0))
    granted, _ = chunked.schedule(0.0)
    assert granted.tolist() == [64]  # the first chunk is admitted, as before 0.32


def test_watermark_keeps_blocks_free_for_running_requests_only_once_something_runs():
    sched = _scheduler(10, watermark=0.3, max_num_partial_prefills=1)  # int(0.3 x 11 blocks) = 3 kept free
    sched.add(SimRequest(0, np.arange(64), 64, 8, 0.0))  # 4 blocks: admitted, nothing was running
    sched.add(SimRequest(1, np.arange(100, 164), 64, 8, 0.0))  # 4 more would leave 2 < 3 free: refused
    granted, _ = sched.schedule(0.0)
    assert sched.num_running == 1 and granted.tolist() == [64]


def test_flags_are_parsed_or_reported_never_dropped():
    parsed = parse_engine_args(
        "--no-scheduler-reserve-full-isl --watermark 0.05 --api-server-count 4 --stream-interval 8 "
        "--no-async-scheduling --spec-method ngram --spec-tokens 4 --max-cudagraph-capture-size 256 "
        "--kv-offloading-size 64"
    )
    c = parsed.config
    assert (c.scheduler_reserve_full_isl, c.watermark, c.api_server_count, c.stream_interval, c.async_scheduling) == (
        False,
        0.05,
        4,
        8,
        False,
    )
    reported = " ".join(parsed.warnings)
    for flag in ("--spec-method", "--spec-tokens", "--max-cudagraph-capture-size", "--kv-offloading-size"):
        assert f"{flag} " in reported and "accepted, not modelled" in reported
    assert parsed.ignored == []


# -- the CPU side: measured defaults for catalogue GPUs ----------------------------------------------------


def test_catalogue_gpus_get_the_measured_cpu_costs_and_cpu_keeps_its_fitted_ones():
    costs = measured()
    h100 = build_deployment("h100", "llama-3.1-8b")
    assert h100.cpu_costs_source == "measured"
    f = costs.default_speed_factor
    assert h100.coefficients.step_overhead_s == pytest.approx(f * costs.step_s)
    assert h100.coefficients.per_request_overhead_s == pytest.approx(f * costs.per_scheduled_request_s)
    assert h100.api == costs.api_server(f)
    assert h100.api.per_request_s == pytest.approx(f * costs.api_per_request_s)
    assert h100.api.per_streamed_token_s == pytest.approx(f * costs.api_per_output_token_s)
    cpu = build_deployment("cpu", "qwen2.5-1.5b")
    assert cpu.cpu_costs_source == "none" and not cpu.api.any
    assert cpu.coefficients == CostCoefficients()  # what calibrate fits starts from here, untouched
    calibrated = build_deployment("h100", "llama-3.1-8b", coefficients=CostCoefficients())
    assert not calibrated.api.any and calibrated.cpu_costs_source == "given"


def test_cpu_speed_factor_scales_every_cpu_side_cost():
    base = Deployment.build(get_gpu("h100"), get_model("llama-3.1-8b"), EngineConfig(), cpu_speed_factor=1.0)
    slow = Deployment.build(get_gpu("h100"), get_model("llama-3.1-8b"), EngineConfig(), cpu_speed_factor=2.0)
    assert slow.api.per_request_s == pytest.approx(2 * base.api.per_request_s)
    assert slow.api.latency_s == pytest.approx(2 * base.api.latency_s)
    assert slow.coefficients.step_overhead_s == pytest.approx(2 * base.coefficients.step_overhead_s)


def _burst(n: int, prompt: int, out: int) -> list[RequestSpec]:
    rng = np.random.default_rng(0)
    return [RequestSpec(i, rng.integers(0, 100_000, prompt, dtype=np.int32), out, 0.0) for i in range(n)]


def _burst_facts(d: Deployment) -> tuple[float, float, float, str | None]:
    """(API-server work of the burst, the engine's own time for it, the API core's busy share, diagnose's
    bottleneck)."""
    a = d.api
    work = a.per_request_s + 128 * a.per_prompt_token_s + 4 * a.per_streamed_token_s
    gpu_only = replace(d, api=ApiServerCosts())
    engine_alone = gpu_only.sim_target().run(LoadPlan(_burst(1000, 128, 4)), MemorySink()).duration
    run = d.sim_target().run(LoadPlan(_burst(1000, 128, 4)), MemorySink())
    scenario = synthetic(128, 4, max_concurrency=1000, num_requests=1000)  # all 1,000 sent at once
    dx = diagnose_described(d, scenario, with_recommendations=False)
    return 1000 * work, engine_alone, run.client_stats["frontend_busy_s"] / run.duration, dx.bottleneck


def test_a_burst_of_short_requests_on_h100_is_limited_by_the_api_server_when_its_measured_cost_says_so():
    """1,000 requests of 128 in / 4 out at once: the API server's serial work against the engine's own time."""
    api_work, engine_alone, api_busy, bottleneck = _burst_facts(build_deployment("h100", "llama-3.1-8b"))
    if api_work > engine_alone:  # what the measured costs say today (see docs/simulator.md)
        assert api_busy > 0.9 and bottleneck == fk.FRONTEND_CPU_BOUND
    else:
        assert bottleneck != fk.FRONTEND_CPU_BOUND


@pytest.mark.parametrize("factor, api_bound", [(0.05, False), (4.0, True)])
def test_the_api_server_is_named_as_the_limit_exactly_when_its_work_exceeds_the_engines(factor, api_bound):
    d = Deployment.build(get_gpu("h100"), get_model("llama-3.1-8b"), EngineConfig(), cpu_speed_factor=factor)
    api_work, engine_alone, api_busy, bottleneck = _burst_facts(d)
    assert (api_work > engine_alone) is api_bound
    assert (bottleneck == fk.FRONTEND_CPU_BOUND) is api_bound
    assert (api_busy > 0.9) is api_bound


def test_more_api_servers_share_the_work():
    one, four = (build_deployment("h100", "llama-3.1-8b", f"--api-server-count {n}") for n in (1, 4))
    runs = {}
    for name, d in (("one", one), ("four", four)):
        sink = MemorySink()
        runs[name] = (d.sim_target().run(LoadPlan(_burst(400, 128, 4)), sink), sink.records)
    assert runs["four"][0].duration < runs["one"][0].duration
    # The requests' own work is the same, spread over four cores; each core also receives every engine step that
    # carries its tokens, so four spend more in all, but less than four times one's.
    busy_one, busy_four = (runs[n][0].client_stats["frontend_busy_s"] for n in ("one", "four"))
    assert busy_one <= busy_four < 4 * busy_one


def test_stream_interval_sends_the_first_token_then_one_chunk_per_interval():
    d = build_deployment("h100", "llama-3.1-8b", "--stream-interval 4")
    sink = MemorySink()
    d.sim_target().run(LoadPlan(_burst(1, 64, 10)), sink)
    (rec,) = sink.records
    assert rec.output_tokens == 10 and len(rec.chunk_times) == 4  # tokens 1 | 2-5 | 6-9 | 10


def test_a_chats_next_turn_hits_the_cached_blocks_of_the_previous_reply():
    """vLLM caches generated tokens' full blocks; the next turn quotes the reply, so it hits them too."""
    from servelab.sim.linear_cost import LinearCostModel
    from servelab.targets.sim import SimTarget

    rng = np.random.default_rng(1)
    first, reply, user = (rng.integers(0, 9000, n, dtype=np.int32) for n in (64, 32, 16))
    turns = [
        RequestSpec(0, first, 32, 0.0),
        RequestSpec(1, np.concatenate([first, reply, user]), 4, 0.0, depends_on=0, think_time=0.1),
    ]
    target = SimTarget(EngineConfig(max_num_seqs=8, max_num_batched_tokens=256), 200, LinearCostModel())
    target.run(LoadPlan(turns), MemorySink())
    # The first turn's KV holds 64 + 31 tokens (its last token is never fed back): 5 full blocks of 16,
    # all of which the second turn finds: 80 of its 112 tokens, where the prompt alone would give 64.
    assert target.last_engines[0].scheduler.prefix.hits == 80
