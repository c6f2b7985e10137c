"""`--sweep auto` and the over-saturation judgement: on the simulator (a real engine model) and on queue arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from servelab.cli import app
from servelab.experiment.auto_sweep import AutoSweep, parse_sweep
from servelab.experiment.saturation import SaturationGuard, judge
from servelab.experiment.sweep import Sweep, SweepError
from servelab.metrics.records import RequestRecord
from servelab.workload.spec import RequestSpec
from support.schemas import assert_files_match_schemas

runner = CliRunner()
A100 = ["--gpu", "a100-80gb", "--model", "qwen2.5-7b", "--random-input-len", "512", "--random-output-len", "32"]


def queue_records(rate: float, service_s: float, n: int, servers: int = 1) -> tuple[list[RequestRecord], list[float]]:
    """Evenly spaced arrivals served first come first served by `servers` servers of fixed service time:
    the queue arithmetic of a server that keeps up (rate < servers / service_s) or falls behind."""
    arrivals = [i / rate for i in range(n)]
    free = [0.0] * servers
    records = []
    for i, t in enumerate(arrivals):
        k = int(np.argmin(free))
        start = max(t, free[k])
        free[k] = start + service_s
        records.append(
            RequestRecord(
                index=i,
                intended_time=t,
                send_time=t,
                first_token_time=start + service_s / 4,
                finish_time=start + service_s,
                chunk_times=[start + service_s / 4],
            )
        )
    return records, arrivals


def test_parse_sweep_reads_auto_and_the_number_of_rates():
    assert parse_sweep("auto") == AutoSweep() and parse_sweep("auto=2") == AutoSweep(2)
    assert isinstance(parse_sweep("request-rate=1,2"), Sweep)
    for bad in ("auto=0", "auto=x", "auto=33"):
        with pytest.raises(SweepError, match="auto=N"):
            parse_sweep(bad)


def test_auto_with_a_request_rate_is_refused_before_any_load(tmp_path: Path):
    result = runner.invoke(
        app, ["simulate", *A100, "--sweep", "auto", "--request-rate", "3", "--result-dir", str(tmp_path / "x")]
    )
    assert result.exit_code == 2 and "--sweep auto" in result.output and "--request-rate" in result.output
    assert not (tmp_path / "x").exists()


def test_a_server_that_keeps_up_is_not_over_saturated():
    records, arrivals = queue_records(rate=8, service_s=0.1, n=80)  # 80% busy
    assert judge(records, arrivals, 8) is None


def test_a_server_serving_half_the_offered_rate_is_over_saturated_with_its_numbers():
    records, arrivals = queue_records(rate=8, service_s=0.25, n=80)  # serves 4 of 8 req/s
    verdict = judge(records, arrivals, 8)
    assert verdict is not None
    assert 3 < verdict.backlog_slope < 5  # 8 offered - 4 served
    assert verdict.ttft_last_ms > 1.5 * verdict.ttft_first_ms
    assert "over-saturated" in verdict.describe()


def test_a_few_slower_requests_on_a_server_that_keeps_up_are_not_over_saturation():
    """What a real server showed at a quarter of its one-at-a-time rate: the last third of the requests took longer
    (TTFT 7 -> 19 ms), so the backlog stepped from 0 to 1 late in the run, a slope the regression passes; a backlog
    of one request is not more than the server holds in flight while it keeps up."""
    rate, arrivals = 4.5, [i / 4.5 for i in range(18)]
    records = []
    for i, t in enumerate(arrivals):
        service, ttft = (0.35, 0.019) if i >= 12 else (0.06, 0.007)
        records.append(
            RequestRecord(
                index=i,
                intended_time=t,
                send_time=t,
                first_token_time=t + ttft,
                finish_time=t + service,
                chunk_times=[t + ttft],
            )
        )
    finished = [r for r in records if r.finish_time <= arrivals[-1]]
    assert judge(finished, arrivals, rate) is None


def test_too_little_data_gets_no_verdict():
    records, arrivals = queue_records(rate=8, service_s=0.25, n=6)
    assert judge(records, arrivals, 8) is None


@pytest.mark.parametrize("stop", [True, False])
def test_the_guard_stops_releasing_after_a_verdict_only_when_asked(stop):
    records, arrivals = queue_records(rate=8, service_s=0.25, n=40)
    guard = SaturationGuard(8, stop=stop)
    specs = guard.requests(
        RequestSpec(index=i, prompt_ids=[1], max_tokens=1, arrival_time=t) for i, t in enumerate(arrivals + [99.0])
    )
    released = [next(specs) for _ in range(40)]
    for rec in records:
        guard.write(rec)
    guard._next_check = 0.0
    guard.write(records[-1])
    assert guard.verdict is not None and len(released) == 40
    assert [spec.arrival_time for spec in specs] == ([] if stop else [99.0])


def test_auto_sweep_on_the_simulator_finds_the_knee_below_the_peak_and_the_goodput_rate(tmp_path: Path):
    out = tmp_path / "auto"
    result = runner.invoke(
        app,
        [
            "simulate",
            *A100,
            "--num-prompts",
            "120",
            "--sweep",
            "auto=3",
            "--goodput",
            "ttft:300",
            "--result-dir",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    index = json.loads((out / "sweep.json").read_text())
    profiles = [p["profile"] for p in index["points"]]
    assert profiles == ["synchronous", "constant", "constant", "constant", "throughput"]
    auto = index["auto"]
    rates = [p["request-rate"] for p in index["points"][1:-1]]
    assert auto["synchronous_rate"] < rates[0] < rates[1] < rates[2] < auto["throughput_rate"]
    assert auto["synchronous_rate"] <= auto["knee_rate"] <= rates[-1]
    assert auto["max_goodput_rate"] is not None and auto["slo_attainment"] == 0.9
    assert "Knee" in result.output
    assert assert_files_match_schemas(out) == {"sweep": 1, "run": 5, "record": 5, "summary": 5, "timeline": 5}
