"""The split of the client's TTFT into API server & network, engine queue and prefill, on the simulator.

The simulator exports vLLM's histograms under vLLM's names and knows each
request's scheduling time, so the split can be checked against the truth
request by request (the real server's version is in test_server_timings_vllm.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from servelab.cli import app
from servelab.metrics import timeline as tl
from servelab.metrics.records import MemorySink, RequestRecord
from servelab.metrics.server_timings import (
    TtftSplit,
    describe,
    sweep_ttft_splits,
    ttft_split,
)
from servelab.metrics.timeline import TimelineSample
from servelab.perf.vllm_cpu_costs import ApiServerCosts
from servelab.perf.engine_config import EngineConfig
from servelab.sim.linear_cost import LinearCostModel
from servelab.targets.sim import SimTarget
from servelab.workload.spec import LoadPlan, RequestSpec

COST = LinearCostModel()


def specs(n: int, prompt_len: int = 200, out: int = 16, rate: float | None = None, seed: int = 0) -> list[RequestSpec]:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate, n)) if rate else np.zeros(n)
    return [RequestSpec(i, rng.integers(0, 9000, prompt_len, dtype=np.int32), out, float(t[i])) for i in range(n)]


def simulate(target: SimTarget, plan: LoadPlan) -> tuple[list[RequestRecord], list[TimelineSample]]:
    sink, samples = MemorySink(), []
    target.run(plan, sink, samples.append)
    return sink.records, samples


def assert_adds_up(split: TtftSplit, records: list[RequestRecord]) -> None:
    """What holds for any run: non-negative parts that sum to the client's mean TTFT."""
    client = np.mean([r.ttft for r in records if r.ok])
    assert split.client_ttft_s == pytest.approx(client)
    assert min(split.parts.values()) >= 0
    assert sum(split.parts.values()) == pytest.approx(split.client_ttft_s)
    assert split.requests == split.server_requests == len(records) and split.notes == ()


def test_queued_behind_max_num_seqs_is_the_queue_part_and_matches_each_request():
    records, samples = simulate(
        SimTarget(EngineConfig(max_num_seqs=2, max_num_batched_tokens=1024), 2000, COST),
        LoadPlan(specs(40), max_concurrency=16),
    )
    split = ttft_split(records, samples)
    assert split is not None and not split.queue_measured  # the simulator derives it: server TTFT - prefill
    assert_adds_up(split, records)
    # No frontend, no network: the engine's view is the client's, request by request.
    assert split.api_server_s == pytest.approx(0.0, abs=1e-9)
    assert split.queue_s == pytest.approx(np.mean([r.schedule_time - r.send_time for r in records]))
    assert split.prefill_s == pytest.approx(np.mean([r.first_token_time - r.schedule_time for r in records]))
    assert split.queue_s > 5 * split.prefill_s  # 16 in flight, 2 slots
    assert "queued in the engine (waiting for a sequence slot)" in describe(split, "waiting for a sequence slot")


def test_network_latency_is_api_server_and_network_time():
    records, samples = simulate(
        SimTarget(EngineConfig(max_num_seqs=32, max_num_batched_tokens=1024), 2000, COST, network_latency=0.01),
        LoadPlan(specs(20, rate=5)),
    )
    split = ttft_split(records, samples)
    assert_adds_up(split, records)
    assert split.api_server_s == pytest.approx(0.02)  # there and back before the first token is seen
    assert split.outside_server_s == pytest.approx(0.02)


def test_a_saturated_api_server_shows_as_api_server_time_not_engine_time():
    frontend = {
        "api": ApiServerCosts(per_request_s=0.010, per_prompt_token_s=50e-6, per_output_token_s=50e-6)
    }  # ~48 req/s
    records, samples = simulate(
        SimTarget(EngineConfig(max_num_seqs=32, max_num_batched_tokens=1024), 2000, COST, **frontend),
        LoadPlan(specs(300, rate=150, seed=4)),
    )
    split = ttft_split(records, samples)
    assert_adds_up(split, records)
    assert split.api_server_s > 5 * (split.queue_s + split.prefill_s)


def _sample(t: float, **values: float) -> TimelineSample:
    names = {
        "ttft": tl.TTFT_SUM,
        "ttft_n": tl.TTFT_COUNT,
        "prefill": tl.PREFILL_TIME_SUM,
        "prefill_n": tl.PREFILL_TIME_COUNT,
        "queue": tl.QUEUE_TIME_SUM,
        "queue_n": tl.QUEUE_TIME_COUNT,
    }
    return TimelineSample(t, {names[k]: v for k, v in values.items()})


def _records(ttfts: list[float]) -> list[RequestRecord]:
    return [RequestRecord(i, 0.0, 0.0, 1.0, first_token_time=t) for i, t in enumerate(ttfts)]


def test_a_measured_queue_histogram_is_used_and_the_transfer_goes_to_the_api_server_part():
    # vLLM: server TTFT 0.5 s = 0.3 queue + 0.15 prefill + 0.05 between API server and engine core; client 0.6 s.
    samples = [
        _sample(0, ttft=1, ttft_n=2, prefill=1, prefill_n=2, queue=1, queue_n=2),
        _sample(5, ttft=3, ttft_n=6, prefill=1.6, prefill_n=6, queue=2.2, queue_n=6),
    ]
    split = ttft_split(_records([0.6] * 4), samples)
    assert split.queue_measured
    assert (split.queue_s, split.prefill_s, split.server_ttft_s) == pytest.approx((0.3, 0.15, 0.5))
    assert split.api_server_s == pytest.approx(0.15) and split.outside_server_s == pytest.approx(0.1)


def test_other_traffic_is_noted_and_parts_never_go_negative():
    samples = [
        _sample(0, ttft=0, ttft_n=0, prefill=0, prefill_n=0, queue=0, queue_n=0),
        _sample(5, ttft=8, ttft_n=10, prefill=2, prefill_n=10, queue=6, queue_n=10),
    ]
    split = ttft_split(_records([0.5] * 4), samples)  # the server's requests waited longer than this client's
    assert min(split.parts.values()) >= 0 and sum(split.parts.values()) == pytest.approx(0.5)
    assert any("counts differ" in n for n in split.notes) and any("scaled" in n for n in split.notes)


def test_without_the_servers_histograms_or_a_first_token_there_is_no_split():
    assert ttft_split(_records([0.5]), [TimelineSample(0, {tl.RUNNING: 1})]) is None
    samples = [
        _sample(0, ttft=0, ttft_n=0, prefill=0, prefill_n=0),
        _sample(1, ttft=1, ttft_n=2, prefill=1, prefill_n=2),
    ]
    assert ttft_split([RequestRecord(0, 0.0, 0.0, 1.0)], samples) is None


def test_each_sweep_point_has_its_own_split_and_the_queue_grows_with_the_load(tmp_path: Path):
    result = CliRunner().invoke(
        app,
        [
            "simulate",
            "--gpu",
            "a100-80gb",
            "--model",
            "qwen2.5-7b",
            "--engine-args",
            "--max-num-seqs 4",
            "--random-input-len",
            "512",
            "--random-output-len",
            "32",
            "--num-prompts",
            "40",
            "--sweep",
            "max-concurrency=1,32",
            "--result-dir",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output
    points = sweep_ttft_splits(tmp_path)
    assert [label for label, _ in points] == ["max-concurrency=1", "max-concurrency=32"]
    (_, alone), (_, crowded) = points
    for split in (alone, crowded):
        assert split.requests == split.server_requests == 40
        assert min(split.parts.values()) >= 0 and sum(split.parts.values()) == pytest.approx(split.client_ttft_s)
    assert alone.queue_s < 0.1 * alone.client_ttft_s  # one at a time: nothing to wait for
    assert crowded.queue_s > 0.5 * crowded.client_ttft_s  # 32 in flight on 4 slots
