"""Incremental Server-Sent Events decoding for streamed completions.

Network reads split events anywhere (mid-line, mid-JSON), and a single read
often carries several events when the client falls behind, so the decoder
keeps the partial line between reads and returns every complete `data`
payload at once. It works on bytes: decoding to str and back would cost a
copy per chunk on the hottest path of the load generator.
"""

from __future__ import annotations

DONE = b"[DONE]"


class SSEDecoder:
    """Turns raw body bytes into the `data` payloads of complete events.

    Follows the SSE rules that matter for OpenAI-style streams: events end at
    a blank line, several `data:` lines of one event are joined with a newline,
    lines starting with `:` are comments (keep-alive pings), other fields
    (`event:`, `id:`, `retry:`) are ignored, and CRLF line ends are accepted.

    It splits on the blank line first and takes the common event, one
    `data: ` line, with a single slice; only other events are parsed line by
    line. That halves the decoder's cost per streamed token.
    """

    __slots__ = ("_partial",)

    def __init__(self) -> None:
        self._partial = b""
        """The bytes of the event still being received (CRLF already folded to LF)."""

    def feed(self, chunk: bytes) -> list[bytes]:
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n")
        if self._partial:
            chunk = self._partial + chunk
            if b"\r\n" in chunk:  # a CRLF split across two reads
                chunk = chunk.replace(b"\r\n", b"\n")
        events = chunk.split(b"\n\n")
        self._partial = events.pop()
        payloads: list[bytes] = []
        for event in events:
            if event.startswith(b"data: ") and b"\n" not in event:
                payloads.append(event[6:])
            elif event:
                payload = _parse_event(event)
                if payload is not None:
                    payloads.append(payload)
        return payloads

    def close(self) -> list[bytes]:
        """Payloads still pending when the body ends without a final blank line.

        Strict SSE would drop them; servers that omit the last separator are
        common enough that keeping the data is the more useful reading.
        """
        events = self.feed(b"\n\n") if self._partial.strip(b"\n") else []
        self._partial = b""
        return events


def _parse_event(event: bytes) -> bytes | None:
    """The joined `data` lines of one event, or None when it has none (a comment, a bare `event:`)."""
    data = [
        line[6:] if line.startswith(b"data: ") else line[5:] for line in event.split(b"\n") if line.startswith(b"data:")
    ]
    if not data:
        return None
    return data[0] if len(data) == 1 else b"\n".join(data)
