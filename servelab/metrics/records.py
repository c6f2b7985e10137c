"""Where `RequestRecord`s go: memory, or records.jsonl appended the moment each request ends, so a crash loses
nothing already measured. The record itself is servelab.schemas.records' (one line of records.jsonl)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Protocol

from servelab.schemas.records import RECORD, RequestRecord
from servelab.schemas.vocabulary import Disturbance, RequestStatus

__all__ = ["RequestRecord", "RecordSink", "MemorySink", "JsonlSink", "read_records", "disturbances"]

OK = RequestStatus.OK
ERROR = RequestStatus.ERROR
CONNECTION_REFUSED = Disturbance.CONNECTION_REFUSED
CONNECTION_ERROR = Disturbance.CONNECTION_ERROR
CONNECTION_RESET = Disturbance.CONNECTION_RESET
CLIENT_WORKER_DIED = Disturbance.CLIENT_WORKER_DIED
DISTURBANCES = frozenset(Disturbance)
"""Error kinds that say the measurement was disturbed, not that the server answered badly (Disturbance)."""


def disturbances(errors_by_kind: Mapping[str, int]) -> dict[str, int]:
    """The part of a summary's `errors_by_kind` that disturbed the run; empty for an undisturbed one."""
    return {kind: n for kind, n in errors_by_kind.items() if kind in DISTURBANCES and n}


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
                yield RECORD.validate_json(line)
