"""The load generator's verdict on itself: busy, starved, or keeping up."""

from servelab.targets.client_stats import client_stats


def test_a_client_that_keeps_up_says_so():
    stats = client_stats([0.001] * 100, [0.001] * 100, cpu_seconds=1.0, wall_seconds=10.0)
    assert not stats["client_may_be_bottleneck"] and stats["reason"] == "client kept up with its schedule"


def test_a_late_loop_with_little_cpu_is_called_starved_and_the_fix_named():
    stats = client_stats([0.001] * 100, [0.2] * 100, cpu_seconds=0.5, wall_seconds=10.0)
    assert stats["client_may_be_bottleneck"]
    assert "waiting for a CPU" in stats["reason"] and "autogroup" in stats["reason"]


def test_a_late_loop_that_is_busy_is_not_called_starved():
    stats = client_stats([0.001] * 100, [0.2] * 100, cpu_seconds=9.0, wall_seconds=10.0)
    assert "client CPU at 90% of a core" in stats["reason"] and "waiting for a CPU" not in stats["reason"]
