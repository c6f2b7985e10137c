"""`RequestRecord`: what happened to one request, whatever served it.

Times are seconds on one monotonic clock whose zero is the start of the run;
`run.json` stores the wall-clock time of that zero. Records are appended to
JSONL the moment a request ends, so a crash loses nothing already measured.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Protocol

OK = "ok"
ERROR = "error"


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
    """Short machine-readable cause: http_500, connection_reset, timeout, malformed_sse, ..."""
    error: str | None = None
    prefix_group: int | None = None
    priority: int = 0
    schedule_time: float | None = None
    """When the engine first scheduled it (known to the simulator only)."""
    preemptions: int = 0

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
    def from_dict(cls, data: dict) -> RequestRecord:
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
    """Appends each record as one line and flushes, so a crash or Ctrl-C loses nothing."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[RequestRecord] = []
        self._fh: IO[str] = path.open("a", encoding="utf-8")

    def write(self, record: RequestRecord) -> None:
        self.records.append(record)
        self._fh.write(record.to_json() + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


def read_records(path: Path) -> Iterator[RequestRecord]:
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield RequestRecord.from_dict(json.loads(line))
