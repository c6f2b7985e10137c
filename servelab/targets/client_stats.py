"""The load generator's measurement of itself.

A client that falls behind its own schedule reports the server as slower than
it is, so every run carries evidence that the client was (or was not) keeping
up: how late requests left against the plan, how late the event loop woke up,
and how much of a CPU core the client process burned.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import numpy as np

LOOP_TICK_S = 0.01
"""Ticker period; short enough to see stalls that would distort a TTFT, cheap enough to be noise."""
SCHEDULE_LAG_LIMIT_MS = 10.0
LOOP_LAG_LIMIT_MS = 10.0
CPU_SHARE_LIMIT = 0.8
"""A process above ~80% of one core is close to the point where its own delays grow without bound."""
STARVED_CPU_SHARE = 0.3
"""Below this, a late-waking loop was not busy with its own work: something else had the CPU."""


class LoopLagMonitor:
    """Measures event-loop lag as the oversleep of a periodic ticker."""

    def __init__(self, tick: float = LOOP_TICK_S) -> None:
        self.tick = tick
        self.lags: list[float] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        clock = time.perf_counter
        while True:
            before = clock()
            await asyncio.sleep(self.tick)
            self.lags.append(clock() - before - self.tick)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None


def _ms_stats(prefix: str, values_s: Sequence[float]) -> dict[str, float | None]:
    if not values_s:
        return {f"{prefix}_p50_ms": None, f"{prefix}_p99_ms": None, f"{prefix}_max_ms": None}
    arr = np.asarray(values_s, dtype=float) * 1e3
    p50, p99 = np.percentile(arr, [50, 99])
    return {f"{prefix}_p50_ms": float(p50), f"{prefix}_p99_ms": float(p99), f"{prefix}_max_ms": float(arr.max())}


def client_stats(
    schedule_lags_s: Sequence[float],
    loop_lags_s: Sequence[float],
    cpu_seconds: float,
    wall_seconds: float,
    processes: int = 1,
) -> dict[str, object]:
    """Overhead numbers plus a verdict the summary can warn with.

    `cpu_share` is per process (CPU seconds / wall seconds / processes), so it
    reads as "fraction of one core" whatever the number of workers.
    """
    stats: dict[str, object] = {}
    stats.update(_ms_stats("schedule_lag", schedule_lags_s))
    stats.update(_ms_stats("loop_lag", loop_lags_s))
    cpu_share = cpu_seconds / wall_seconds / processes if wall_seconds > 0 else 0.0
    stats["cpu_share"] = cpu_share
    stats["processes"] = processes
    reasons = []
    if cpu_share > CPU_SHARE_LIMIT:
        reasons.append(f"client CPU at {cpu_share:.0%} of a core")
    p99 = stats["schedule_lag_p99_ms"]
    if p99 is not None and p99 > SCHEDULE_LAG_LIMIT_MS:
        reasons.append(f"requests left {p99:.1f} ms late at p99 (limit {SCHEDULE_LAG_LIMIT_MS:g} ms)")
    loop_p99 = stats["loop_lag_p99_ms"]
    if loop_p99 is not None and loop_p99 > LOOP_LAG_LIMIT_MS:
        reasons.append(f"event loop woke {loop_p99:.1f} ms late at p99 (limit {LOOP_LAG_LIMIT_MS:g} ms)")
        if cpu_share < STARVED_CPU_SHARE:
            reasons.append(
                f"with only {cpu_share:.0%} of a core in use the client was waiting for a CPU, not busy: on a "
                "shared host, a server started from another login session is scheduled as a group of its own "
                "(Linux autogroup) and can starve it; start the server from the same shell, or run the client elsewhere"
            )
    stats["client_may_be_bottleneck"] = bool(reasons)
    stats["reason"] = "; ".join(reasons) if reasons else "client kept up with its schedule"
    return stats
