"""Over-saturation: is the server falling behind an open-loop load for good, decided from the point's own data.

An open loop offers requests at a rate whatever the server does. When the
server serves fewer per second than arrive, the requests due but not done
(the backlog) grow linearly, and so does every new request's TTFT, since it
waits behind them: "TTFT and queue growing without bound". A point in that
state measures only how long the run lasted, so `--sweep auto` stops
releasing its requests as soon as both trends are established (GuideLLM's
over-saturation stop does the same), and the requests in flight finish on
their own, each with its record.

Both trends must hold, each with a one-sided linear-regression test, because
either alone misleads: a burst raises the backlog for a while and a long
prompt raises one TTFT; and the backlog must have outgrown what a server that
keeps up holds in flight (Little's law), which a few slow requests do not.
The backlog is sampled on a grid over the latter half of the time load was
offered: before that it fills to rate x latency even on a server that keeps
up, and after the last arrival it only drains. The guard waits for
`MIN_FINISHED` records and `MIN_SECONDS` of run before it judges, and checks
at most every `CHECK_EVERY_S`, so its cost stays off the client's hot path.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from servelab.metrics.records import RequestRecord
from servelab.workload.spec import RequestSpec

MIN_FINISHED = 8
"""Records needed before a verdict: fewer cannot show a trend against noise."""
MIN_SECONDS = 2.0
"""Run time before a verdict: the start-up wave's own backlog is not saturation."""
CHECK_EVERY_S = 0.25
"""Wall-clock seconds between two judgements during a run, at least."""
MAX_LOOP_SHARE = 0.02
"""The share of the event loop's time judging may take: a long run's judgement (sorting every record) is spaced
out so that its stalls stay a small part of the client's time."""
FALLING_BEHIND = 0.1
"""The backlog must grow by at least this share of the offered rate (the server serves < 90% of it)."""
TTFT_RISE = 1.5
"""The latest third's median TTFT must be at least this multiple of the first third's."""
GRID = 64
"""Instants the backlog is sampled at, evenly over the time load was offered."""
P_VALUE = 0.05
"""One-sided significance of each slope."""
LITTLE_MARGIN = 2.0
"""Requests by which the backlog must exceed what a server that keeps up holds in flight by Little's law (the
offered rate x the median time the requests finished by then took): the grid's samples of a backlog that stepped
from 0 to 1 are not independent, so its slope can pass the test while all it shows is a few slower requests."""


@dataclass(frozen=True)
class Verdict:
    """What the guard concluded, with the numbers it rests on."""

    at_s: float
    """Run time up to which the backlog was judged (the last finish seen, or the last arrival if earlier)."""
    backlog_slope: float
    """Requests per second the backlog (due minus finished) grew by."""
    backlog: int
    ttft_first_ms: float
    ttft_last_ms: float

    def describe(self) -> str:
        return (
            f"over-saturated at {self.at_s:.1f} s: the backlog grew {self.backlog_slope:.2f} req/s (to {self.backlog} "
            f"requests), TTFT rose from {self.ttft_first_ms:.0f} to {self.ttft_last_ms:.0f} ms"
        )


def judge(records: Sequence[RequestRecord], arrivals: Sequence[float], offered_rate: float) -> Verdict | None:
    """The verdict on the records finished so far, given every arrival time due; None while the server keeps up."""
    ttft = [r.ttft if r.ok and r.ttft is not None else math.nan for r in records]
    return judge_arrays(arrivals, [r.finish_time for r in records], [r.send_time for r in records], ttft, offered_rate)


def judge_arrays(
    arrivals: Sequence[float],
    finishes: Sequence[float],
    sends: Sequence[float],
    ttfts: Sequence[float],
    offered_rate: float,
) -> Verdict | None:
    """`judge` on columns (one entry per finished request; TTFT NaN where there is none): numpy throughout: about
    1 ms per thousand finished requests on the client's event loop (35-100 ms at 100,000), which the guard
    spaces out to at most MAX_LOOP_SHARE of the loop's time. `arrivals` need not be sorted
    (a conversation's later turns arrive out of order)."""
    if len(finishes) < MIN_FINISHED or not len(arrivals):
        return None
    due_at, done_at = np.sort(np.asarray(arrivals, dtype=float)), np.sort(np.asarray(finishes, dtype=float))
    # While load is offered: after the last arrival the backlog drains, which says nothing about keeping up.
    end = min(done_at[-1], due_at[-1])
    if end - due_at[0] < MIN_SECONDS:
        return None
    # The latter half only: at first the backlog fills to rate x latency (Little's law) even when the server keeps up.
    from scipy import stats  # scipy only where a run is judged: the CLI's start-up stays light

    grid = np.linspace((due_at[0] + end) / 2, end, GRID)
    backlog = np.searchsorted(due_at, grid, side="right") - np.searchsorted(done_at, grid, side="right")
    fit = stats.linregress(grid, backlog, alternative="greater")
    if not (fit.slope >= FALLING_BEHIND * offered_rate and fit.pvalue < P_VALUE):
        return None
    sent, ttft = np.asarray(sends, dtype=float), np.asarray(ttfts, dtype=float)
    finish = np.asarray(finishes, dtype=float)
    took = (finish - sent)[finish <= end]
    in_flight = offered_rate * float(np.median(took)) if took.size else 0.0
    if backlog[-1] < in_flight + LITTLE_MARGIN:
        return None
    keep = (sent <= end) & ~np.isnan(ttft)
    if keep.sum() < MIN_FINISHED:
        return None
    order = np.argsort(sent[keep])
    sent, ttft = sent[keep][order], ttft[keep][order]
    if np.ptp(sent) <= 0:
        return None
    third = max(1, len(ttft) // 3)
    first, last = float(np.median(ttft[:third])), float(np.median(ttft[-third:]))
    trend = stats.linregress(sent, ttft, alternative="greater")
    if not (trend.pvalue < P_VALUE and last >= TTFT_RISE * first):
        return None
    return Verdict(float(end), float(fit.slope), int(backlog[-1]), first * 1e3, last * 1e3)


class SaturationGuard:
    """Watches one open-loop point: a record sink (finished requests) and a wrapper of the plan's requests
    (arrivals). Once `judge` says over-saturated, the wrapped plan yields nothing more when `stop` (`--sweep auto`);
    a point the user asked for by name (`--sweep request-rate=...`) runs to its end with the verdict noted."""

    def __init__(self, offered_rate: float, stop: bool = True) -> None:
        self.offered_rate = offered_rate
        self.stop = stop
        self.arrivals: list[float] = []
        self.records: list[RequestRecord] = []
        self._finishes: list[float] = []
        self._sends: list[float] = []
        self._ttfts: list[float] = []
        self.verdict: Verdict | None = None
        self._next_check = 0.0

    def requests(self, specs: Iterable[RequestSpec]) -> Iterator[RequestSpec]:
        """The plan's requests until a verdict; the release loop reads them lazily, so it stops there."""
        for spec in specs:
            if self.stop and self.verdict is not None:
                return
            self.arrivals.append(spec.arrival_time)
            yield spec

    def write(self, record: RequestRecord) -> None:
        self.records.append(record)
        self._finishes.append(record.finish_time)
        self._sends.append(record.send_time)
        ttft = record.ttft
        self._ttfts.append(ttft if record.ok and ttft is not None else math.nan)
        now = time.monotonic()
        if self.verdict is None and now >= self._next_check:
            self.verdict = judge_arrays(self.arrivals, self._finishes, self._sends, self._ttfts, self.offered_rate)
            cost = time.monotonic() - now  # it runs on the client's event loop: keep it to a small share of it
            self._next_check = now + max(CHECK_EVERY_S, cost / MAX_LOOP_SHARE)

    @property
    def stopped_early(self) -> bool:
        """Release stopped at a verdict (sweep.json's `stopped_early`)."""
        return self.stop and self.verdict is not None

    def final(self) -> Verdict | None:
        """The verdict during the run, else one on every record (a trend may show only at the end)."""
        return self.verdict or judge_arrays(self.arrivals, self._finishes, self._sends, self._ttfts, self.offered_rate)


def over_saturated(guard: SaturationGuard) -> str | None:
    """A sweep point's `over_saturated` (sweep.json): the trends that showed it in words, None when the server kept
    up."""
    verdict = guard.final()
    return verdict.describe() if verdict is not None else None
