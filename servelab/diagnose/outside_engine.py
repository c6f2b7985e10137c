"""The part of the first token's time spent outside the engine core, divided by the client's HTTP phases.

The server's histograms split the client's mean TTFT into queue, prefill and
the rest (servelab/metrics/server_timings.py); the rest is "API server &
network". The client's own HTTP phases per record (connect, send, wait for
the first byte; servelab/metrics/http_phases.py) say how much of that rest the
network cost: the handshake of new connections and the send are paid on the
client's clock before the server sees a byte, and a new connection's TCP
handshake is one round trip, the same round trip every request pays for its
bytes to reach the server and its first byte to come back. What remains is
the API server's own: HTTP parsing, tokenization, its event loop and CPU
queue, the trip to the engine core and back, detokenizing and streaming.

Means over the same requests the split uses (completed, with a first token),
so the parts add up to the split's "API server & network" exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from statistics import mean, median

from servelab.metrics.records import RequestRecord
from servelab.schemas.diagnosis import OutsideEngine, TtftSplit


def outside_engine(records: Sequence[RequestRecord], split: TtftSplit | None) -> OutsideEngine | None:
    """The breakdown of `split`'s API server & network part; None without a split or without HTTP phases (the
    simulator's records)."""
    if split is None:
        return None
    timed = [r for r in records if r.ok and r.ttft is not None and r.connection_reused is not None]
    if not timed:
        return None
    connects = [r.http_connect_s for r in timed if r.http_connect_s is not None]
    connect = sum(connects) / len(timed)
    send = mean(r.http_send_s or 0.0 for r in timed)
    rtt = median(connects) if connects else None
    waits = [r.http_wait_s for r in timed if r.http_wait_s is not None]
    api = max(0.0, split.api_server_s - connect - send - (rtt or 0.0))
    return OutsideEngine(
        outside_s=split.api_server_s,
        connect_s=connect,
        send_s=send,
        round_trip_s=rtt,
        api_server_s=api,
        new_connection_share=sum(r.connection_reused is False for r in timed) / len(timed),
        first_byte_s=mean(waits) if waits else None,
    )


def describe(o: OutsideEngine) -> str:
    """One line: 'of the 1544 ms outside the engine core, 0.1 ms network (...) and 1543 ms the API server (...)'."""
    if o.round_trip_s is not None:
        trip = f"one {1e3 * o.round_trip_s:.1f} ms round trip, the median handshake"
        api = "the API server"
    else:
        trip = "round trip unknown: every connection was reused, so no handshake timed it"
        api = "the API server and the network's round trip"
    first_byte = (
        f"; the response's first byte came {1e3 * o.first_byte_s:.0f} ms after the request was sent"
        if o.first_byte_s is not None
        else ""
    )
    return (
        f"of the {1e3 * o.outside_s:.0f} ms outside the engine core, {1e3 * o.network_s:.1f} ms was the network "
        f"(connect {1e3 * o.connect_s:.1f} ms with {100 * o.new_connection_share:.0f}% of requests opening a "
        f"connection, send {1e3 * o.send_s:.1f} ms, {trip}) and {1e3 * o.api_server_s:.0f} ms {api} (HTTP, "
        f"tokenization, its CPU queue, the trip to the engine core, streaming){first_byte}"
    )
