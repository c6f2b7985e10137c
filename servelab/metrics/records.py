"""`RequestRecord`: what happened to one request, whatever served it.

Times are seconds on one monotonic clock whose zero is the start of the run;
`run.json` stores the wall-clock time of that zero. Records are appended to
JSONL the moment a request ends, so a crash loses nothing already measured.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

OK = "ok"
ERROR = "error"

CONNECTION_REFUSED = "connection_refused"
"""Nothing listens at the server's address any more: it exited or was killed."""
CONNECTION_ERROR = "connection_error"
"""The server could not be reached for another reason (unresolvable, connect timeout)."""
CONNECTION_RESET = "connection_reset"
"""The connection ended mid-response: the server (or something between) dropped it."""
CLIENT_WORKER_DIED = "client_worker_died"
"""A client process exited before it reported the request (`bench --workers`)."""
DISTURBANCES = frozenset({CONNECTION_REFUSED, CONNECTION_ERROR, CONNECTION_RESET, CLIENT_WORKER_DIED})
"""Error kinds that say the measurement was disturbed (a process went away mid-run), not that the server
answered badly: a run with any of them does not describe the server under that load."""


def disturbances(errors_by_kind: Mapping[str, int]) -> dict[str, int]:
    """The part of a summary's `errors_by_kind` that disturbed the run; empty for an undisturbed one."""
    return {kind: n for kind, n in errors_by_kind.items() if kind in DISTURBANCES and n}


@dataclass(slots=True)
class RequestRecord:
    index: int
    intended_time: float
    """When the schedule wanted it sent; `send_time - intended_time` is client lag."""
    send_time: float
    finish_time: float
    first_token_time: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    """Arrival time of every streamed chunk that carried output."""
    prompt_tokens: int = 0
    output_tokens: int = 0
    status: str = OK
    error_kind: str | None = None
    """Short machine-readable cause: http_500, connection_reset, connection_refused, timeout, malformed_sse, ..."""
    error: str | None = None
    prefix_group: int | None = None
    priority: int = 0
    tokens_estimated: bool = False
    """The stream carried no usage: prompt_tokens is the plan's prompt length and output_tokens the number
    of chunks with output (a chunk may hold several tokens), not the server's own counts."""
    schedule_time: float | None = None
    """When the engine first scheduled it (known to the simulator only)."""
    preemptions: int = 0
    connection_reused: bool | None = None
    """HTTP: the request went out on a kept-alive connection (False: a new one; None: not HTTP, or no response)."""
    http_connect_s: float | None = None
    """HTTP: the handshake of the new connection it needed (None when one was reused)."""
    http_send_s: float | None = None
    """HTTP: from send_time (plus any connect) until its bytes were handed to the kernel."""
    http_wait_s: float | None = None
    """HTTP: from sent to the response's first byte: network both ways, the API server and, for a server that
    sends its headers with the first token, queueing and prefill."""
    http_receive_s: float | None = None
    """HTTP: from the first byte to the last: the stream."""
    base_url: str | None = None
    """The replica that served it, when the load was spread over several (`bench --base-url A --base-url B`)."""
    abandoned: bool = False
    """The client gave up on it mid-way, like a user closing the tab (`--abandon-after`): not an error."""

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.send_time

    @property
    def e2el(self) -> float:
        return self.finish_time - self.send_time

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RequestRecord:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


class RecordSink(Protocol):
    def write(self, record: RequestRecord) -> None: ...


class MemorySink:
    """Keeps records in memory; used by the simulator and by tests."""

    def __init__(self) -> None:
        self.records: list[RequestRecord] = []

    def write(self, record: RequestRecord) -> None:
        self.records.append(record)


class JsonlSink:
    """Appends each record as one line with one write(2) on an O_APPEND descriptor.

    One system call per record, not a buffered file object: a record with
    thousands of chunk times is longer than a buffer, and a buffered writer
    would split it over several writes, so a client killed between two of
    them (SIGKILL, OOM) would leave a torn last line. A single write to a
    regular file is not cut short by a signal, so the file always ends on a
    whole record.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[RequestRecord] = []
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def write(self, record: RequestRecord) -> None:
        self.records.append(record)
        line = (record.to_json() + "\n").encode()
        written = os.write(self._fd, line)
        if written != len(line):  # only a full disk does this; say so rather than leave half a record unexplained
            raise OSError(f"{self.path}: wrote {written} of {len(line)} bytes of record {record.index} (disk full?)")

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def read_records(path: Path) -> Iterator[RequestRecord]:
    """Every whole record; a last line without its newline (a file some other writer left torn) is skipped."""
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if not line.endswith("\n"):
                return
            if line.strip():
                yield RequestRecord.from_dict(json.loads(line))
