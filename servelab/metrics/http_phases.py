"""The HTTP phase breakdown of a run's requests (connect, send, wait for the first byte, receive), summarised.

Each HTTP record carries its own phases (RequestRecord.http_*_s, measured in
servelab/targets/stream_client.py). Summarised they separate what the
network and the API server cost from what the engine did: a wait for the
first byte close to the TTFT says the headers came with the first token; a
connect share says how many requests paid a handshake on the clock.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from servelab.metrics.records import RequestRecord
from servelab.schemas.results import HttpPhases

PHASES = ("connect", "send", "wait", "receive")


def http_phases(records: Sequence[RequestRecord]) -> HttpPhases | None:
    """Mean, median and p99 (ms) of each phase over the records that have them, and the share of requests that
    reused a kept-alive connection; None when no record came over HTTP."""
    timed = [r for r in records if r.connection_reused is not None]
    if not timed:
        return None
    stats: dict[str, float | None] = {}
    for phase in PHASES:
        values = np.array([v for r in timed if (v := getattr(r, f"http_{phase}_s")) is not None], dtype=float) * 1e3
        for stat, fn in (("mean", np.mean), ("median", np.median), ("p99", lambda a: np.percentile(a, 99))):
            stats[f"{stat}_{phase}_ms"] = float(fn(values)) if values.size else None
    reused = sum(r.connection_reused is True for r in timed) / len(timed)
    return HttpPhases(requests=len(timed), connection_reused_share=reused, **stats)
