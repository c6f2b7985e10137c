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
    """

    __slots__ = ("_partial", "_data")

    def __init__(self) -> None:
        self._partial = b""
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[bytes]:
        if self._partial:
            chunk = self._partial + chunk
        lines = chunk.split(b"\n")
        self._partial = lines.pop()
        events: list[bytes] = []
        data = self._data
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if data:
                    events.append(data[0] if len(data) == 1 else b"\n".join(data))
                    data.clear()
            elif line.startswith(b"data:"):
                value = line[5:]
                data.append(value[1:] if value.startswith(b" ") else value)
        return events

    def close(self) -> list[bytes]:
        """Payloads still pending when the body ends without a final blank line.

        Strict SSE would drop them; servers that omit the last separator are
        common enough that keeping the data is the more useful reading.
        """
        events = self.feed(b"\n\n") if (self._partial or self._data) else []
        self._partial = b""
        return events
