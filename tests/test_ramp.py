"""Ramps (`--ramp-up-strategy linear|exponential --ramp-up-start-rps --ramp-up-end-rps`, vLLM's flags)."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from servelab.cli import app
from servelab.workload.arrival import ArrivalConfig, Ramp
from servelab.workload.datasets import WorkloadConfig
from servelab.workload.errors import WorkloadError
from servelab.workload.plan import Amount, build_plan

runner = CliRunner()


def arrivals(ramp: Ramp, amount: Amount) -> np.ndarray:
    plan = build_plan(WorkloadConfig(input_len=4, output_len=2), ArrivalConfig(ramp=ramp), amount)
    return np.array([spec.arrival_time for spec in plan.requests])


def test_rates_follow_vllms_definitions():
    linear, exponential = Ramp("linear", 2, 10), Ramp("exponential", 2, 32)
    assert [linear.rate(p) for p in (0, 0.5, 1)] == [2, 6, 10]
    assert [exponential.rate(p) for p in (0, 0.5, 1)] == pytest.approx([2, 8, 32])


@pytest.mark.parametrize("strategy", ["linear", "exponential"])
def test_a_ramp_by_request_index_starts_slow_and_ends_fast(strategy):
    t = arrivals(Ramp(strategy, 1, 40), Amount(num_prompts=400))
    assert t[0] == 0 and np.all(np.diff(t) >= 0)
    first, last = 1 / np.diff(t[:40]).mean(), 1 / np.diff(t[-40:]).mean()
    assert first < 4 and last > 20, (
        first,
        last,
    )  # 400 gamma gaps: far from the 1 and 40 it ramps between only by chance


def test_a_ramp_over_a_duration_follows_the_clock():
    t = arrivals(Ramp("linear", 5, 45), Amount(duration=20))
    assert t[-1] < 20
    assert 400 < len(t) < 600  # the mean rate, 25 req/s, for 20 s
    early, late = np.sum(t < 5), np.sum(t >= 15)
    assert late > 3 * early, (early, late)


def test_bad_ramps_are_refused_before_any_load(tmp_path):
    with pytest.raises(WorkloadError, match="drop --request-rate"):
        ArrivalConfig(request_rate=3, ramp=Ramp("linear", 1, 2))
    for args, words in [
        (["--ramp-up-strategy", "linear"], "all three"),
        (["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "5", "--ramp-up-end-rps", "1"], "start <= end"),
        (["--ramp-up-strategy", "cubic", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "2"], "linear, exponential"),
        (
            ["--ramp-up-strategy", "linear", "--ramp-up-start-rps", "1", "--ramp-up-end-rps", "2", "--sweep", "auto"],
            "--sweep",
        ),
    ]:
        result = runner.invoke(
            app, ["simulate", "--gpu", "a100-80gb", "--model", "qwen2.5-7b", *args, "--result-dir", str(tmp_path / "x")]
        )
        assert result.exit_code == 2 and words in result.output, result.output
    assert not (tmp_path / "x").exists()
