"""A results directory: the on-disk form every verb writes and reads.

    run.json        what was run: flags, workload, server/engine info, versions
    records.jsonl   one RequestRecord per line, appended as requests end
    timeline.jsonl  one TimelineSample per line
    summary.json    derived from records.jsonl by `summarize`

A sweep is a directory whose `sweep.json` lists one sub-directory per point.

A directory without summary.json is a partial run: the client was killed
(SIGKILL, out of memory, a reboot) before it could finish. Its records are
still every request that ended before that, each a whole line, so readers
take it, derive what they need from the records, and say it is partial.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from servelab.atomic import write_text_atomic
from servelab import SCHEMA_VERSION
from servelab.errors import InputError
from servelab.metrics.records import JsonlSink, RequestRecord, read_records
from servelab.schemas.results import RunInfo, Summary, SweepIndex
from servelab.metrics.timeline import TimelineSample, read_timeline
from servelab.renames import upgraded

RUN = "run.json"
RECORDS = "records.jsonl"
TIMELINE = "timeline.jsonl"
SUMMARY = "summary.json"
SWEEP = "sweep.json"


def _dump(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


class ResultWriter:
    """Writes one run's directory incrementally; safe to abandon at any point."""

    def __init__(self, directory: Path, run_info: RunInfo) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        for stale in (RECORDS, TIMELINE, SUMMARY):
            (directory / stale).unlink(missing_ok=True)
        self.run_info = run_info.restarted()
        self._write_run_info()
        self.records = JsonlSink(directory / RECORDS)
        self._timeline = (directory / TIMELINE).open("a", encoding="utf-8")

    def write_sample(self, sample: TimelineSample) -> None:
        self._timeline.write(sample.to_json() + "\n")
        self._timeline.flush()

    def update_run_info(self, **info: Any) -> None:
        """run.json again with `info`'s keys set (the run's end, its server, an error): rewritten whole, atomically."""
        self.run_info = self.run_info.with_keys(**info)
        self._write_run_info()

    def _write_run_info(self) -> None:
        _dump(self.directory / RUN, self.run_info.model_dump(exclude_unset=True))

    def write_summary(self, summary: Summary) -> None:
        """summary.json: the summary's keys as given (a sweep's index holds the same without the version)."""
        stamped = summary.model_copy(update={"schema_version": SCHEMA_VERSION})
        _dump(self.directory / SUMMARY, stamped.model_dump(exclude_unset=True))

    def close(self) -> None:
        self.records.close()
        self._timeline.close()


@dataclass
class RunResult:
    """A results directory loaded back into memory."""

    directory: Path | None
    """None for a run held only in memory (a what-if simulation)."""
    run_info: RunInfo
    """run.json, typed: a reader reads its attributes (a misspelt one is an error, not a silent None)."""
    records: list[RequestRecord]
    timeline: list[TimelineSample] = field(default_factory=list)
    summary: dict[str, Any] | None = None

    @property
    def partial(self) -> bool:
        """The run never finished writing: no summary, so it ended before its end (see the module docstring)."""
        return self.directory is not None and self.summary is None

    def partial_note(self) -> str:
        """One sentence for readers to print, '' for a finished run."""
        if not self.partial:
            return ""
        ended = "" if self.run_info.finished_at is not None else ", no end time in run.json"
        return (
            f"partial run: {self.directory} has no {SUMMARY}{ended} (the client was killed before the end); "
            f"what follows rests on the {len(self.records)} requests recorded until then"
        )


class ResultsDirError(InputError, FileNotFoundError):
    """A directory that is not a readable servelab results directory (also a FileNotFoundError, as it always was)."""


def load_run(directory: Path) -> RunResult:
    """A results directory read back; ResultsDirError naming the directory when it is not one or cannot be read, and
    naming run.json and the field when run.json is not one RunInfo reads (an older schema is brought up first)."""
    if not (directory / RUN).is_file():
        raise ResultsDirError(f"{directory} is not a servelab results directory (no {RUN})")
    run_info = _read_run_info(directory / RUN)
    try:
        records = list(read_records(directory / RECORDS)) if (directory / RECORDS).exists() else []
        timeline = list(read_timeline(directory / TIMELINE)) if (directory / TIMELINE).exists() else []
        summary_path = directory / SUMMARY
        summary = (
            upgraded(json.loads(summary_path.read_text(encoding="utf-8")), SCHEMA_VERSION)
            if summary_path.exists()
            else None
        )
    except (OSError, ValueError, TypeError, KeyError) as exc:  # ValueError: bad JSON, or a record its schema refuses
        raise ResultsDirError(f"cannot read results directory {directory}: {exc}") from exc
    return RunResult(directory, run_info, records, timeline, summary)


def _read_run_info(path: Path) -> RunInfo:
    try:
        document = upgraded(json.loads(path.read_text(encoding="utf-8")), SCHEMA_VERSION)
    except (OSError, ValueError) as exc:  # ValueError: bad JSON
        raise ResultsDirError(f"cannot read {path}: {exc}") from exc
    try:
        return RunInfo.model_validate(document)
    except ValidationError as exc:
        first = exc.errors()[0]
        field_path = ".".join(str(part) for part in first["loc"]) or "(the whole document)"
        raise ResultsDirError(f"{path} is not one this servelab reads: {field_path}: {first['msg']}") from exc


def write_sweep_index(directory: Path, index: SweepIndex) -> None:
    """sweep.json: the index's keys as its producer set them, stamped with the schema version."""
    directory.mkdir(parents=True, exist_ok=True)
    stamped = index.model_copy(update={"schema_version": SCHEMA_VERSION})
    _dump(directory / SWEEP, stamped.model_dump(exclude_unset=True))
