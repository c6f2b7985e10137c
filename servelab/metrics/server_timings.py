"""Where a request's time to first token went: the API server and network, the engine's queue, prefill.

The client measures TTFT from the moment it sent the request; vLLM measures
its own spans per request and exports them as histograms:

- `vllm:time_to_first_token_seconds`: from the request's arrival in the API
  server's engine client (after HTTP parsing and tokenization) to its first
  token leaving the output processor;
- `vllm:request_queue_time_seconds`: from the engine core queueing it to
  first scheduling it (waiting for a sequence slot, KV blocks or token budget);
- `vllm:request_prefill_time_seconds`: from first scheduling to first token
  in the engine core (the prompt's forward passes, chunked or not);
- decode and inference time, and the server's end-to-end latency, likewise.

Histograms' `_sum`/`_count` increase over a run (scraped before its first
request and after its last) give each span's mean over the run's requests,
and together with the client's mean TTFT they split it into parts that sum
to it exactly:

    client TTFT = API server & network + queued in the engine + prefill

where "API server & network" is everything outside the engine core: the
network, HTTP, tokenization, queueing for the API server's CPU, the trip to
the engine core and back (client TTFT - server TTFT, plus server TTFT -
queue - prefill, both kept as details).

Only means can be split: per-request spans are not exported, and a histogram's
sum/count is exact where its buckets are not. The simulator exports the same
names (servelab/sim/vllm_metrics.py) except the queue time, which it
does not yet; there the queue is the engine's TTFT minus prefill (exact in
the simulator, which has no transfer between API server and engine core).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from servelab import SCHEMA_VERSION
from servelab.metrics import timeline as tl
from servelab.metrics.records import RequestRecord
from servelab.metrics.results import SWEEP, load_run
from servelab.metrics.timeline import TimelineSample, counter_delta
from servelab.renames import upgraded
from servelab.schemas.diagnosis import TtftSplit

COUNT_MISMATCH = 0.02
"""Server and client counts further apart than this share: the server served other traffic, or requests failed
after their first token; the parts are then means over different request sets."""


def _mean(samples: Sequence[TimelineSample], sum_name: str, count_name: str) -> tuple[float, int] | None:
    total, count = counter_delta(list(samples), sum_name), counter_delta(list(samples), count_name)
    if total is None or not count:
        return None
    return total / count, round(count)


def ttft_split(records: Sequence[RequestRecord], samples: Sequence[TimelineSample]) -> TtftSplit | None:
    """The split of this run's mean client TTFT; None without a first token or without the server's histograms.

    `samples` must bracket the run (a scrape before its first request and
    after its last, as bench and simulate take them) so that the histograms'
    increases cover exactly the run's requests.
    """
    ttfts = [r.ttft for r in records if r.ok and r.ttft is not None]
    server = _mean(samples, tl.TTFT_SUM, tl.TTFT_COUNT)
    prefill = _mean(samples, tl.PREFILL_TIME_SUM, tl.PREFILL_TIME_COUNT)
    if not ttfts or server is None or prefill is None:
        return None
    client = sum(ttfts) / len(ttfts)
    (server_ttft, server_n), (prefill_s, prefill_n) = server, prefill
    queue = _mean(samples, tl.QUEUE_TIME_SUM, tl.QUEUE_TIME_COUNT)
    queue_s = queue[0] if queue is not None else max(0.0, server_ttft - prefill_s)
    notes = []
    counts = {"client": len(ttfts), "server TTFT": server_n, "prefill": prefill_n}
    if queue is not None:
        counts["queue"] = queue[1]
    if max(counts.values()) - min(counts.values()) > COUNT_MISMATCH * max(counts.values()):
        notes.append(
            "request counts differ (" + ", ".join(f"{k} {v}" for k, v in counts.items()) + "): "
            "the server served other requests too, or requests failed after their first token"
        )
    if queue_s + prefill_s > client:
        # Means over different request sets can exceed the client's: keep the engine's proportions, no negative part.
        scale = client / (queue_s + prefill_s)
        notes.append(
            f"the engine's queue + prefill ({1e3 * (queue_s + prefill_s):.0f} ms) exceed the client's "
            f"TTFT ({1e3 * client:.0f} ms); scaled to fit"
        )
        queue_s, prefill_s = queue_s * scale, prefill_s * scale
    e2e = _mean(samples, tl.E2E_SUM, tl.E2E_COUNT)
    decode = _mean(samples, tl.DECODE_TIME_SUM, tl.DECODE_TIME_COUNT)
    return TtftSplit(
        client_ttft_s=client,
        api_server_s=max(0.0, client - queue_s - prefill_s),
        queue_s=queue_s,
        prefill_s=prefill_s,
        server_ttft_s=server_ttft,
        requests=len(ttfts),
        server_requests=server_n,
        queue_measured=queue is not None,
        server_e2e_s=e2e[0] if e2e else None,
        decode_s=decode[0] if decode else None,
        notes=tuple(notes),
    )


def sweep_ttft_splits(directory: Path) -> list[tuple[str, TtftSplit | None]]:
    """Each point of a sweep (sweep.json's order) with its split: how the TTFT's parts move with the load.

    Every point is its own run with its own bracketing scrapes, so each split
    covers exactly that point's requests.
    """
    index = upgraded(json.loads((directory / SWEEP).read_text(encoding="utf-8")), SCHEMA_VERSION)
    out = []
    for point in index["points"]:
        run = load_run(directory / point["directory"])
        out.append((point["directory"], ttft_split(run.records, run.timeline)))
    return out


def describe(split: TtftSplit, queue_reason: str = "") -> str:
    """One line: 'TTFT mean 900 ms: 20 ms API server & network, 830 ms queued in the engine, 50 ms prefill'."""
    reason = f" ({queue_reason})" if queue_reason else ""
    return (
        f"TTFT mean {1e3 * split.client_ttft_s:.0f} ms: {1e3 * split.api_server_s:.0f} ms API server & network, "
        f"{1e3 * split.queue_s:.0f} ms queued in the engine{reason}, {1e3 * split.prefill_s:.0f} ms prefill "
        f"(the server's own TTFT {1e3 * split.server_ttft_s:.0f} ms, over {split.server_requests} requests)"
    )
