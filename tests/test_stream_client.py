"""The streaming client's HTTP/1.1 response parser, fed the same bytes cut into reads every possible way."""

from __future__ import annotations

import asyncio

import pytest

from servelab.targets.stream_client import ProtocolError, _Exchange

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
EVENTS = [b'data: {"n":1}\n\n', b'data: {"n":22}\n\n', b"data: [DONE]\n\n"]


def chunked(parts: list[bytes], ext: bytes = b"") -> bytes:
    return b"".join(b"%x%s\r\n%s\r\n" % (len(p), ext, p) for p in parts) + b"0\r\nX-Trailer: 1\r\n\r\n"


def parse(reads: list[bytes]) -> tuple[bytes, list[int], asyncio.Future[int]]:
    """Feed the reads; returns the body seen, how many callback calls each read caused, and the done future."""
    loop = asyncio.new_event_loop()
    body: list[bytes] = []
    ex = _Exchange(lambda data, t: body.append(data), loop.create_future())
    calls = []
    for read in reads:
        before = len(body)
        ex.feed(read, 0.0)
        calls.append(len(body) - before)
    loop.close()
    return b"".join(body), calls, ex.done


@pytest.mark.parametrize("ext", [b"", b";name=value"])
def test_a_chunked_body_cut_anywhere_is_reassembled_and_completes(ext):
    stream = HEAD + chunked(EVENTS, ext)
    for cut in range(1, len(stream)):
        for second in (cut, min(len(stream) - 1, cut + 7)):
            reads = [stream[:cut], stream[cut:second], stream[second:]]
            body, _, done = parse([r for r in reads if r])
            assert body == b"".join(EVENTS), (cut, second)
            assert done.done() and done.result() == 200, (cut, second)


def test_a_read_carrying_many_chunks_reaches_the_callback_once():
    body, calls, done = parse([HEAD, chunked(EVENTS * 5)])
    assert body == b"".join(EVENTS * 5) and calls == [0, 1] and done.result() == 200


def test_a_content_length_body_completes_at_its_length():
    payload = b'{"error":"no"}'
    stream = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(payload), payload)
    for cut in range(1, len(stream)):
        body, _, done = parse([stream[:cut], stream[cut:]])
        assert body == payload and done.result() == 200


@pytest.mark.parametrize(
    "bad",
    [HEAD + b"5\r\nhelloXX", HEAD + b"zz\r\nhello\r\n", b"SMTP ready\r\n\r\n"],
    ids=["missing chunk CRLF", "bad size line", "not HTTP"],
)
def test_broken_framing_is_a_protocol_error(bad):
    with pytest.raises(ProtocolError):
        parse([bad])
