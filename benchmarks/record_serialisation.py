"""What one records.jsonl line costs to write and to read, by the ways servelab could do it.

RequestRecord stays a slotted dataclass (servelab/schemas/records.py) whose JSON Schema pydantic derives: this
measures why. Every target builds one record per request and sets a handful of attributes on it; the writer turns
each into one line as the request ends; readers (diagnose, report, calibrate --from) parse every line back.
A record with 200 chunk times (a 200-token streamed answer) is timed; best of 5 repeats.

    python benchmarks/record_serialisation.py
"""

from __future__ import annotations

import json
import timeit
from dataclasses import asdict

import pydantic

from servelab.schemas.records import RECORD, RequestRecord

CHUNKS = 200
FIELDS = tuple(RequestRecord.__dataclass_fields__)


class RecordModel(pydantic.BaseModel):
    """The alternative: the record as a pydantic model (the 23 fields, no validation beyond their types)."""

    index: int
    intended_time: float
    send_time: float
    finish_time: float
    first_token_time: float | None = None
    chunk_times: list[float] = []
    prompt_tokens: int = 0
    output_tokens: int = 0
    status: str = "ok"
    error_kind: str | None = None
    error: str | None = None
    prefix_group: int | None = None
    priority: int = 0
    tokens_estimated: bool = False
    schedule_time: float | None = None
    preemptions: int = 0
    connection_reused: bool | None = None
    http_connect_s: float | None = None
    http_send_s: float | None = None
    http_wait_s: float | None = None
    http_receive_s: float | None = None
    base_url: str | None = None
    abandoned: bool = False


def best_us(fn: object, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6  # type: ignore[arg-type]


def main() -> None:
    kwargs = dict(
        index=1,
        intended_time=0.1,
        send_time=0.1000012,
        finish_time=2.3,
        first_token_time=0.2,
        chunk_times=[0.2 + i * 0.0123456789 for i in range(CHUNKS)],
        prompt_tokens=1000,
        output_tokens=CHUNKS,
    )
    record, model = RequestRecord(**kwargs), RecordModel(**kwargs)  # type: ignore[arg-type]
    line = record.to_json()

    def set_dataclass() -> None:
        record.status = "ok"
        record.output_tokens += 1

    def set_model() -> None:
        model.status = "ok"
        model.output_tokens += 1

    rows = [
        ("build: slotted dataclass", best_us(lambda: RequestRecord(**kwargs), 20_000)),  # type: ignore[arg-type]
        ("build: pydantic model", best_us(lambda: RecordModel(**kwargs), 20_000)),
        ("two attribute sets: slotted dataclass", best_us(set_dataclass, 100_000)),
        ("two attribute sets: pydantic model", best_us(set_model, 100_000)),
        (
            "write: json.dumps(asdict(r)) (before)",
            best_us(lambda: json.dumps(asdict(record), separators=(",", ":")), 2_000),
        ),
        ("write: RequestRecord.to_json, json.dumps of its fields (now)", best_us(record.to_json, 2_000)),
        (
            "write: TypeAdapter.dump_json (not byte-identical: 1e-5 for 1e-05)",
            best_us(lambda: RECORD.dump_json(record), 2_000),
        ),
        (
            "read: json.loads + keyword construction (before)",
            best_us(lambda: RequestRecord(**{k: v for k, v in json.loads(line).items() if k in FIELDS}), 2_000),
        ),
        (
            "read: TypeAdapter.validate_json, checked against the schema (now)",
            best_us(lambda: RECORD.validate_json(line), 2_000),
        ),
    ]
    print(f"| one record with {CHUNKS} chunk times | µs |\n|---|---:|")
    for name, us in rows:
        print(f"| {name} | {us:.2f} |")


if __name__ == "__main__":
    main()
