"""A lean HTTP/1.1 client for streamed responses, built on asyncio protocols.

Why not aiohttp for the stream itself: a general client hands every network
read to a StreamReader and wakes the request's task to consume it, so with
256 streams producing a chunk each engine step the 256th chunk of a step is
timestamped only after 255 task switches. Here the body is decoded inside
`data_received`, with the clock read the moment the bytes arrive, and the
request's task wakes once, at the end. That halves the CPU per chunk and
keeps the client's timing error under a few milliseconds at 256 streams
(benchmarks/client_capacity.py). aiohttp stays in use for everything that
is not on the hot path (pre-flight, /metrics).

Scope: what OpenAI-compatible servers send: `Content-Length`, chunked or
close-delimited bodies, keep-alive, http and https. No redirects, no
compression (the request does not offer any), no proxies.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from typing import NamedTuple
from urllib.parse import urlsplit

from servelab.errors import ServerFault

BodyCallback = Callable[[bytes, float], None]
"""Receives decoded body bytes and the perf_counter time their network read arrived."""

_HEAD, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _LENGTH, _UNTIL_EOF, _DONE = range(8)
MAX_HEAD = 65536


class ConnectError(ServerFault, OSError):
    """The server could not be reached (unresolvable, connect timeout)."""


class RefusedError(ConnectError):
    """Nothing listens at the server's address: it has exited, or never started."""


class ResetError(ServerFault, ConnectionResetError):
    """The connection ended before the response was complete."""


class ProtocolError(ServerFault, ValueError):
    """The server's bytes are not a valid HTTP/1.1 response."""


class Phases(NamedTuple):
    """Where one request's time went on the wire (perf_counter times; AIPerf's breakdown): the evidence that
    separates network and API-server time from the engine's. `connect_s` is None on a kept-alive connection."""

    connect_s: float | None
    """TCP (and TLS) handshake of a new connection; None when a kept-alive one was reused."""
    sent: float
    """The request's bytes were handed to the kernel (one write; a body larger than the socket buffer may still be
    leaving, which shows as wait)."""
    first_byte: float | None
    """The response's first byte arrived (status line and headers: the server accepted the request)."""
    last_byte: float


class Response(NamedTuple):
    """What is left of a response once its body has gone to the callback."""

    status: int
    error_body: bytes
    """The first 64 KiB of a non-200 body (the server's error message); empty for 200."""
    last_read: float
    """perf_counter time of the response's last network read."""
    retry_after: str | None
    """A non-200 response's Retry-After header, as sent (seconds or an HTTP date)."""
    phases: Phases


class _Exchange:
    """One request/response on a connection: parses the response incrementally."""

    __slots__ = (
        "on_body",
        "done",
        "state",
        "buf",
        "status",
        "remaining",
        "keep_alive",
        "got_bytes",
        "last_read",
        "error_body",
        "retry_after",
        "first_read",
        "sent",
    )

    def __init__(self, on_body: BodyCallback, done: asyncio.Future[int]) -> None:
        self.on_body = on_body
        self.error_body = b""
        self.retry_after: str | None = None
        """A non-200 response's Retry-After header (seconds or an HTTP date), as sent."""
        self.done = done
        self.state = _HEAD
        self.buf = b""
        self.status = 0
        self.remaining = 0
        self.keep_alive = True
        self.got_bytes = False
        self.last_read = 0.0
        self.first_read: float | None = None
        self.sent = 0.0

    def feed(self, data: bytes, t: float) -> None:
        """Parse one network read; its body bytes reach `on_body` in one call, however many chunks carried them.

        One call per read rather than per HTTP chunk: under load a read
        carries dozens of chunks, and the callback's fixed cost per call
        was a third of the client's CPU per streamed token.
        """
        data = self._after_buffered(data, t)
        state = self.state
        pos = 0
        n = len(data)
        body: list[bytes] = []
        while pos < n or state == _DONE:
            if state == _CHUNK_DATA or state == _LENGTH:
                pos, state = self._take(data, pos, body, state)
            elif state == _CHUNK_SIZE or state == _CHUNK_END or state == _TRAILER:
                eol = data.find(b"\r\n", pos)
                if eol < 0:
                    self.buf = data[pos:]
                    break
                line = data[pos:eol]
                pos = eol + 2
                if state == _CHUNK_END:
                    if line:
                        raise ProtocolError("chunk not followed by CRLF")
                    state = _CHUNK_SIZE
                elif state == _TRAILER:
                    if not line:
                        state = _DONE
                else:
                    try:
                        size = int(line, 16)
                    except ValueError:  # a chunk extension (`size;name=value`), rare enough to parse second
                        size = _extended_chunk_size(line)
                    end = pos + size
                    if size == 0:
                        state = _TRAILER
                    elif end + 2 <= n:  # the whole chunk is in this read: take it in one step
                        if data[end : end + 2] != b"\r\n":
                            raise ProtocolError("chunk not followed by CRLF")
                        body.append(data[pos:end])
                        pos = end + 2
                    else:
                        self.remaining = size
                        state = _CHUNK_DATA
            elif state == _UNTIL_EOF:
                body.append(data[pos:])
                pos = n
            elif state == _HEAD:
                pos = self._head(data, pos)
                if pos < 0:
                    break
                state = self.state
            else:  # _DONE
                break
        self.state = state
        if body:
            self.on_body(body[0] if len(body) == 1 else b"".join(body), t)
        if state == _DONE and not self.done.done():
            self.done.set_result(self.status)

    def _take(self, data: bytes, pos: int, body: list[bytes], state: int) -> tuple[int, int]:
        """Up to the `remaining` bytes of a chunk (`_CHUNK_DATA`) or of a Content-Length body (`_LENGTH`) from `pos`,
        the read itself uncopied when it is all body; the position after them and the state that follows."""
        n = len(data)
        take = min(self.remaining, n - pos)
        body.append(data[pos : pos + take] if (pos or take < n) else data)
        self.remaining -= take
        if self.remaining == 0:
            state = _CHUNK_END if state == _CHUNK_DATA else _DONE
        return pos + take, state

    def _after_buffered(self, data: bytes, t: float) -> bytes:
        """This read's bytes after what an earlier read left unparsed (a line or head cut in two); notes the read."""
        if not self.got_bytes:
            self.got_bytes = True
            self.first_read = t
        self.last_read = t
        if self.buf:
            data = self.buf + data
            self.buf = b""
        return data

    def _head(self, data: bytes, pos: int) -> int:
        """The response head starting at `pos`, parsed (`self.state` becomes the body's framing): the position after
        it, or -1 when it is not all here yet (kept for the next read)."""
        end = data.find(b"\r\n\r\n", pos)
        if end < 0:
            if len(data) - pos > MAX_HEAD:
                raise ProtocolError("response head too large")
            self.buf = data[pos:]
            return -1
        self.state = self._parse_head(data[pos:end])
        return end + 4

    def _parse_head(self, head: bytes) -> int:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise ProtocolError(f"not an HTTP/1.x response: {lines[0][:60]!r}")
        self.status = int(parts[1])
        if self.status != 200:
            self.on_body = self._collect_error
        self.keep_alive = parts[0] != "HTTP/1.0"
        length: int | None = None
        chunked = False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            value = value.strip().lower()
            if name == "transfer-encoding":
                chunked = "chunked" in value
            elif name == "content-length":
                length = int(value)
            elif name == "connection":
                self.keep_alive = value != "close"
            elif name == "retry-after" and self.status != 200:
                self.retry_after = line.partition(":")[2].strip()
        if chunked:
            return _CHUNK_SIZE
        if length is not None:
            self.remaining = length
            return _LENGTH if length else _DONE
        self.keep_alive = False
        return _UNTIL_EOF

    def _collect_error(self, data: bytes, t: float) -> None:
        """A non-200 body is the server's error message, not a stream; keep its start."""
        if len(self.error_body) < MAX_HEAD:
            self.error_body += data[: MAX_HEAD - len(self.error_body)]

    def end_of_stream(self, exc: BaseException | None) -> None:
        """The connection closed: the end of a close-delimited body, else a reset."""
        if self.done.done():
            return
        if exc is None and self.state == _UNTIL_EOF:
            self.done.set_result(self.status)
        else:
            state = "before the response head" if self.state == _HEAD else "mid-response"
            reason = f": {exc}" if exc else ""
            error = ResetError(f"connection closed {state}{reason}")
            error.__cause__ = exc
            self.done.set_exception(error)


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.exchange: _Exchange | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        t = time.perf_counter()
        ex = self.exchange
        if ex is None:  # bytes nobody asked for: the connection cannot be trusted any more
            self.close()
            return
        try:
            ex.feed(data, t)
        except Exception as exc:  # a parse error or the body callback's own verdict ends this request
            if not ex.done.done():
                ex.done.set_exception(exc)
            self.close()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.exchange is not None:
            self.exchange.end_of_stream(exc)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class StreamingClient:
    """Keep-alive connections to one origin, one request per connection at a time."""

    def __init__(self, base_url: str, connect_timeout: float = 30.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.prefix = parts.path.rstrip("/")
        default_port = self.port == (443 if parts.scheme == "https" else 80)
        self.host_header = self.host if default_port else f"{self.host}:{self.port}"
        self.connect_timeout = connect_timeout
        self._idle: list[_Connection] = []

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(
                    _Connection, self.host, self.port, ssl=self.ssl, server_hostname=self.host if self.ssl else None
                )
        except (OSError, TimeoutError) as exc:
            error = RefusedError if isinstance(exc, ConnectionRefusedError) else ConnectError
            raise error(f"cannot connect to {self.host}:{self.port}: {exc or type(exc).__name__}") from exc
        return conn

    async def open(self, n: int) -> int:
        """Open `n` keep-alive connections ahead of use; returns how many opened.

        Connecting is not a request: done before a run's clock starts, the
        first wave's TTFT does not carry N handshakes made on the event loop at
        t0. A connection that fails here is not an error: the request that
        would have used it connects (and fails, and is recorded) on its own.
        """
        results = await asyncio.gather(*(self._connect() for _ in range(n)), return_exceptions=True)
        opened = [conn for conn in results if isinstance(conn, _Connection)]
        self._idle.extend(opened)
        return len(opened)

    def request_head(self, path: str, body_len: int, headers: dict[str, str]) -> bytes:
        lines = [f"POST {self.prefix}{path} HTTP/1.1", f"Host: {self.host_header}", f"Content-Length: {body_len}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def post(
        self,
        head: bytes,
        body: bytes,
        on_body: BodyCallback,
        timeout: float | None = None,
        idle_timeout: float | None = None,
    ) -> Response:
        """Send a request; returns its Response once the response is complete.

        A 200 body goes to `on_body` as it arrives; any other status's body
        is collected (its first 64 KiB) into the Response instead.

        A kept-alive connection that the server closed while idle fails
        before any byte of the response; that is retried once on a new
        connection, the only case where a retry cannot duplicate work.
        """
        async with asyncio.timeout(timeout):
            for attempt in (0, 1):
                reused = attempt == 0 and bool(self._idle)
                connect_s: float | None = None
                if reused:
                    conn = self._idle.pop()
                else:
                    start = time.perf_counter()
                    conn = await self._connect()
                    connect_s = time.perf_counter() - start
                try:
                    status = await self._exchange(conn, head + body, on_body, idle_timeout)
                    ex = conn.exchange
                    assert ex is not None
                    phases = Phases(connect_s, ex.sent, ex.first_read, ex.last_read)
                    return Response(status, ex.error_body, ex.last_read, ex.retry_after, phases)
                except ResetError:
                    ex = conn.exchange
                    if not (reused and attempt == 0 and ex is not None and not ex.got_bytes):
                        raise
                finally:
                    self._finish(conn)
        raise AssertionError("unreachable")

    async def _exchange(self, conn: _Connection, data: bytes, on_body: BodyCallback, idle: float | None) -> int:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[int] = loop.create_future()
        ex = _Exchange(on_body, done)
        ex.last_read = time.perf_counter()
        conn.exchange = ex
        if conn.closed or conn.transport is None:
            ex.end_of_stream(None)
        else:
            conn.transport.write(data)
        ex.sent = time.perf_counter()
        if idle is None:
            return await done
        handle = None

        def check_idle() -> None:
            nonlocal handle
            if done.done():
                return
            quiet = time.perf_counter() - ex.last_read
            if quiet >= idle:
                done.set_exception(TimeoutError(f"no bytes for {idle:g}s"))
            else:
                handle = loop.call_later(idle - quiet, check_idle)

        handle = loop.call_later(idle, check_idle)
        try:
            return await done
        finally:
            handle.cancel()

    def _finish(self, conn: _Connection) -> None:
        ex = conn.exchange
        complete = ex is not None and ex.done.done() and not ex.done.cancelled() and ex.done.exception() is None
        if complete and ex is not None and ex.keep_alive and not conn.closed:
            conn.exchange = None
            self._idle.append(conn)
        else:
            conn.exchange = None
            conn.close()

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()


def _extended_chunk_size(line: bytes) -> int:
    """The size of a chunk whose size line carries an extension (`size;name=value`)."""
    try:
        return int(line.split(b";", 1)[0], 16)
    except ValueError:
        raise ProtocolError(f"bad chunk size line {line[:40]!r}") from None
