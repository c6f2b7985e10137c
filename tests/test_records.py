"""records.jsonl's line type: the slotted RequestRecord, its schema derived by pydantic (no restated model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servelab.metrics.records import JsonlSink, read_records
from servelab.metrics.results import RECORDS, RUN, ResultsDirError, load_run
from servelab.schemas.records import RECORD, RequestRecord
from servelab.schemas.vocabulary import RequestStatus


def full_record() -> RequestRecord:
    return RequestRecord(
        index=3,
        intended_time=0.5,
        send_time=0.50001,
        finish_time=1.25,
        first_token_time=0.6,
        chunk_times=[0.6, 0.7, 1.2e-05 + 1],
        prompt_tokens=100,
        output_tokens=3,
        status=RequestStatus.OK,
        prefix_group=1,
        priority=2,
        tokens_estimated=True,
        schedule_time=0.55,
        preemptions=1,
        connection_reused=False,
        http_connect_s=1.5e-05,
        http_send_s=2e-05,
        http_wait_s=0.1,
        http_receive_s=0.6,
        base_url="http://a:8000",
        abandoned=False,
    )


def test_a_record_written_and_read_back_is_the_same_record(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path / RECORDS)
    sink.write(full_record())
    sink.close()
    line = (tmp_path / RECORDS).read_text()
    assert line == full_record().to_json() + "\n" and '"status":"ok"' in line  # the enum is written as its word
    assert json.loads(line)["http_connect_s"] == 1.5e-05
    assert list(read_records(tmp_path / RECORDS)) == [full_record()]


def test_the_schema_is_the_dataclass_its_fields_and_their_descriptions() -> None:
    schema = RECORD.json_schema()
    assert list(schema["properties"]) == list(RequestRecord.__dataclass_fields__)
    assert schema["title"] == "RecordRow" and schema["additionalProperties"] is False
    assert schema["required"] == ["index", "intended_time", "send_time", "finish_time"]
    assert schema["properties"]["abandoned"]["description"].startswith("The client gave up on it")


def test_a_records_file_with_a_key_no_record_has_is_refused_naming_the_directory(tmp_path: Path) -> None:
    (tmp_path / RUN).write_text(
        json.dumps({"schema_version": 2, "started_at": 0.0, "versions": {"servelab": "0", "python": "3.11"}})
    )
    row = json.loads(full_record().to_json()) | {"latency_s": 0.7}
    (tmp_path / RECORDS).write_text(json.dumps(row) + "\n")
    with pytest.raises(ResultsDirError, match=str(tmp_path)):
        load_run(tmp_path)
