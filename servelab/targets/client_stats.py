"""The load generator's measurement of itself, judged by how much it distorts what it reports.

A client that falls behind reports the server as slower than it is. Lateness
alone is not the question: the first wave of a closed loop always leaves over
a few milliseconds, and a tick that wakes 1 ms late does not matter next to a
50 ms inter-token gap. So every run carries the client's *distortion*:

- the delay it adds to every timestamp it takes (TTFT, each chunk): how long a
  network read waited for the event loop, sampled by a probe (a byte written
  from another thread every 10 ms, its wait timed by the loop's read
  callback) and weighted by the requests in flight when it was read, since a
  stall with nothing in flight delays nothing;
- the load it failed to offer: steady-state send lag against the plan, as a
  share of the requests' lifetime;
- CPU saturation: near a full core its delays grow without bound.

The start-up wave (every request due at the run's first instant: a closed
loop's first N) is reported on its own and never judged: how long it took to
leave says what the first wave's figures carry, not how the run went.
A warning is raised only when the distortion is material, with its size.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

PROBE_PERIOD_S = 0.01
"""How often the probe thread writes; 100 samples a second, each costs one small write and one read."""
WAVE_SPAN_S = 1e-3
"""Requests due within this of the first one belong to the start-up wave."""
ADDED_DELAY_FLOOR_MS = 1.0
"""Below this, no latency a user reads moves visibly, whatever its share."""
ADDED_DELAY_SHARE = 0.10
"""Material when the client adds this share of the run's own median inter-token gap (TTFT if no gaps)."""
SEND_LAG_SHARE = 0.05
"""Material when steady-state send lag is this share of a request's lifetime: that much load was not offered."""
CPU_SATURATED = 0.9
"""A process above ~90% of one core is at the point where its own queueing grows without bound."""
STARVED_CPU_SHARE = 0.3
"""Below this, a late loop was not busy with its own work: something else had the CPU."""


class DelayProbe:
    """Measures how long a network read waits for the event loop, from outside the loop.

    A thread writes its `perf_counter` stamp to a socket pair every period;
    the loop's reader callback reads the stamps and records the wait of each.
    The thread is not held up by a busy or blocked loop (a blocked loop still
    gets stamps, read late all at once), so the samples cover stalls the way
    real reads meet them; a ticker on the loop itself misses what happens
    while it cannot run, and its own timer granularity (~0.3 ms on uvloop)
    would read as delay.
    """

    _STAMP = struct.Struct("d")

    def __init__(self, in_flight: Callable[[], int], period: float = PROBE_PERIOD_S) -> None:
        self.in_flight = in_flight
        self.period = period
        self.at: list[float] = []
        """perf_counter time each probe was written."""
        self.lags: list[float] = []
        self.weights: list[int] = []
        """Requests in flight when each probe was read."""
        self._stop = threading.Event()
        self._socks: tuple[socket.socket, socket.socket] | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._buf = b""

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        reader, writer = socket.socketpair()
        reader.setblocking(False)
        self._socks = (reader, writer)
        self._loop.add_reader(reader.fileno(), self._on_read)
        self._thread = threading.Thread(target=self._write, daemon=True, name="servelab-delay-probe")
        self._thread.start()

    def _write(self) -> None:
        assert self._socks is not None
        writer = self._socks[1]
        while not self._stop.wait(self.period):
            try:
                writer.send(self._STAMP.pack(time.perf_counter()))
            except OSError:
                return

    def _on_read(self) -> None:
        now = time.perf_counter()
        assert self._socks is not None
        try:
            data = self._buf + self._socks[0].recv(65536)
        except BlockingIOError:
            return
        size = self._STAMP.size
        whole = len(data) - len(data) % size
        self._buf = data[whole:]
        weight = self.in_flight()
        for (stamp,) in self._STAMP.iter_unpack(data[:whole]):
            self.at.append(stamp)
            self.lags.append(now - stamp)
            self.weights.append(weight)

    async def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
            self._thread = None
        if self._socks is not None and self._loop is not None:
            self._loop.remove_reader(self._socks[0].fileno())
            for sock in self._socks:
                sock.close()
            self._socks = None


def ms_stats(name: str, values_s: Sequence[float]) -> dict[str, float | None]:
    """Median, p99 and max of `values_s` in milliseconds, keyed `median_{name}_ms`...; None each when empty."""
    if not values_s:
        return {f"median_{name}_ms": None, f"p99_{name}_ms": None, f"max_{name}_ms": None}
    arr = np.asarray(values_s, dtype=float) * 1e3
    p50, p99 = np.percentile(arr, [50, 99])
    return {f"median_{name}_ms": float(p50), f"p99_{name}_ms": float(p99), f"max_{name}_ms": float(arr.max())}


def _weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    order = np.argsort(values)
    cum = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cum, q / 100 * cum[-1])])


def added_delay(lags_s: Sequence[float] | np.ndarray, weights: Sequence[int] | np.ndarray) -> dict[str, float] | None:
    """Estimated delay the client added to each timestamp: probe waits weighted by the requests they affected."""
    w = np.asarray(weights, dtype=float)
    if not len(w) or w.sum() <= 0:
        return None
    v = np.asarray(lags_s, dtype=float) * 1e3
    return {
        "mean_ms": float(np.average(v, weights=w)),
        "median_ms": _weighted_percentile(v, w, 50),
        "p99_ms": _weighted_percentile(v, w, 99),
        "samples": int((w > 0).sum()),
    }


def startup_wave(intended: Sequence[float], sends: Sequence[float]) -> tuple[dict[str, float], np.ndarray]:
    """The requests due at the run's first instant, how long they took to leave; and the mask of them."""
    due = np.asarray(intended, dtype=float)
    sent = np.asarray(sends, dtype=float)
    mask = due <= due.min() + WAVE_SPAN_S
    lags = (sent[mask] - due[mask]) * 1e3
    wave = {
        "requests": int(mask.sum()),
        "left_within_ms": float(lags.max()),
        "median_send_lag_ms": float(np.percentile(lags, 50)),
        "ended_at_s": float(sent[mask].max()),
    }
    return wave, mask


def client_stats(
    schedule_lags_s: Sequence[float],
    loop_lags_s: Sequence[float],
    cpu_seconds: float,
    wall_seconds: float,
    processes: int = 1,
    *,
    intended_s: Sequence[float] | None = None,
    loop_at_s: Sequence[float] | None = None,
    loop_weights: Sequence[int] | None = None,
    typical_gap_ms: float | None = None,
    mean_lifetime_ms: float | None = None,
) -> dict[str, object]:
    """Overhead numbers, the distortion they imply, and a verdict the summary warns with only when it is material.

    `cpu_share` is per process (CPU seconds / wall seconds / processes), so it
    reads as "fraction of one core" whatever the number of workers. Times in
    `intended_s` and `loop_at_s` share one clock (run time); `typical_gap_ms`
    (the run's median inter-token gap, else its median TTFT) and
    `mean_lifetime_ms` (mean request latency) set what counts as material.
    Without the probe's weights every loop sample counts once.
    """
    stats: dict[str, object] = {}
    stats.update(ms_stats("schedule_lag", schedule_lags_s))
    stats.update(ms_stats("loop_lag", loop_lags_s))
    cpu_share = cpu_seconds / wall_seconds / processes if wall_seconds > 0 else 0.0
    stats["cpu_share"] = cpu_share
    stats["processes"] = processes

    lags = np.asarray(schedule_lags_s, dtype=float)
    loop_lags = np.asarray(loop_lags_s, dtype=float)
    weights = np.asarray(loop_weights if loop_weights is not None else [1] * len(loop_lags), dtype=float)
    steady_lags = lags
    if intended_s is not None and len(lags):
        wave, in_wave = startup_wave(intended_s, lags + np.asarray(intended_s, dtype=float))
        stats["startup_wave"] = wave
        if not in_wave.all():
            steady_lags = lags[~in_wave]
            if loop_at_s is not None and len(loop_lags):
                after = np.asarray(loop_at_s, dtype=float) > wave["ended_at_s"]
                if after.any():
                    loop_lags, weights = loop_lags[after], weights[after]
    delay = added_delay(loop_lags, weights)
    stats["added_delay"] = delay
    stats["mean_steady_send_lag_ms"] = float(steady_lags.mean() * 1e3) if len(steady_lags) else None
    stats["typical_gap_ms"] = typical_gap_ms

    reasons = _material(stats, delay, typical_gap_ms, mean_lifetime_ms, cpu_share)
    if reasons and cpu_share <= CPU_SATURATED:
        reasons.append(f"client CPU at {cpu_share:.0%} of a core")
    if reasons and delay is not None and cpu_share < STARVED_CPU_SHARE and delay["p99_ms"] > 10 * ADDED_DELAY_FLOOR_MS:
        reasons.append(
            f"with only {cpu_share:.0%} of a core in use the client was waiting for a CPU, not busy: on a "
            "shared host, a server started from another login session is scheduled as a group of its own "
            "(Linux autogroup) and can starve it; start the server from the same shell, or run the client elsewhere"
        )
    stats["client_may_be_bottleneck"] = bool(reasons)
    stats["reason"] = "; ".join(reasons) if reasons else _clean_bill(delay)
    return stats


def _material(
    stats: dict[str, object],
    delay: dict[str, float] | None,
    typical_gap_ms: float | None,
    mean_lifetime_ms: float | None,
    cpu_share: float,
) -> list[str]:
    """Each distortion that is large enough to change a figure a user reads, said with its size."""
    reasons = []
    if cpu_share > CPU_SATURATED:
        reasons.append(f"client CPU at {cpu_share:.0%} of a core (saturated: its delays grow without bound)")
    if delay is not None:
        mean = delay["mean_ms"]
        bar = (
            ADDED_DELAY_FLOOR_MS
            if typical_gap_ms is None
            else max(ADDED_DELAY_FLOOR_MS, ADDED_DELAY_SHARE * typical_gap_ms)
        )
        if mean >= bar:
            of_gap = (
                f", {mean / typical_gap_ms:.0%} of the median inter-token gap ({typical_gap_ms:.1f} ms)"
                if typical_gap_ms
                else ""
            )
            reasons.append(
                f"it added ~{mean:.1f} ms (p99 {delay['p99_ms']:.1f} ms) to each timestamp it took{of_gap}: "
                "TTFT and inter-token latencies read that much high"
            )
    steady = stats["mean_steady_send_lag_ms"]
    if isinstance(steady, float) and mean_lifetime_ms and steady >= ADDED_DELAY_FLOOR_MS:
        share = steady / mean_lifetime_ms
        if share >= SEND_LAG_SHARE:
            reasons.append(
                f"after the start-up wave requests left {steady:.1f} ms late on average, "
                f"{share:.0%} of a request's {mean_lifetime_ms:.0f} ms: about that much less load was offered than "
                f"planned"
            )
    return reasons


def _clean_bill(delay: dict[str, float] | None) -> str:
    if delay is None:
        return "client kept up with its schedule"
    return (
        f"client kept up with its schedule: ~{delay['mean_ms']:.2f} ms added to each timestamp "
        f"(p99 {delay['p99_ms']:.2f} ms)"
    )
