"""Where the client's CPU per streamed chunk goes, without a network: the parser fed synthetic reads.

Feeds one chunked SSE response, cut into reads of 1, 4 and 16 chunks, through
the real `_Exchange` (HTTP framing) and `_StreamState` (SSE, JSON, the
record's timestamps), then the same reads with a no-op body callback (framing
alone) and the body straight into `_StreamState` (SSE + JSON + record alone).
Absolute microseconds depend on the machine; the split between the parts is
what this is for. benchmarks/client_capacity.py measures the whole client
against vLLM's.

Usage (from the repository root):
  .venv/bin/python benchmarks/client_hot_path.py [--chunks 20000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import timeit
from collections.abc import Callable

from servelab.metrics.records import RequestRecord
from servelab.targets.http import _StreamState
from servelab.targets.stream_client import _Exchange

EVENT = (
    b'data: {"id":"cmpl-1","object":"text_completion","model":"bench-model",'
    b'"choices":[{"index":0,"text":" tok","logprobs":null,"finish_reason":null}]}\n\n'
)
FRAME = b"%x\r\n%s\r\n" % (len(EVENT), EVENT)
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def _stream(per_read: int, reads: int, whole: bool, loop: asyncio.AbstractEventLoop) -> None:
    state = _StreamState(RequestRecord(0, 0.0, 0.0, 0.0), False, 0.0)
    on_body: Callable[[bytes, float], None] = state.on_body if whole else (lambda data, t: None)
    exchange = _Exchange(on_body, loop.create_future())
    exchange.feed(HEAD, 0.0)
    data = FRAME * per_read
    for _ in range(reads):
        exchange.feed(data, 1.0)


def _decode_only(per_read: int, reads: int) -> None:
    state = _StreamState(RequestRecord(0, 0.0, 0.0, 0.0), False, 0.0)
    data = EVENT * per_read
    for _ in range(reads):
        state.on_body(data, 1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    loop = asyncio.new_event_loop()
    print(f"{'chunks/read':>11} {'whole us/chunk':>15} {'framing':>8} {'sse+json+record':>16}")
    for per_read in (1, 4, 16):
        reads = args.chunks // per_read
        n = reads * per_read

        def best(fn: Callable[[], None]) -> float:
            return min(timeit.repeat(fn, number=1, repeat=args.repeat)) / n * 1e6

        whole = best(lambda: _stream(per_read, reads, True, loop))
        framing = best(lambda: _stream(per_read, reads, False, loop))
        decode = best(lambda: _decode_only(per_read, reads))
        print(f"{per_read:>11} {whole:>15.2f} {framing:>8.2f} {decode:>16.2f}")
    loop.close()


if __name__ == "__main__":
    main()
