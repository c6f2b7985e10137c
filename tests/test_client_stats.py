"""The load generator's verdict on itself: silent when it kept up, loud and sized when it distorted the figures."""

import asyncio
import time

import pytest
import uvloop

from servelab.targets.client_stats import DelayProbe, added_delay, client_stats


def test_a_client_that_keeps_up_says_so():
    stats = client_stats([0.001] * 100, [0.0001] * 100, cpu_seconds=1.0, wall_seconds=10.0)
    assert not stats["client_may_be_bottleneck"]
    assert stats["reason"].startswith("client kept up with its schedule")


def test_a_late_loop_with_little_cpu_is_called_starved_and_the_fix_named():
    stats = client_stats([0.001] * 100, [0.2] * 100, cpu_seconds=0.5, wall_seconds=10.0)
    assert stats["client_may_be_bottleneck"]
    assert "waiting for a CPU" in stats["reason"] and "autogroup" in stats["reason"]


def test_a_late_loop_that_is_busy_is_not_called_starved():
    stats = client_stats([0.001] * 100, [0.2] * 100, cpu_seconds=9.0, wall_seconds=10.0)
    assert "client CPU at 90% of a core" in stats["reason"] and "waiting for a CPU" not in stats["reason"]


def light_closed_loop(concurrency=256, waves=8, startup_spread_s=0.25):
    """What the cry-wolf runs looked like: a first wave that took 250 ms to leave, then sub-ms lags."""
    intended = [0.0] * concurrency + [0.5 + 0.01 * i for i in range(concurrency * (waves - 1))]
    lags = [startup_spread_s * i / concurrency for i in range(concurrency)] + [0.0005] * (concurrency * (waves - 1))
    return intended, lags


def test_the_start_up_wave_is_reported_apart_and_does_not_raise_a_warning():
    intended, lags = light_closed_loop()
    stats = client_stats(
        lags,
        [0.0003] * 500,
        3.0,
        30.0,
        intended_s=intended,
        loop_at_s=[0.1 * i for i in range(500)],
        loop_weights=[256] * 500,
        typical_gap_ms=20.0,
        mean_lifetime_ms=1300.0,
    )
    assert stats["p99_schedule_lag_ms"] > 200  # the old verdict fired on this
    assert not stats["client_may_be_bottleneck"], stats["reason"]
    wave = stats["startup_wave"]
    assert wave["requests"] == 256 and wave["left_within_ms"] == pytest.approx(250 * 255 / 256)
    assert stats["mean_steady_send_lag_ms"] == pytest.approx(0.5)


def test_a_material_added_delay_is_a_warning_that_says_how_much():
    intended, lags = light_closed_loop(startup_spread_s=0.001)
    stats = client_stats(
        lags,
        [0.004] * 100,
        1.0,
        10.0,
        intended_s=intended,
        loop_at_s=[1.0 + 0.01 * i for i in range(100)],
        loop_weights=[64] * 100,
        typical_gap_ms=20.0,
        mean_lifetime_ms=1300.0,
    )
    assert stats["client_may_be_bottleneck"]
    assert "added ~4.0 ms" in stats["reason"] and "20% of the median inter-token gap" in stats["reason"]


def test_the_same_delay_is_immaterial_next_to_long_gaps():
    stats = client_stats([0.0] * 10, [0.004] * 100, 1.0, 10.0, typical_gap_ms=100.0)
    assert not stats["client_may_be_bottleneck"], stats["reason"]


def test_stalls_with_nothing_in_flight_delay_nothing():
    assert added_delay([0.5, 0.001], [0, 4]) == {"mean_ms": 1.0, "median_ms": 1.0, "p99_ms": 1.0, "samples": 1}
    assert added_delay([0.5], [0]) is None
    stats = client_stats([0.0] * 10, [0.5, 0.0001], 1.0, 10.0, loop_weights=[0, 4], typical_gap_ms=10.0)
    assert not stats["client_may_be_bottleneck"]


def test_steady_send_lag_that_costs_load_is_material():
    intended = [0.0] * 4 + [1.0 + i for i in range(40)]
    lags = [0.0] * 4 + [0.02] * 40
    stats = client_stats(lags, [], 1.0, 50.0, intended_s=intended, mean_lifetime_ms=100.0)
    assert stats["client_may_be_bottleneck"] and "20.0 ms late on average, 20% of a request's 100 ms" in stats["reason"]


def test_a_saturated_cpu_is_material_on_its_own():
    stats = client_stats([0.0] * 10, [], cpu_seconds=9.5, wall_seconds=10.0)
    assert stats["client_may_be_bottleneck"] and "95% of a core (saturated" in stats["reason"]


def test_the_probe_sees_a_blocked_loop_that_a_ticker_on_it_could_not():
    """The probe's thread keeps stamping while the loop is blocked, so the wait is seen in full."""

    async def main():
        probe = DelayProbe(lambda: 1, period=0.005)
        probe.start()
        await asyncio.sleep(0.03)
        begin = time.perf_counter()
        time.sleep(0.5)  # noqa: ASYNC251 -- on purpose: the loop cannot run, every read that arrives now waits
        end = time.perf_counter()
        await asyncio.sleep(0.03)
        await probe.stop()
        return probe, begin, end

    probe, begin, end = uvloop.run(main())
    during = [(at, lag) for at, lag in zip(probe.at, probe.lags) if begin <= at <= end]
    assert during, "the probe thread wrote nothing while the loop was blocked"
    assert all(lag >= end - at for at, lag in during)  # each waited for the rest of the block
    assert len(probe.lags) == len(probe.at) == len(probe.weights) and set(probe.weights) == {1}
